// Hopper's warpgroup matrix multiply (wgmma, sm90a) and the shared-memory layout it reads.
//
// A warpgroup (4 warps, 128 threads) multiplies a 64-row A by an N-column B, k16 per instruction, asynchronously:
// wgmma_fence, the MMAs, wgmma_commit, and wgmma_wait<n> before their accumulators are touched again. Accumulators
// are laid out as mma.sync's m16n8 fragments, warp w of the group holding rows 16 w .. 16 w + 15: d[j][c] is row
// lane / 4 + 8 (c / 2), column 8 j + 2 (lane % 4) + c % 2. An A operand in registers has mma.sync's m16k16 layout.
//
// Operands in shared memory are read through 64-bit descriptors; ours are all in the 128-byte swizzle: a (rows, D)
// tile is stored as D / 64 panels of (rows, 64) elements (the backward's float32 dQ tile, which no wgmma reads:
// D / 32 panels of 32), one 128-byte line per row, and the 16-byte chunk c of row r sits at chunk c ^ (r % 8) of its
// line (which also spreads ldmatrix-free copies over the banks). Panels start
// on 1024-byte boundaries, where the swizzle pattern repeats.
#pragma once

#include <cstdint>
#include <type_traits>

#include "../common/ptx.cuh"
#ifdef LEGALPT_EMULATE
#include <array>
#include <cmath>
#include <cstring>
#endif

namespace legalpt::fa3 {

// Byte offset of 16-byte chunk `chunk` (of D / 8) of row `row` in a swizzled (ROWS, D) tile.
template <int ROWS>
__device__ __forceinline__ uint32_t swizzled(int row, int chunk) {
  return (chunk / 8) * ROWS * 128 + row * 128 + (((chunk % 8) ^ (row % 8)) << 4);
}

// P (64 x 128 keys of a warpgroup, float accumulators) as the A fragments of O += P V, one per 16 keys.
template <typename T, int BN>
__device__ __forceinline__ void to_fragments(const float (&s)[BN / 8][4], uint32_t (&a)[BN / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) {
    a[kk][0] = pack2<T>(s[2 * kk][0], s[2 * kk][1]);
    a[kk][1] = pack2<T>(s[2 * kk][2], s[2 * kk][3]);
    a[kk][2] = pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    a[kk][3] = pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
  }
}

// A warp's tile packed as A fragments (to_fragments: 16 columns each) into the swizzled (ROWS, COLS) tile at
// `dst`: the backward's dS^T, whose fragments dK's MMAs read too, so that it is converted once.
template <int ROWS, int COLS>
__device__ __forceinline__ void store_swizzled(unsigned char* dst, const uint32_t (&a)[COLS / 16][4], int row0) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int kk = 0; kk < COLS / 16; ++kk)
#pragma unroll
    for (int r = 0; r < 4; ++r) {  // a[kk][r]: columns 8 (2 kk + r / 2) + 2 (lane % 4) (+1), row lane / 4 + 8 (r % 2)
      const int row = row0 + lane / 4 + 8 * (r % 2);
      *reinterpret_cast<uint32_t*>(dst + swizzled<ROWS>(row, 2 * kk + r / 2) + 4 * (lane % 4)) = a[kk][r];
    }
}

// A warp's accumulator tile (16 rows from `row0`, COLS columns: wgmma's and mma.sync's layout) as T into the
// swizzled (ROWS, COLS) tile at `dst`: the epilogues' O, dK and dV.
template <typename T, int ROWS, int COLS>
__device__ __forceinline__ void store_swizzled(unsigned char* dst, const float (&x)[COLS / 8][4], int row0) {
  uint32_t a[COLS / 16][4];
  to_fragments<T, COLS>(x, a);
  store_swizzled<ROWS, COLS>(dst, a, row0);
}

