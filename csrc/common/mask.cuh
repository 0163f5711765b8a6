// The element rule of DESIGN.md (legalpt/attention/masks.py states it in full), for the tiles a schedule marks
// partial. Full tiles never call it; empty tiles are never visited.
//
// `row_mask` folds everything that depends only on the query row (its position, causal limit, window bounds,
// whether it is a global token) into a few integers once per row, so that testing a key is two or three
// comparisons (`allowed`), or under the plain rule one bit of the row's `seen_keys`.
#pragma once

#include <climits>
#include <cstdint>

#include "ptx.cuh"  // __device__ and the rest, also in the CPU emulation

namespace legalpt {

struct MaskParams {
  int causal;         // 1: key j visible only when j <= i + (lk - lq) (bottom-right aligned)
  int left, right;    // window around the query's key-coordinate position; -1 = unbounded
  int global_tokens;  // the first positions of each document see and are seen by everything (window bypassed)
  int dilation;       // inside the window only every dilation-th key counts
  const uint8_t* layout;  // bool (B|1, H|1, nq, nk) block layout, or nullptr
  int64_t layout_stride_b, layout_stride_h, layout_stride_q;  // 0 on broadcast dimensions; the key stride is 1
  int layout_bq, layout_bk;  // block size of the layout
};

// What one query row may see, before the block layout: keys j in [lo, hi] that pass the dilation test, and every
// key j < global_end. A row past the document sees nothing (hi < lo, global_end = 0).
struct RowMask {
  int lo, hi;          // the window, clipped to the document and the causal limit
  int global_end;      // global keys the row sees: min(global_tokens, causal limit + 1)
  int pos;             // the row's position on the key axis: i + (lk - lq)
  bool dilated;        // the window keeps only keys at a multiple of dilation from pos (false for global rows)
};

__device__ __forceinline__ RowMask row_mask(const MaskParams& m, int i, int lq, int lk) {
  const int pos = i + (lk - lq);
  const int last = i < lq ? (m.causal ? min(pos, lk - 1) : lk - 1) : -1;  // no key past this one
  const bool global_row = m.global_tokens > 0 && pos >= 0 && pos < m.global_tokens;
  RowMask r;
  r.pos = pos;
  r.lo = global_row || m.left < 0 ? 0 : max(pos - m.left, 0);
  r.hi = global_row || m.right < 0 ? last : min(pos + m.right, last);
  r.global_end = min(m.global_tokens, last + 1);
  r.dilated = m.dilation > 1 && !global_row;
  return r;
}

// Key j of row i against the row's mask; kGeneral adds the dilation test and the block layout.
template <bool kGeneral>
__device__ __forceinline__ bool allowed(const MaskParams& m, const RowMask& r, int i, int j, int b, int h) {
  bool in_window = j >= r.lo && j <= r.hi;
  if constexpr (kGeneral) in_window = in_window && (!r.dilated || (r.pos - j) % m.dilation == 0);
  bool ok = in_window || j < r.global_end;
  if constexpr (kGeneral) {
    ok = ok && (m.layout == nullptr || m.layout[b * m.layout_stride_b + h * m.layout_stride_h +
                                                (i / m.layout_bq) * m.layout_stride_q + j / m.layout_bk] != 0);
  }
  return ok;
}

// Bits n < 32 with a <= 8 n <= z: a thread's keys of a tile are 8 apart (the mma layouts' columns), from its first.
// The shifts are arithmetic: (a + 7) >> 3 and z >> 3 are ceil(a / 8) and floor(z / 8) for any sign.
__device__ __forceinline__ uint32_t strided_bits(int a, int z) {
  const int n0 = max((a + 7) >> 3, 0), n1 = min(z >> 3, 31);
  return n1 < n0 ? 0u : (0xffffffffu >> (31 - n1)) & (0xffffffffu << n0);
}

// The keys j + 8 n (n < 32) that row r sees under the plain rule (the window and the global keys; no dilation, no
// block layout), as bit n: per key a partial tile then tests one bit instead of `allowed`'s three comparisons.
__device__ __forceinline__ uint32_t seen_keys(const RowMask& r, int j) {
  return strided_bits(r.lo - j, r.hi - j) | strided_bits(-j, r.global_end - 1 - j);
}

// The queries at key-axis positions pos0 + 8 n (n < 32) that see key j under the plain rule, as bit n: the
// transposed tiles' test (the backward's S^T). Every condition of `row_mask` and `allowed` is an interval of the
// query's position pos: it sees key j when pos < lk (a row of the document), j < lk, pos >= j if causal, and j is a
// global key, or the query a global token (0 <= pos < global_tokens), or pos lies in the window
// [j - right, j + left] (-1: unbounded).
__device__ __forceinline__ uint32_t seen_queries(const MaskParams& m, int j, int pos0, int lk) {
  constexpr int kFar = 1 << 30;  // an unbounded end
  if (j >= lk) return 0u;
  const uint32_t rows = strided_bits(m.causal ? j - pos0 : -kFar, lk - 1 - pos0);
  if (j < m.global_tokens) return rows;
  const uint32_t global_rows = strided_bits(-pos0, m.global_tokens - 1 - pos0);
  const uint32_t window =
      strided_bits(m.right < 0 ? -kFar : j - m.right - pos0, m.left < 0 ? kFar : j + m.left - pos0);
  return rows & (global_rows | window);
}

}  // namespace legalpt
