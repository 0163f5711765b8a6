// Thin wrappers over the PTX instructions the FA2 path is built from: cp.async (global -> shared without
// registers), ldmatrix (shared -> mma fragments) and mma.sync m16n8k16 with float32 accumulators (sm80+). With
// LEGALPT_EMULATE the same functions run on the CPU, lane by lane (emulate.h).
#pragma once

#include <cstdint>

#ifdef LEGALPT_EMULATE
#include "emulate.h"
#else
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

namespace legalpt {

// FP8 e4m3 (4 exponent bits, 3 mantissa bits, no infinities, largest finite 448): the element type of the FP8
// forward's Q, K and V; only its size and identity matter to the kernels, which convert by PTX.
struct e4m3 {
  uint8_t bits;
};

#ifndef LEGALPT_EMULATE
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared; when !valid the destination is zero-filled and the source is not read.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes));
}
// 4 bytes global -> shared (through L1: these are small, scattered reads); zero-filled when !valid.
__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool valid) {
  const int src_bytes = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// Four 8x8 b16 matrices; lane l gives the row address of matrix l / 8, row l % 8.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// c += a (16x16, row-major fragment) * b (16x8, column-major fragment), float32 accumulators.
template <typename T>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);

template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                                          uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void mma_16816<__half>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats -> one register of two 16-bit values (the first in the low half), round to nearest.
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// Four floats -> one register of four e4m3 bytes (the first in the low byte), round to nearest, saturated to
// +-448 (the FP8 forward's P).
__device__ __forceinline__ uint32_t pack4_e4m3(float x0, float x1, float x2, float x3) {
  uint16_t lo, hi;  // cvt puts its first source in the upper byte
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(lo) : "f"(x1), "f"(x0));
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(hi) : "f"(x3), "f"(x2));
  return lo | static_cast<uint32_t>(hi) << 16;
}

// Two adjacent float32 atomic adds (8-byte aligned): one vector reduction on sm90, two scalar ones before.
__device__ __forceinline__ void atomic_add2(float* dst, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2*>(dst), make_float2(a, b));
#else
  atomicAdd(dst, a);
  atomicAdd(dst + 1, b);
#endif
}

#else  // LEGALPT_EMULATE: the same instructions on the CPU (csrc/common/emulate.h)
inline void cp_async16(void* dst, const void* src, bool valid) { emu::async_copy(dst, valid ? src : nullptr, 16); }
inline void cp_async4(void* dst, const void* src, bool valid) { emu::async_copy(dst, valid ? src : nullptr, 4); }
inline void cp_async_commit() { emu::async_commit(); }
template <int N>
inline void cp_async_wait() {
  emu::async_wait(N);
}

// Matrix m's row r comes from the address lane 8 m + r gave; lane l receives row l / 4, columns 2 (l % 4) and
// 2 (l % 4) + 1 (with .trans: the transposed matrix's).
template <bool kTrans>
inline void ldmatrix_x4_emulated(uint32_t (&r)[4], const void* p) {
  emu::WarpScratch& s = emu::warp_scratch();
  const int l = emu::lane();
  s.address[l] = p;
  emu::warp_sync();
  for (int m = 0; m < 4; ++m) {
    uint16_t lo, hi;
    if (kTrans) {
      lo = static_cast<const uint16_t*>(s.address[8 * m + 2 * (l % 4)])[l / 4];
      hi = static_cast<const uint16_t*>(s.address[8 * m + 2 * (l % 4) + 1])[l / 4];
    } else {
      lo = static_cast<const uint16_t*>(s.address[8 * m + l / 4])[2 * (l % 4)];
      hi = static_cast<const uint16_t*>(s.address[8 * m + l / 4])[2 * (l % 4) + 1];
    }
    r[m] = lo | static_cast<uint32_t>(hi) << 16;
  }
  emu::warp_sync();
}
inline void ldmatrix_x4(uint32_t (&r)[4], const void* p) { ldmatrix_x4_emulated<false>(r, p); }
inline void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) { ldmatrix_x4_emulated<true>(r, p); }

template <typename T>
inline float to_float_bits(uint16_t bits) {
  if constexpr (std::is_same_v<T, __half>) {
    return __half2float(__half{bits});
  } else {
    return __bfloat162float(__nv_bfloat16{bits});
  }
}

// The fragment layout of mma.m16n8k16 (g = lane / 4, q = lane % 4): A regs {(g, 2q), (g + 8, 2q), (g, 2q + 8),
// (g + 8, 2q + 8)}, B regs {(2q, g), (2q + 8, g)}, C {(g, 2q), (g, 2q + 1), (g + 8, 2q), (g + 8, 2q + 1)}; each
// 16-bit register pair holds two adjacent k.
template <typename T>
inline void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  emu::WarpScratch& s = emu::warp_scratch();
  const int l = emu::lane();
  for (int i = 0; i < 4; ++i) s.regs[l][i] = a[i];
  s.regs[l][4] = b0;
  s.regs[l][5] = b1;
  emu::warp_sync();
  auto element = [&](int owner, int reg, int k) {
    return to_float_bits<T>(static_cast<uint16_t>(s.regs[owner][reg] >> (16 * (k % 2))));
  };
  for (int i = 0; i < 4; ++i) {
    const int row = l / 4 + 8 * (i / 2), col = 2 * (l % 4) + i % 2;
    float sum = c[i];
    for (int k = 0; k < 16; ++k) {
      const float x = element((row % 8) * 4 + (k % 8) / 2, (row / 8) + 2 * (k / 8), k);
      const float y = element(col * 4 + (k % 8) / 2, 4 + k / 8, k);
      sum = std::fma(x, y, sum);
    }
    c[i] = sum;
  }
  emu::warp_sync();
}

template <typename T>
inline uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, __half>) {
    return half_bits_rn(lo) | static_cast<uint32_t>(half_bits_rn(hi)) << 16;
  } else {
    return bf16_bits_rn(lo) | static_cast<uint32_t>(bf16_bits_rn(hi)) << 16;
  }
}

inline uint32_t pack4_e4m3(float x0, float x1, float x2, float x3) {
  return e4m3_bits_rn(x0) | e4m3_bits_rn(x1) << 8 | e4m3_bits_rn(x2) << 16 | static_cast<uint32_t>(e4m3_bits_rn(x3)) << 24;
}

inline void atomic_add2(float* dst, float a, float b) {  // fibers never interleave inside it
  dst[0] += a;
  dst[1] += b;
}
#endif

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffff, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffff, x, 1);
  return x + __shfl_xor_sync(0xffffffff, x, 2);
}

// c0, c1 += a (16x16) * the two 16x8 halves of an ldmatrix_x4 B fragment (b[0], b[1] and b[2], b[3]): a 16x16 tile
// of the product.
template <typename T>
__device__ __forceinline__ void mma_16x16(float (&c0)[4], float (&c1)[4], const uint32_t (&a)[4],
                                          const uint32_t (&b)[4]) {
  mma_16816<T>(c0, a, b[0], b[1]);
  mma_16816<T>(c1, a, b[2], b[3]);
}

}  // namespace legalpt