// A warp's 16 x COLS float32 accumulator tile (rows from `row0`, columns from `col0`) into the swizzled float32
// (ROWS, D) tile at `dst`: D / 32 panels of (ROWS, 32), a 128-byte line per row, 16-byte chunks swizzled as above
// (the backward's dQ on its way to a TMA reduction).
template <int ROWS, int COLS>
__device__ __forceinline__ void store_swizzled_f32(unsigned char* dst, const float (&x)[COLS / 8][4], int row0,
                                                   int col0) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int n = 0; n < COLS / 8; ++n)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = row0 + lane / 4 + 8 * r, col = col0 + 8 * n + 2 * (lane % 4);
      *reinterpret_cast<float2*>(dst + swizzled<ROWS>(row, col / 4) + 4 * (col % 4)) =
          make_float2(x[n][2 * r], x[n][2 * r + 1]);
    }
}

// P (64 x BN keys of a warpgroup, float accumulators) as the e4m3 A fragments of O += P V, one per 32 keys. A
// thread's accumulators hold keys {2q, 2q + 1, 2q + 8, 2q + 9} of each 16 (q = lane % 4) where the 8-bit A layout
// wants {4q .. 4q + 3}: they go in as they are, so that A's k = 4q + i is key perm(4q + i) of its 16, and V's keys
// come permuted alike (fp8.py lays V out so), which keeps the shuffles out of the loop.
template <int BN>
__device__ __forceinline__ void to_fragments_e4m3(const float (&s)[BN / 8][4], uint32_t (&a)[BN / 32][4]) {
#pragma unroll
  for (int kk = 0; kk < BN / 32; ++kk)
#pragma unroll
    for (int r = 0; r < 4; ++r) {  // (row half, 16-key half) of the fragment: registers {(0, 0), (1, 0), (0, 1), (1, 1)}
      const int half = r % 2, n = 4 * kk + 2 * (r / 2);
      a[kk][r] = pack4_e4m3(s[n][2 * half], s[n][2 * half + 1], s[n + 1][2 * half], s[n + 1][2 * half + 1]);
    }
}

// Descriptor of a swizzled operand starting at shared address `addr`. K-major (the reduction runs along the 128-byte
// lines: Q and K in S = Q K^T): `panel` unused, 8-row groups 1024 bytes apart. MN-major (the output columns run
// along the lines: V in O = P V): `panel` bytes between the 64-column panels, 8-row groups 1024 bytes apart.
__device__ __forceinline__ uint64_t descriptor(uint32_t addr, uint32_t panel = 16) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | static_cast<uint64_t>(panel >> 4) << 16 |
         static_cast<uint64_t>(1024 >> 4) << 32 | 1ull << 62;  // bits 62-63 = 1: 128-byte swizzle
}

#ifndef LEGALPT_EMULATE
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Wait until at most N committed groups of this warpgroup are still running.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Shared memory written through the generic proxy (st.shared: the backward's dS^T) made visible to wgmma's async
// proxy. TMA writes through the async proxy itself and needs no fence.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Pins accumulators at this point of the program: the compiler may not move their reads or writes across it. Placed
// after wgmma_wait (so reads follow the wait) and before wgmma_fence (so writes precede the MMAs).
template <int N>
__device__ __forceinline__ void pin(float (&d)[N][4]) {
#pragma unroll
  for (int j = 0; j < N; ++j)
#pragma unroll
    for (int c = 0; c < 4; ++c) asm volatile("" : "+f"(d[j][c])::"memory");
}

// The accumulators of an m64nN wgmma as asm operands (d[j][c], j < N / 8), and their places in the instruction;
// the other operands follow them (%16... at N = 32, %32... at N = 64, %64... at N = 128).
#define LEGALPT_ACC8(j) "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
#define LEGALPT_ACC32 LEGALPT_ACC8(0), LEGALPT_ACC8(1), LEGALPT_ACC8(2), LEGALPT_ACC8(3)
#define LEGALPT_ACC64 LEGALPT_ACC8(0), LEGALPT_ACC8(1), LEGALPT_ACC8(2), LEGALPT_ACC8(3), LEGALPT_ACC8(4), LEGALPT_ACC8(5), LEGALPT_ACC8(6), LEGALPT_ACC8(7)
#define LEGALPT_ACC128 LEGALPT_ACC64, LEGALPT_ACC8(8), LEGALPT_ACC8(9), LEGALPT_ACC8(10), LEGALPT_ACC8(11), LEGALPT_ACC8(12), LEGALPT_ACC8(13), LEGALPT_ACC8(14), LEGALPT_ACC8(15)
#define LEGALPT_D32 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define LEGALPT_D64 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13," \
  " %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define LEGALPT_D128 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21," \
  " %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41," \
  " %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
// wgmma.mma_async with A and B from shared memory; scale-d (S) a predicate from `accumulate`, transposes immediate.
#define LEGALPT_WGMMA_SS(N, TYPE, D, A, B, S, TA, TB, ACC)                                                     \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " S ", 0;\nwgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TYPE \
               "." TYPE " " D ", " A ", " B ", p, 1, 1, " TA ", " TB ";\n}\n"                                  \
               : ACC                                                                                         \
               : "l"(a), "l"(b), "r"(accumulate), "n"(kTransA), "n"(kTransB))
