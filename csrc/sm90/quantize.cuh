// The FP8 forward's quantization, fused (legalpt/attention/fp8.py: `quantize` and `kernel_v` define it, and
// `kernel_quantize` calls these): Q and K in bf16 or fp16 at head dim 128 to e4m3 with one scale per (batch, head,
// block of 128 rows), after the incoherent rotation if asked; V to the e4m3 V^T the FP8 forward reads, with the
// one scale per batch row and key head, from a first pass over V that reduces its amax (quantize_qk without output).
// The kernels read each input element once (V once more, for its scales) and write each output byte once, where
// the PyTorch path makes float32 copies and multiplies by M: it cost as much as the FP8 kernel itself.
#pragma once

#include "../common/tile.cuh"

namespace legalpt::fa3 {

constexpr int kQuantD = 128;        // the FP8 forward's head dim: 32 lanes x 4 columns
constexpr int kQuantRows = 128;     // rows per scale, and keys per V^T tile: the FP8 forward's tiles
constexpr int kQuantThreads = 256;  // 8 warps
constexpr int kQuantWarps = kQuantThreads / 32;
constexpr int kQuantSmem = kQuantWarps * sizeof(uint32_t);  // quantize_qk's warp maxima
constexpr float kE4m3Max = 448.f;
constexpr float kMinScale = 0x1p-40f;  // fp8.MIN_SCALE

// quantize_qk's: x (B, S, H, 128), its last dimension contiguous and its rows 16-byte aligned.
struct QuantizeArgs {
  Tensor4 x;
  uint8_t* out;           // (B, S, H, 128) e4m3, contiguous; nullptr: V's pass, which writes amax alone
  float* scale;           // (B, H, blocks), contiguous; V's pass: unused
  uint32_t* amax;         // V's pass: (B, H), zeros before it, then the bits of max |x| over S (floats >= 0 and
                          // NaN order as their bits); nullptr otherwise
  const float* factors;   // (128,): M's first row (incoherence_matrix(128, seed)[0]); nullptr: no rotation
  int seqlen, heads, blocks;
};

// quantize_vt's: v (B, Sk, Hk, 128) as quantize_qk's x.
struct TransposeArgs {
  Tensor4 v;
  const uint32_t* amax;  // (B, Hk), contiguous: V's amax bits (QuantizeArgs::amax)
  float* scale;          // (B, Hk), contiguous: V's scales, written by each (batch row, head)'s first key tile
  uint8_t* vt;           // (B, 128, Hk, keys) e4m3, contiguous; keys: Sk padded to whole tiles
  int seqlen, heads, keys;
};

// One call's work, in order: Q and K (their own grids), V's amax, V^T.
struct Fp8Quantize {
  QuantizeArgs q, k, v_amax;
  TransposeArgs v;
  int batch;
};

// The scale that maps a block's amax (the bits of |x|: integers compare as the floats do, NaN above every number,
// and no flush of subnormals) to 448, as fp8.py's _scales: 1 where amax is 0 or NaN (amax > 0 fails there), at
// least kMinScale. A product by 1/448 rounded to float32, as _scales computes it on every device.
__device__ __forceinline__ float block_scale(uint32_t amax) {
  if (amax == 0 || amax > 0x7F800000u) return 1.f;
  return fmaxf(__uint_as_float(amax) * (1.f / kE4m3Max), kMinScale);
}

__device__ __forceinline__ uint32_t abs_bits(float x) { return __float_as_uint(x) & 0x7FFFFFFFu; }

// The largest of the block's threads' amax: over the warp by shuffles, then over the warps' in shared memory.
__device__ __forceinline__ uint32_t block_amax(uint32_t amax, uint32_t* warp_amax) {
#pragma unroll
  for (int bit = 16; bit > 0; bit /= 2) amax = max(amax, __shfl_xor_sync(0xffffffffu, amax, bit));
  if (threadIdx.x % 32 == 0) warp_amax[threadIdx.x / 32] = amax;
  __syncthreads();
#pragma unroll
  for (int w = 0; w < kQuantWarps; ++w) amax = max(amax, warp_amax[w]);
  return amax;
}

__device__ __forceinline__ void butterfly(float& low, float& high) {
  const float a = low, b = high;
  low = a + b;
  high = a - b;
}

// Each row times M = H diag(signs) / sqrt(128): a fast Walsh-Hadamard transform gives x H for Sylvester's H (pairs
// of columns (i, i | bit): low <- a + b, high <- a - b), over column bits 0 and 1 within a lane and bits 2..6 across
// lanes; then column j times M[0, j], the very float32 entries of fp8.incoherence_matrix (H's first row is ones).
template <int kRows>
__device__ __forceinline__ void rotate(float (&x)[kRows][4], const float* factors) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    butterfly(x[r][0], x[r][1]);
    butterfly(x[r][2], x[r][3]);
    butterfly(x[r][0], x[r][2]);
    butterfly(x[r][1], x[r][3]);
  }
