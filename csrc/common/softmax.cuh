// The forward's score path, shared by both paths' forward kernels (and the FA2 path's deterministic dQ pass):
// scores to log2-domain logits (scale or softcap), the element rule on partial tiles, the online softmax's row max
// and exp2, and the epilogue (the logsumexp and O, normalized). Fragments in the mma/wgmma accumulator layout:
// a thread holds two half-rows of an m16 row tile.
#pragma once

#include "mask.cuh"
#include "tile.cuh"

namespace legalpt {

// The element rule on a partial tile: scores the mask removes become -inf. Layout of s as in `logits`.
template <bool kGeneral, int R, int BN>
__device__ __forceinline__ void mask_tile(const Params& p, float (&s)[R][BN / 8][4], int i0, int j0,
                                          const Document& doc, int b, int h) {
  static_assert(BN / 8 <= 32, "a thread's keys of a tile fit seen_keys' 32 bits");
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int i = i0 + 16 * r + 8 * half;
      const RowMask rm = row_mask(p.mask, i, doc.lq, doc.lk);
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const uint32_t seen = kGeneral ? 0u : seen_keys(rm, j0 + c);  // the plain rule: one bit per key
#pragma unroll
        for (int n = 0; n < BN / 8; ++n) {
          const bool ok = kGeneral ? allowed<kGeneral>(p.mask, rm, i, j0 + 8 * n + c, b, h) : (seen >> n & 1u) != 0;
          if (!ok) s[r][n][2 * half + c] = -INFINITY;
        }
      }
    }
}

// What takes the scores to the log2 domain in the max and in the exp2's FFMA. The plain kernel keeps them raw and
// folds their scale into the FFMA, which needs a scale > 0 (a negative one would turn the max into a min; the host
// sends scales <= 0 to the general kernel). The general one makes them log2-domain logits first, in `logits`: a
// raw-score path there as well made it spill 76 bytes instead of 20 at d128.
template <bool kGeneral>
__device__ __forceinline__ float to_log2(const Params& p) {
  return kGeneral ? 1.f : p.scale_log2;
}

// Scores to what the softmax takes, in place: the general kernel's to log2-domain logits (scale, or softcap), the
// plain kernel's left raw (`to_log2`); then the element rule on a partial tile.
// s: (R row tiles, BN / 8, 4) accumulators of rows i0 + 16 r + 8 (c / 2), keys j0 + 8 n + (c % 2).
template <bool kGeneral, int R, int BN>
__device__ __forceinline__ void logits(const Params& p, float (&s)[R][BN / 8][4], bool partial, int i0, int j0,
                                       const Document& doc, int b, int h) {
  if (kGeneral && p.softcap > 0.f) {
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int n = 0; n < BN / 8; ++n)
#pragma unroll
        for (int c = 0; c < 4; ++c) s[r][n][c] = p.softcap * kLog2e * tanh_accurate(s[r][n][c] * p.softcap_inv_scale);
  } else if (kGeneral) {
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int n = 0; n < BN / 8; ++n)
#pragma unroll
        for (int c = 0; c < 4; ++c) s[r][n][c] *= p.scale_log2;
  }
  if (partial) mask_tile<kGeneral, R, BN>(p, s, i0, j0, doc, b, h);
}

// v[0] = op over v[0..N) for N a power of two, as a tree: log2(N) dependent steps instead of N - 1, since a warp's
// softmax is a few long dependency chains with little else to hide them (the fa3 forward at d64, ncu: 5.3 cycles
// per instruction). A step of width W folds v[W..2W) into v[0..W); recursion, not a loop, so that every index is a
// constant and v stays in registers (nvcc left an inner loop over a varying width rolled, v in local memory).
template <int W, int N, typename Op>
__device__ __forceinline__ float tree_reduce(float (&v)[N], Op op) {
  static_assert(2 * W <= N, "a step folds v[W..2W)");
  if constexpr (W == 0) {
    return v[0];
  } else {
#pragma unroll
    for (int n = 0; n < W; ++n) v[n] = op(v[n], v[n + W]);
    return tree_reduce<W / 2>(v, op);
  }
}