// wgmma.mma_async with A from registers, B N-major from shared memory, accumulating.
#define LEGALPT_WGMMA_RS(N, TYPE, D, A, B, ACC)                                                              \
  asm volatile("wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TYPE "." TYPE " " D ", " A ", " B ", 1, 1, 1, 1;\n" \
               : ACC                                                                                         \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b))

// d (64 x N) (+)= A (64 x 16) B (16 x N), A and B in shared memory: K-major unless kTransA (A M-major) or kTransB
// (B N-major); accumulate = 0 overwrites d.
template <typename T, int N, int kTransA = 0, int kTransB = 0>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 8][4], uint64_t a, uint64_t b, int accumulate) {
  static_assert(N == 32 || N == 64 || N == 128, "wgmma shapes m64n32k16, m64n64k16 and m64n128k16");
  constexpr bool kHalf = std::is_same_v<T, __half>;
  if constexpr (N == 32 && kHalf) {
    LEGALPT_WGMMA_SS(32, "f16", LEGALPT_D32, "%16", "%17", "%18", "%19", "%20", LEGALPT_ACC32);
  } else if constexpr (N == 32) {
    LEGALPT_WGMMA_SS(32, "bf16", LEGALPT_D32, "%16", "%17", "%18", "%19", "%20", LEGALPT_ACC32);
  } else if constexpr (N == 64 && kHalf) {
    LEGALPT_WGMMA_SS(64, "f16", LEGALPT_D64, "%32", "%33", "%34", "%35", "%36", LEGALPT_ACC64);
  } else if constexpr (N == 64) {
    LEGALPT_WGMMA_SS(64, "bf16", LEGALPT_D64, "%32", "%33", "%34", "%35", "%36", LEGALPT_ACC64);
  } else if constexpr (kHalf) {
    LEGALPT_WGMMA_SS(128, "f16", LEGALPT_D128, "%64", "%65", "%66", "%67", "%68", LEGALPT_ACC128);
  } else {
    LEGALPT_WGMMA_SS(128, "bf16", LEGALPT_D128, "%64", "%65", "%66", "%67", "%68", LEGALPT_ACC128);
  }
}

// d (64 x N) += A (64 x 16, registers) B (16 x N, shared memory, N-major).
template <typename T, int N>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 8][4], const uint32_t (&a)[4], uint64_t b) {
  static_assert(N == 64 || N == 128, "wgmma shapes m64n64k16 and m64n128k16");
  constexpr bool kHalf = std::is_same_v<T, __half>;
  if constexpr (N == 64 && kHalf) {
    LEGALPT_WGMMA_RS(64, "f16", LEGALPT_D64, "{%32, %33, %34, %35}", "%36", LEGALPT_ACC64);
  } else if constexpr (N == 64) {
    LEGALPT_WGMMA_RS(64, "bf16", LEGALPT_D64, "{%32, %33, %34, %35}", "%36", LEGALPT_ACC64);
  } else if constexpr (kHalf) {
    LEGALPT_WGMMA_RS(128, "f16", LEGALPT_D128, "{%64, %65, %66, %67}", "%68", LEGALPT_ACC128);
  } else {
    LEGALPT_WGMMA_RS(128, "bf16", LEGALPT_D128, "{%64, %65, %66, %67}", "%68", LEGALPT_ACC128);
  }
}

