// The kernels' arguments, one struct for both paths (sm80 and sm90): filled once by csrc/api.h from tensors that
// legalpt/attention/backends/cuda.py has checked.
#pragma once

#include <cstdint>

#include "mask.cuh"

namespace legalpt {

// A (B, S, H, D) batch or a packed (total, H, D) varlen batch; strides in elements, the last dimension contiguous.
struct Tensor4 {
  void* ptr;
  int64_t batch_stride, row_stride, head_stride;
};

// Which tiles a row tile visits (legalpt/attention/blocks.py): counts (Bs, Hs, rows, 2), indices (Bs, Hs, rows, cols).
struct Schedule {
  const int* counts;
  const int* indices;
  int64_t stride_b, stride_h;  // in row tiles; 0 when the schedule is shared along that dimension
  int cols;
  int rows;  // row tiles (query tiles; key tiles when transposed) it was built for: a launch checks its own
};

struct Params {
  Tensor4 q, k, v, o;        // o: forward output; in the backward it is dO
  float* lse;                // float32 logsumexp (natural log); (B, H, Sq) or (H, total_q)
  int64_t lse_batch_stride, lse_head_stride;
  const int* cu_seqlens_q;   // nullptr for a batch of equal rows
  const int* cu_seqlens_k;
  int seqlen_q, seqlen_k;    // row lengths of a batch; the maxima for varlen
  int heads, kv_group;       // query heads, query heads per key head
  float scale_log2;          // log2(e) * softmax_scale, or log2(e) with softcap (the cap applies the scale)
  float softcap;             // 0 = off; else scores become softcap * tanh(score * softmax_scale / softcap)
  float softcap_inv_scale;   // softmax_scale / softcap
  MaskParams mask;
  Schedule schedule;
  // backward only
  Tensor4 dq_accum;          // float32, like q
  Tensor4 dk, dv;            // like k, v
  const float* lse_log2;     // lse * log2(e), +inf where a row sees no key (P = 0 there, not NaN); like lse
  const float* delta;        // rowsum(dO * O) - dlse, laid out like lse
  float ds_scale;            // softmax_scale: d score / d (q . k) without softcap
  int deterministic;         // 1: dQ from dq_kernel (fixed order) instead of atomics in bwd_kernel
  // The first split_tiles key tiles of each document are each split over split_chunks blocks, which add their parts
  // of dK and dV into dkv_split (float32, dK then dV per row, zeroed by the caller). split_chunks = 1: no split.
  // With split_heads = 0 the tiles are the global keys' and a part is a share of every row of their schedule;
  // dkv_split is (documents, split_tiles * kBlockN, key heads, 2 * D). Else every key tile is split and a part is
  // split_heads query heads of the GQA group, whole rows; dkv_split is laid out like dK, 2 * D wide.
  int split_tiles, split_chunks, split_heads;
  Tensor4 dkv_split;
};

}  // namespace legalpt