#pragma unroll
  for (int bit = 1; bit < 32; bit *= 2) {
    const float sign = lane & bit ? -1.f : 1.f;  // the high column's lane keeps other - x: one fma, as exact
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int c = 0; c < 4; ++c) x[r][c] = fmaf(sign, x[r][c], __shfl_xor_sync(0xffffffffu, x[r][c], bit));
  }
  const Chunk<float, 4> f = *reinterpret_cast<const Chunk<float, 4>*>(factors + 4 * lane);
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int c = 0; c < 4; ++c) x[r][c] *= f.x[c];
}

// Division by a block's scale, rounded to nearest as the reference's x / scale. A block's scale is 1 when it holds a
// NaN (or only zeros) and infinite when it holds an infinity; then the quotient is x * 1 or x * 0, exact. Otherwise
// every x is finite, and on the device the quotient is __fdiv_rn's own fast path (the reciprocal by rcp.approx and a
// Newton step, the quotient from it with one correction), with the reciprocal computed once per block rather than per
// quotient and without __fdiv_rn's per-quotient check for its slow path (ptxas: 12 instructions and a branch a
// quotient, against 5). What that path serves is settled otherwise here: quotients lie in [0, 448] (those below
// e4m3's 2^-10 round to zero whatever their last bits), and a zero or (flushed) subnormal x takes x * inv, a zero of
// x's sign, which the correction would turn positive.
struct ScaleDivider {
  float scale, inv;  // inv: 1 / scale, exactly 1 or 0 for an exact block
  bool exact;        // a scale of 1 or infinity: x * inv is the quotient (and the correction would make inf - inf)
  __device__ __forceinline__ explicit ScaleDivider(float s) : scale(s), inv(s == 1.f ? 1.f : 0.f) {
    exact = s == 1.f || (__float_as_uint(s) & 0x7FFFFFFFu) == 0x7F800000u;
    if (exact) return;
#ifdef LEGALPT_EMULATE
    inv = 1.f / s;
#else
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(s));
    inv = __fmaf_rn(r, __fmaf_rn(r, -s, 1.f), r);
#endif
  }
  __device__ __forceinline__ float operator()(float x) const {
    const float q0 = __fmul_rn(x, inv);
#ifdef LEGALPT_EMULATE  // the CPU divides as the reference does
    const float q = x / scale;
#else
    const float q = __fmaf_rn(inv, __fmaf_rn(q0, -scale, x), q0);
#endif
    return exact || x == 0.f ? q0 : q;
  }
};

// Four values / scale in e4m3: cvt's round to nearest, saturated to +-448 as the reference's clamp.
__device__ __forceinline__ uint32_t to_e4m3(const float (&x)[4], const ScaleDivider& divide) {
  return pack4_e4m3(divide(x[0]), divide(x[1]), divide(x[2]), divide(x[3]));
}

// Block (batch row x blocks + row block, head): 128 rows of one head (the batch on grid.x, which holds 2^31 - 1
// blocks where grid.z holds 65535). Warp w takes rows w, w + 8, ..., lane l columns 4l .. 4l + 3 of each (8-byte
// loads, 4-byte stores: a warp's cover a row, whole lines), from one address a step apart. Rows past S are neither
// read nor written and count as 0, as the reference's zero padding.
template <typename T>
__global__ void __launch_bounds__(kQuantThreads) quantize_qk(const __grid_constant__ QuantizeArgs a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || defined(LEGALPT_EMULATE)  // cvt to e4m3: sm_89+, built with the FP8 path
  constexpr int kRows = kQuantRows / kQuantWarps;  // 16 a warp
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int blk = blockIdx.x % a.blocks, b = blockIdx.x / a.blocks, h = blockIdx.y;
  const int lane = threadIdx.x % 32, first = blk * kQuantRows + threadIdx.x / 32;
  const int valid = a.seqlen - first;  // row r of this warp is in the sequence when r * kQuantWarps < valid
  const T* src = row_ptr<const T>(a.x, b, 0, first, h) + 4 * lane;
  Chunk<T, 4> raw[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r)  // every load issued before any is used
    if (r * kQuantWarps < valid)
      raw[r] = *reinterpret_cast<const Chunk<T, 4>*>(src + r * kQuantWarps * a.x.row_stride);
  float x[kRows][4];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int c = 0; c < 4; ++c) x[r][c] = r * kQuantWarps < valid ? to_float(raw[r].x[c]) : 0.f;
  if (a.factors != nullptr) rotate(x, a.factors);
  uint32_t amax = 0;
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int c = 0; c < 4; ++c) amax = max(amax, abs_bits(x[r][c]));
  amax = block_amax(amax, reinterpret_cast<uint32_t*>(smem_raw));
  if (a.out == nullptr) {  // V's pass: the amax of every block of the (batch row, head), for quantize_vt's scale
    if (threadIdx.x == 0) atomicMax(a.amax + static_cast<int64_t>(b) * a.heads + h, amax);
    return;
  }
  const float scale = block_scale(amax);
  if (threadIdx.x == 0) a.scale[(static_cast<int64_t>(b) * a.heads + h) * a.blocks + blk] = scale;
  const ScaleDivider divide(scale);
  uint8_t* dst = a.out + ((static_cast<int64_t>(b) * a.seqlen + first) * a.heads + h) * kQuantD + 4 * lane;