// The FP8 forward's MMAs, e4m3 x e4m3 with float32 accumulators, k32 per instruction. Both shared-memory operands
// are K-major (8-bit wgmma transposes neither); an A operand in registers holds, per thread of row g = lane / 4 (and
// g + 8) of its warp's 16, the four k at 4 (lane % 4) .. + 3 and 16 + 4 (lane % 4) .. + 3: registers {(g, low k),
// (g + 8, low k), (g, high k), (g + 8, high k)}, the lowest k in the lowest byte.
// d (64 x 128) (+)= A (64 x 32) B (32 x 128), both from shared memory.
__device__ __forceinline__ void wgmma_ss_e4m3(float (&d)[16][4], uint64_t a, uint64_t b, int accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\nwgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
               LEGALPT_D128 ", %64, %65, p, 1, 1;\n}\n"
               : LEGALPT_ACC128
               : "l"(a), "l"(b), "r"(accumulate));
}
// d (64 x 128) += A (64 x 32, registers) B (32 x 128, shared memory).
__device__ __forceinline__ void wgmma_rs_e4m3(float (&d)[16][4], const uint32_t (&a)[4], uint64_t b) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 " LEGALPT_D128
               ", {%64, %65, %66, %67}, %68, 1, 1, 1;\n"
               : LEGALPT_ACC128
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

#else  // LEGALPT_EMULATE: the same on the CPU (csrc/common/emulate.h); a wgmma runs when a wait for its group returns
extern unsigned char smem_raw[];  // the kernels' dynamic shared memory, defined by csrc/emulated.cpp

inline uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(static_cast<const unsigned char*>(p) - smem_raw);
}
inline void wgmma_fence() {}
inline void wgmma_commit() { emu::wgmma_commit(); }
template <int N>
inline void wgmma_wait() {
  emu::wgmma_wait(N);
}
inline void fence_proxy_async() {}
template <int N>
inline void pin(float (&)[N][4]) {}

namespace emulated {

struct Operand {
  uint32_t start, lbo, sbo;  // bytes
};
inline Operand decode(uint64_t desc) {
  return {static_cast<uint32_t>(desc & 0x3FFF) << 4, static_cast<uint32_t>((desc >> 16) & 0x3FFF) << 4,
          static_cast<uint32_t>((desc >> 32) & 0x3FFF) << 4};
}

// The 16-bit element at shared address `addr` as the 128-byte swizzle stores it: the 16-byte chunk index (address
// bits 4-6) XOR the line's index in its 1024-byte period (bits 7-9).
template <typename T>
inline float at(uint32_t addr) {
  uint16_t bits;
  std::memcpy(&bits, smem_raw + (addr ^ (((addr >> 7) & 7) << 4)), 2);
  return to_float_bits<T>(bits);
}

// Element (i, k) of an operand, i its row (M or N) and k the reduction: K-major, 8-row groups `sbo` apart and k
// along a line; MN-major, 8-line groups of k `sbo` apart and i along the lines, 64-element panels `lbo` apart.
template <typename T>
inline float element(const Operand& o, bool mn_major, int i, int k) {
  if (!mn_major) return at<T>(o.start + (i / 8) * o.sbo + (i % 8) * 128 + 2 * k);
  return at<T>(o.start + (i / 64) * o.lbo + (k / 8) * o.sbo + (k % 8) * 128 + 2 * (i % 64));
}
// The same for a K-major e4m3 operand: one byte per element.
inline float element_e4m3(const Operand& o, int i, int k) {
  const uint32_t addr = o.start + (i / 8) * o.sbo + (i % 8) * 128 + k;
  return e4m3_to_float(smem_raw[addr ^ (((addr >> 7) & 7) << 4)]);
}

// d[j][c] (+)= sum over k < K of a(row, k) b(col, k) at this thread's accumulator positions.
template <int N, int K = 16, typename A, typename B>
inline void mma(float (&d)[N / 8][4], bool accumulate, A a, B b) {
  const int w = threadIdx.x / 32 % 4, l = threadIdx.x % 32;
  for (int j = 0; j < N / 8; ++j)
    for (int c = 0; c < 4; ++c) {
      const int row = 16 * w + l / 4 + 8 * (c / 2), col = 8 * j + 2 * (l % 4) + c % 2;
      float sum = accumulate ? d[j][c] : 0.f;
      for (int k = 0; k < K; ++k) sum = std::fma(a(row, k), b(col, k), sum);
      d[j][c] = sum;
    }
}

// The warp's 16 rows of a register A operand (each thread's four registers), gathered from the warpgroup's threads
// at the issue.
inline std::array<std::array<uint32_t, 4>, 32> warp_a_rows(const uint32_t (&a)[4]) {
  emu::GroupScratch& s = emu::group_scratch();
  for (int i = 0; i < 4; ++i) s.regs[threadIdx.x % 128][i] = a[i];
  emu::group_sync();
  const int w = threadIdx.x / 32 % 4;
  std::array<std::array<uint32_t, 4>, 32> rows;
  for (int l = 0; l < 32; ++l)
    for (int i = 0; i < 4; ++i) rows[l][i] = s.regs[32 * w + l][i];
  emu::group_sync();
  return rows;
}

}  // namespace emulated

