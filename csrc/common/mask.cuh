// The element rule of DESIGN.md (legalpt/attention/masks.py states it in full), for the tiles a schedule marks
// partial. Full tiles never call it; empty tiles are never visited.
#pragma once

#include <cstdint>

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

// May query i see key j of the same document (document lengths lq, lk; b = document, h = query head)?
__device__ __forceinline__ bool visible(const MaskParams& m, int i, int j, int lq, int lk, int b, int h) {
  if (i >= lq || j >= lk) return false;
  const int ip = i + (lk - lq);
  const int dist = ip - j;
  bool ok = true;
  if (m.left >= 0) ok = ok && dist <= m.left;
  if (m.right >= 0) ok = ok && dist >= -m.right;
  if (m.dilation > 1) ok = ok && dist % m.dilation == 0;
  if (m.global_tokens > 0) ok = ok || (ip >= 0 && ip < m.global_tokens) || j < m.global_tokens;
  if (m.causal) ok = ok && dist >= 0;
  if (m.layout != nullptr && ok) {
    ok = m.layout[b * m.layout_stride_b + h * m.layout_stride_h + (i / m.layout_bq) * m.layout_stride_q +
                  j / m.layout_bk] != 0;
  }
  return ok;
}

}  // namespace legalpt