#pragma unroll
  for (int r = 0; r < kRows; ++r)
    if (r * kQuantWarps < valid)
      *reinterpret_cast<uint32_t*>(dst + static_cast<int64_t>(r * kQuantWarps) * a.heads * kQuantD) =
          to_e4m3(x[r], divide);
#elif defined(__CUDA_ARCH__)
  __trap();  // another target's code: kernel_quantize never launches it there, and it must not pass silently
#endif
}

// Block (batch row x tiles + key tile, key head): V^T's 128 rows (d) x 128 keys of the tile, in the FP8 forward's
// key order: the 4-byte group q of each 16 keys holds keys {2q, 2q + 1, 2q + 8, 2q + 9} of them, as P's e4m3
// fragments do (to_fragments_e4m3 in wgmma.cuh, fp8._KEY_ORDER). Lane 4g + q takes those four keys of the tile's
// g-th 16, warp w the d in [16w, 16w + 16): 32 bytes of each key row (two 16-byte loads, one whole sector), then a
// 4 x 4 transpose in registers per 4 d, one 4-byte word per V^T row (a warp's are 128 bytes in a row). Keys past
// Sk are zeros: the padding.
template <typename T>
__global__ void __launch_bounds__(kQuantThreads) quantize_vt(const __grid_constant__ TransposeArgs a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || defined(LEGALPT_EMULATE)
  constexpr int kD = kQuantD / kQuantWarps;  // 16 a warp
  const int tiles = a.keys / kQuantRows, tile = blockIdx.x % tiles, b = blockIdx.x / tiles, h = blockIdx.y;
  const int lane = threadIdx.x % 32, d0 = threadIdx.x / 32 * kD;
  const int first = tile * kQuantRows + lane / 4 * 16 + 2 * (lane % 4);
  Chunk<T, 8> raw[4][kD / 8];  // (key, half of the 16 d)
  bool valid[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int key = first + i % 2 + 8 * (i / 2);
    valid[i] = key < a.seqlen;
    const T* src = row_ptr<const T>(a.v, b, 0, key, h) + d0;
#pragma unroll
    for (int j = 0; j < kD / 8; ++j)
      if (valid[i]) raw[i][j] = *reinterpret_cast<const Chunk<T, 8>*>(src + 8 * j);
  }
  const float scale = block_scale(a.amax[static_cast<int64_t>(b) * a.heads + h]);
  if (tile == 0 && threadIdx.x == 0) a.scale[static_cast<int64_t>(b) * a.heads + h] = scale;
  const ScaleDivider divide(scale);
  uint8_t* dst = a.vt + ((static_cast<int64_t>(b) * kQuantD + d0) * a.heads + h) * a.keys + tile * kQuantRows;
#pragma unroll
  for (int d = 0; d < kD; ++d) {
    float k[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) k[i] = valid[i] ? to_float(raw[i][d / 8].x[d % 8]) : 0.f;
    *reinterpret_cast<uint32_t*>(dst + d * static_cast<int64_t>(a.heads) * a.keys + 4 * lane) =
        to_e4m3(k, divide);
  }
#elif defined(__CUDA_ARCH__)
  __trap();  // another target's code: kernel_quantize never launches it there, and it must not pass silently
#endif
}

}  // namespace legalpt::fa3
