// What the kernels of both paths share about tiles: document bounds, the schedule's visits, row addressing, vector
// loads of elements and their conversion to float, and global -> shared tile copies (cp.async, the FA2 path's).
#pragma once

#include "params.h"
#include "ptx.cuh"

namespace legalpt {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Where document (or batch row) b lies on the packed query and key axes, and its lengths.
struct Document {
  int q_start, k_start, lq, lk;
};

__device__ __forceinline__ Document document(const Params& p, int b) {
  if (p.cu_seqlens_q == nullptr) return {0, 0, p.seqlen_q, p.seqlen_k};
  const int q0 = p.cu_seqlens_q[b], k0 = p.cu_seqlens_k[b];
  return {q0, k0, p.cu_seqlens_q[b + 1] - q0, p.cu_seqlens_k[b + 1] - k0};
}

__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

template <typename T, int N>
struct alignas(N * sizeof(T)) Chunk {  // N elements read as one load
  T x[N];
};

// Row `row` of document b (starting at `start` on the packed axis), head h.
template <typename T>
__device__ __forceinline__ T* row_ptr(const Tensor4& t, int b, int start, int row, int h) {
  return static_cast<T*>(t.ptr) + b * t.batch_stride + static_cast<int64_t>(start + row) * t.row_stride +
         h * t.head_stride;
}

// Copy ROWS x D elements (global row stride `stride`) into a shared tile with rows of D + 8 elements (the padding
// puts the 8 rows an ldmatrix reads in 8 different bank groups). Rows at or past `valid` are zero-filled: a zero
// key row gives a finite score that the mask removes, a zero value row adds nothing.
//
// Each thread copies one 16-byte column chunk of every THREADS / (D / 8)-th row, walking a single pointer down the
// rows: the kernels call this inside their key loop, and per-row addresses kept live across that loop would cost
// dozens of registers (measured: 70 of 255 in the forward at D = 128).
template <typename T, int ROWS, int D, int THREADS>
__device__ __forceinline__ void load_tile(T* dst, const T* src, int64_t stride, int valid) {
  constexpr int kChunks = D / 8;  // 16-byte pieces per row
  if constexpr (THREADS % kChunks == 0 && ROWS % (THREADS / kChunks) == 0) {
    constexpr int kRowsPerPass = THREADS / kChunks;
    const int r = threadIdx.x / kChunks, col = (threadIdx.x % kChunks) * 8;
    const T* from = src + r * stride + col;
    T* to = dst + r * (D + 8) + col;
#pragma unroll
    for (int it = 0; it < ROWS / kRowsPerPass; ++it) {
      cp_async16(to + it * kRowsPerPass * (D + 8), from, r + it * kRowsPerPass < valid);
      from += kRowsPerPass * stride;
    }
  } else {
#pragma unroll
    for (int it = 0; it < (ROWS * kChunks + THREADS - 1) / THREADS; ++it) {
      const int c = it * THREADS + threadIdx.x;
      if (ROWS * kChunks % THREADS != 0 && c >= ROWS * kChunks) break;
      const int r = c / kChunks, col = (c % kChunks) * 8;
      cp_async16(dst + r * (D + 8) + col, src + r * stride + col, r < valid);
    }
  }
}

// The schedule row of row tile `tile` of document b, head h: number of tiles to visit, how many of them partial.
struct Visits {
  int count, partial;
  const int* tiles;
};

__device__ __forceinline__ Visits visits(const Schedule& s, int b, int h, int tile) {
  const int64_t row = b * s.stride_b + h * s.stride_h + tile;
  return {s.counts[2 * row], s.counts[2 * row + 1], s.indices + row * s.cols};
}

// tanh to about float32 accuracy. The build's --use_fast_math turns tanhf into tanh.approx, whose ~1e-3 relative
// error, times a softcap of 30, is far above what the logsumexp may be off by. |x| <= 15 keeps exp finite.
__device__ __forceinline__ float tanh_accurate(float x) {
  const float e = __expf(2.f * fminf(fmaxf(x, -15.f), 15.f));
  return 1.f - 2.f / (e + 1.f);
}

}  // namespace legalpt