template <typename T, int N, int kTransA = 0, int kTransB = 0>
inline void wgmma_ss(float (&d)[N / 8][4], uint64_t a, uint64_t b, int accumulate) {
  const emulated::Operand oa = emulated::decode(a), ob = emulated::decode(b);
  emu::wgmma_issue([&d, oa, ob, accumulate] {
    emulated::mma<N>(
        d, accumulate != 0, [&](int m, int k) { return emulated::element<T>(oa, kTransA, m, k); },
        [&](int n, int k) { return emulated::element<T>(ob, kTransB, n, k); });
  });
}

// A's fragments are gathered from the warpgroup's 128 threads (mma.sync's m16k16 layout, warp w rows 16 w ...).
template <typename T, int N>
inline void wgmma_rs(float (&d)[N / 8][4], const uint32_t (&a)[4], uint64_t b) {
  const auto rows = emulated::warp_a_rows(a);
  const emulated::Operand ob = emulated::decode(b);
  emu::wgmma_issue([&d, rows, ob] {
    const auto a_at = [&](int m, int k) {
      const uint32_t reg = rows[(m % 8) * 4 + (k % 8) / 2][(m % 16) / 8 + 2 * (k / 8)];
      return to_float_bits<T>(static_cast<uint16_t>(reg >> (16 * (k % 2))));
    };
    emulated::mma<N>(d, true, a_at, [&](int n, int k) { return emulated::element<T>(ob, true, n, k); });
  });
}

inline void wgmma_ss_e4m3(float (&d)[16][4], uint64_t a, uint64_t b, int accumulate) {
  const emulated::Operand oa = emulated::decode(a), ob = emulated::decode(b);
  emu::wgmma_issue([&d, oa, ob, accumulate] {
    emulated::mma<128, 32>(
        d, accumulate != 0, [&](int m, int k) { return emulated::element_e4m3(oa, m, k); },
        [&](int n, int k) { return emulated::element_e4m3(ob, n, k); });
  });
}
inline void wgmma_rs_e4m3(float (&d)[16][4], const uint32_t (&a)[4], uint64_t b) {
  const auto rows = emulated::warp_a_rows(a);
  const emulated::Operand ob = emulated::decode(b);
  emu::wgmma_issue([&d, rows, ob] {
    const auto a_at = [&](int m, int k) {  // the 8-bit layout of the comment above wgmma_ss_e4m3
      const uint32_t reg = rows[(m % 8) * 4 + (k % 16) / 4][(m % 16) / 8 + 2 * (k / 16)];
      return e4m3_to_float(static_cast<uint8_t>(reg >> (8 * (k % 4))));
    };
    emulated::mma<128, 32>(d, true, a_at, [&](int n, int k) { return emulated::element_e4m3(ob, n, k); });
  });
}
#endif

}  // namespace legalpt::fa3