// The log2-domain max over a tile of half-row `half` of a thread's m16 row tile (row lane / 4 + 8 half; scores
// times `scale` > 0 are its logits), across its quad.
template <int BN>
__device__ __forceinline__ float tile_row_max(const float (&s)[BN / 8][4], int half, float scale) {
  float m[BN / 8];
#pragma unroll
  for (int n = 0; n < BN / 8; ++n) m[n] = fmaxf(s[n][2 * half], s[n][2 * half + 1]);
  const float mine = tree_reduce<BN / 16>(m, [](float x, float y) { return fmaxf(x, y); });
  return quad_max(mine) * scale;  // -inf stays -inf: scale > 0
}
// The same of scores as `logits` leaves them.
template <bool kGeneral, int BN>
__device__ __forceinline__ float tile_row_max(const Params& p, const float (&s)[BN / 8][4], int half) {
  return tile_row_max<BN>(s, half, to_log2<kGeneral>(p));
}

// P = exp2(logit - m) in place for that half-row (logits: scores times `scale`), m its running max (or, in the
// FP8 forward, that max less a shift); returns this thread's part of P's row sum.
template <int BN>
__device__ __forceinline__ float exp_row(float (&s)[BN / 8][4], int half, float m, float scale) {
  const float m_safe = m == -INFINITY ? 0.f : m;  // a row that has seen nothing yet keeps p = exp2(-inf) = 0
  float sum[BN / 8];
#pragma unroll
  for (int n = 0; n < BN / 8; ++n) {
    s[n][2 * half] = exp2f(fmaf(s[n][2 * half], scale, -m_safe));
    s[n][2 * half + 1] = exp2f(fmaf(s[n][2 * half + 1], scale, -m_safe));
    sum[n] = s[n][2 * half] + s[n][2 * half + 1];
  }
  return tree_reduce<BN / 16>(sum, [](float x, float y) { return x + y; });
}
// The same of scores as `logits` leaves them.
template <bool kGeneral, int BN>
__device__ __forceinline__ float exp_row(const Params& p, float (&s)[BN / 8][4], int half, float m) {
  return exp_row<BN>(s, half, m, to_log2<kGeneral>(p));
}

// The normalization of a thread's two rows of an m16 row tile (i0 and i0 + 8 within the document): 1 / their sums,
// 0 for a row that sees no key (output 0). Writes their logsumexp. row_max, row_sum: as the forward kernels keep
// them (row_sum: this thread's part).
__device__ __forceinline__ float2 finish_rows(const Params& p, const float (&row_max)[2], const float (&row_sum)[2],
                                              int i0, const Document& doc, int b, int h) {
  const int lane = threadIdx.x % 32;
  float inv[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const float l = quad_sum(row_sum[half]);
    inv[half] = l > 0.f ? 1.f / l : 0.f;
    const int i = i0 + 8 * half;
    if (i < doc.lq && lane % 4 == 0)
      p.lse[b * p.lse_batch_stride + h * p.lse_head_stride + doc.q_start + i] =
          l > 0.f ? (row_max[half] + log2f(l)) * kLn2 : -INFINITY;
  }
  return make_float2(inv[0], inv[1]);
}

// The same rows of O, times `inv` (finish_rows), to p.o.
template <typename T, int D>
__device__ __forceinline__ void store_rows(const Params& p, const float (&o)[D / 8][4], float2 inv, int i0,
                                           const Document& doc, int b, int h) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int i = i0 + 8 * half;
    if (i >= doc.lq) continue;
    const float scale = half == 0 ? inv.x : inv.y;
    T* out = row_ptr<T>(p.o, b, doc.q_start, i, h) + 2 * (lane % 4);
#pragma unroll
    for (int d = 0; d < D / 8; ++d)
      *reinterpret_cast<uint32_t*>(out + 8 * d) = pack2<T>(o[d][2 * half] * scale, o[d][2 * half + 1] * scale);
  }
}

// FA2's epilogue of a thread's two rows: their logsumexp and O.
template <typename T, int D>
__device__ __forceinline__ void write_rows(const Params& p, const float (&o)[D / 8][4], const float (&row_max)[2],
                                           const float (&row_sum)[2], int i0, const Document& doc, int b, int h) {
  store_rows<T, D>(p, o, finish_rows(p, row_max, row_sum, i0, doc, b, h), i0, doc, b, h);
}

}  // namespace legalpt
