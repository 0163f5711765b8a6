// TMA (Hopper's tensor memory accelerator) for the fa3 kernels: a tensor map describes a (B, S, H, D) or packed
// (total, H, D) tensor as 4-D {D, H, rows, batches}; one copy brings a box of (rows, 128 bytes) of one head into a
// shared-memory panel in the 128-byte swizzle of wgmma.cuh, zero-filling rows past the tensor's end. Copies complete
// on an mbarrier in shared memory, which counts their bytes: the consumers wait on its phase instead of a cp.async
// group, and no proxy fence is needed (TMA writes through the async proxy that wgmma reads). Rows past a document's
// end but inside the tensor (varlen) hold the next document's values: the kernels zero them (zero_rows). Stores
// go the other way, from a swizzled panel to global memory; they would write a tile's rows past a document's end
// into the next document, so the kernels store whole tiles only this way. Reductions add a float32 panel into
// global memory (the backward's dQ). A box is 128 bytes wide: 64 columns of 2-byte elements, 32 of float32, 128 of
// e4m3.
#pragma once

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "../common/problem.h"
#include "wgmma.cuh"
#ifndef LEGALPT_EMULATE
#include <cudaTypedefs.h>
#endif

namespace legalpt::fa3 {

#ifndef LEGALPT_EMULATE
struct alignas(64) TensorMap {
  uint64_t opaque[16];  // a CUtensorMap, filled on the host by cuTensorMapEncodeTiled (launch.h)
};

// `arrivals` per phase: 1 for a barrier of TMA copies (the issuing thread's), plus the lanes whose cp.async copies
// arrive on it (cp_async_arrive), or the consumers' warps for one that frees a buffer.
__device__ __forceinline__ void mbar_init(uint64_t* bar, int arrivals = 1) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(arrivals) : "memory");
}
// Makes the initialization visible to the async proxy (the copies' completions); a block barrier follows.
__device__ __forceinline__ void mbar_fence_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
// The issuing thread's arrival, and the bytes of the copies that must land before the phase completes.
__device__ __forceinline__ void mbar_expect(uint64_t* bar, int bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}
// A plain arrival: a consumer is done with the buffer the barrier guards.
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
// An arrival once this thread's cp.async copies so far have landed (an mbarrier initialized with one arrival for
// this thread: .noinc), so that copies of scattered words complete a phase beside TMA's.
__device__ __forceinline__ void cp_async_arrive(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
// Until the phase of parity `phase` has completed.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, int phase) {
  asm volatile(
      "{\n.reg .pred done;\nwait:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait;\n}\n" ::"r"(smem_addr(bar)),
      "r"(phase)
      : "memory");
}
// Rows [row, row + box rows) of head `head`, columns [col, col + 64), of batch `batch` into the panel at `dst`.
__device__ __forceinline__ void tma_load(void* dst, const TensorMap& map, int col, int head, int row, int batch,
                                         uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, "
      "%5}], [%6];\n" ::"r"(smem_addr(dst)),
      "l"(&map), "r"(col), "r"(head), "r"(row), "r"(batch), "r"(smem_addr(bar))
      : "memory");
}
// The swizzled panel at `src` (box rows x 64 columns) to rows [row, row + box rows) of head `head`, columns
// [col, col + 64), of batch `batch`; rows past the tensor's end are not written. One of this thread's bulk group.
__device__ __forceinline__ void tma_store(const TensorMap& map, const void* src, int col, int head, int row,
                                          int batch) {
  asm volatile(
      "cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%1, %2, %3, %4}], [%5];\n" ::"l"(&map), "r"(col),
      "r"(head), "r"(row), "r"(batch), "r"(smem_addr(src))
      : "memory");
}
// Adds the swizzled float32 panel at `src` (box rows x 32 columns) into rows [row, row + box rows) of head `head`,
// columns [col, col + 32), of batch `batch` (rows past the tensor's end are skipped). One of this thread's bulk group.
__device__ __forceinline__ void tma_reduce_add(const TensorMap& map, const void* src, int col, int head, int row,
                                               int batch) {
  asm volatile(
      "cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group [%0, {%1, %2, %3, %4}], [%5];\n" ::"l"(
          &map),
      "r"(col), "r"(head), "r"(row), "r"(batch), "r"(smem_addr(src))
      : "memory");
}
// This thread's stores and reductions since the last commit become a bulk group.
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Until at most N of this thread's bulk groups have yet to read shared memory: the rest's may be rewritten, while
// their writes to global memory complete on their own.
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}

// The map of a tensor as {D, heads, rows, batches} (strides in elements between heads, rows and batches, D
// contiguous; all multiples of 16 bytes and the start 16-byte aligned, as backends/cuda.py's _kernel_layout and api.h's
// describe make them), copied in boxes of (box_rows, 128 bytes) with the 128-byte swizzle. Throws where the driver
// refuses it.
inline TensorMap make_tensor_map(const void* base, Element element, const int64_t (&dims)[4],
                                 const int64_t (&strides)[3], int box_rows) {
  static const auto encode = [] {  // through the runtime, so that the extension does not link libcuda
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
#if CUDART_VERSION >= 12050
    const cudaError_t status =
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found);
#else  // the versioned query is CUDA 12.5's; CUDA 13 keeps only it
    const cudaError_t status = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &fn, cudaEnableDefault, &found);
#endif
    const bool ok = status == cudaSuccess && found == cudaDriverEntryPointSuccess;
    return ok ? reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn) : nullptr;
  }();
  if (encode == nullptr) throw std::runtime_error("fa3: the CUDA driver has no cuTensorMapEncodeTiled (TMA)");
  const cuuint64_t extent[4] = {static_cast<cuuint64_t>(dims[0]), static_cast<cuuint64_t>(dims[1]),
                                static_cast<cuuint64_t>(dims[2]), static_cast<cuuint64_t>(dims[3])};
  const int bytes = element_bytes(element);
  const cuuint64_t stride_bytes[3] = {static_cast<cuuint64_t>(bytes * strides[0]),
                                      static_cast<cuuint64_t>(bytes * strides[1]),
                                      static_cast<cuuint64_t>(bytes * strides[2])};
  const cuuint32_t box[4] = {static_cast<cuuint32_t>(128 / bytes), 1, static_cast<cuuint32_t>(box_rows), 1};
  const cuuint32_t unit[4] = {1, 1, 1, 1};
  const CUtensorMapDataType type = element == Element::kBf16   ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                   : element == Element::kF16  ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                   : element == Element::kE4m3 ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                                                               : CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
  TensorMap map;
  const CUresult status = encode(
      reinterpret_cast<CUtensorMap*>(&map), type, 4, const_cast<void*>(base), extent, stride_bytes, box, unit,
      CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (status != CUDA_SUCCESS) {
    throw std::invalid_argument("fa3: cuTensorMapEncodeTiled refused a tensor (error " + std::to_string(status) +
                                "): strides in elements " + std::to_string(strides[0]) + ", " +
                                std::to_string(strides[1]) + ", " + std::to_string(strides[2]));
  }
  return map;
}

#else  // LEGALPT_EMULATE: a copy lands when a wait for its phase returns (csrc/common/emulate.h)
struct alignas(64) TensorMap {
  const unsigned char* base;
  int64_t dims[4];     // D, H, rows, batches
  int64_t strides[3];  // bytes between heads, rows, batches
  int box_rows;
  int element_bytes;
};

inline TensorMap make_tensor_map(const void* base, Element element, const int64_t (&dims)[4],
                                 const int64_t (&strides)[3], int box_rows) {
  const int bytes = element_bytes(element);
  // cuTensorMapEncodeTiled's rules on the address and strides, so that the CPU tests see what the driver refuses
  bool ok = reinterpret_cast<uintptr_t>(base) % 16 == 0;
  for (int d = 0; d < 3; ++d) ok = ok && (bytes * strides[d]) % 16 == 0;
  if (!ok) {
    throw std::invalid_argument("fa3: cuTensorMapEncodeTiled refuses a tensor whose start or strides (elements " +
                                std::to_string(strides[0]) + ", " + std::to_string(strides[1]) + ", " +
                                std::to_string(strides[2]) + ") are not multiples of 16 bytes");
  }
  return {static_cast<const unsigned char*>(base), {dims[0], dims[1], dims[2], dims[3]},
          {bytes * strides[0], bytes * strides[1], bytes * strides[2]}, box_rows, bytes};
}
inline void mbar_init(uint64_t* bar, int arrivals = 1) { emu::mbarrier(bar) = emu::Mbarrier{arrivals}; }
inline void mbar_fence_init() {}
inline void mbar_expect(uint64_t* bar, int bytes) { emu::mbarrier(bar).arrive(bytes); }
inline void mbar_arrive(uint64_t* bar) { emu::mbarrier(bar).arrive(0); }
inline void cp_async_arrive(uint64_t* bar) {  // the thread's copies land with the phase, when a wait returns
  emu::Fiber& f = emu::block.fibers[emu::block.current];
  emu::Mbarrier& m = emu::mbarrier(bar);
  for (const std::vector<emu::Copy>& group : f.groups) m.pending.insert(m.pending.end(), group.begin(), group.end());
  m.pending.insert(m.pending.end(), f.open.begin(), f.open.end());
  f.groups.clear();
  f.open.clear();
  m.arrive(0);
}
inline void mbar_wait(uint64_t* bar, int phase) { emu::mbarrier(bar).wait(phase); }
// A box line's 16-byte chunk c (of 8): its global address, or nullptr where it lies past the tensor.
inline unsigned char* box_chunk(const TensorMap& map, int col, int head, int row, int batch, int c) {
  const bool inside = row < map.dims[2] && head < map.dims[1] && batch < map.dims[3];
  if (!inside || col + 16 * c / map.element_bytes >= map.dims[0]) return nullptr;
  return const_cast<unsigned char*>(map.base) + batch * map.strides[2] + row * map.strides[1] +
         head * map.strides[0] + col * map.element_bytes + 16 * c;
}
// fn(offset in the swizzled panel, global address or nullptr) for every 16-byte chunk of a box
template <typename Fn>
inline void for_box_chunks(const TensorMap& map, int col, int head, int row, int batch, Fn fn) {
  for (int r = 0; r < map.box_rows; ++r)
    for (int c = 0; c < 8; ++c) fn(swizzled<64>(r, c), box_chunk(map, col, head, row + r, batch, c));
}
inline void tma_load(void* dst, const TensorMap& map, int col, int head, int row, int batch, uint64_t* bar) {
  unsigned char* out = static_cast<unsigned char*>(dst);
  for_box_chunks(map, col, head, row, batch,
                 [&](int at, unsigned char* from) { emu::mbarrier(bar).copy(out + at, from); });
}
// The bulk operations run when a wait for their group returns; they keep a copy of the map (the kernel's argument
// may be gone by then).
inline void tma_store(const TensorMap& map, const void* src, int col, int head, int row, int batch) {
  const unsigned char* in = static_cast<const unsigned char*>(src);
  emu::bulk_issue([=] {
    for_box_chunks(map, col, head, row, batch, [&](int at, unsigned char* to) {
      if (to != nullptr) std::memcpy(to, in + at, 16);
    });
  });
}
inline void tma_reduce_add(const TensorMap& map, const void* src, int col, int head, int row, int batch) {
  const unsigned char* in = static_cast<const unsigned char*>(src);
  emu::bulk_issue([=] {
    for_box_chunks(map, col, head, row, batch, [&](int at, unsigned char* to) {
      if (to == nullptr) return;
      float x[4], y[4];  // float32: four to a chunk
      std::memcpy(x, in + at, 16);
      std::memcpy(y, to, 16);
      for (int e = 0; e < 4; ++e) y[e] += x[e];
      std::memcpy(to, y, 16);
    });
  });
}
inline void bulk_commit() { emu::bulk_commit(); }
template <int N>
inline void bulk_wait_read() {
  emu::bulk_wait(N);
}
#endif

// A whole swizzled (ROWS, D) tile of BYTES-byte elements, its D * BYTES / 128 panels of ROWS lines one box each:
// rows [row, row + ROWS) of head `head` of `map` into `dst` on `bar`, or from `src` (2-byte elements; stores of
// this thread's open bulk group: bulk_commit follows).
template <int ROWS, int D, int BYTES = 2>
__device__ __forceinline__ void tma_load_tile(unsigned char* dst, const TensorMap& map, int head, int row, int batch,
                                              uint64_t* bar) {
#pragma unroll
  for (int c = 0; c < D * BYTES / 128; ++c) tma_load(dst + c * ROWS * 128, map, 128 / BYTES * c, head, row, batch, bar);
}
template <int ROWS, int D>
__device__ __forceinline__ void tma_store_tile(const TensorMap& map, const unsigned char* src, int head, int row,
                                               int batch) {
#pragma unroll
  for (int c = 0; c < D / 64; ++c) tma_store(map, src + c * ROWS * 128, 64 * c, head, row, batch);
}

// Rows [valid, ROWS) of a swizzled (ROWS, D) tile to zero: the rows a box brought from past a varlen document's
// end, which hold the next document's values, so that a non-finite one cannot reach this document through a zero
// probability (0 x Inf is NaN). THREADS threads take part, `thread` this one's index among them; a proxy fence and a
// barrier of those threads must follow before wgmma reads the tile.
template <int ROWS, int D, int THREADS>
__device__ __forceinline__ void zero_rows(unsigned char* tile, int valid, int thread) {
  struct alignas(16) Chunk {
    uint32_t x[4];
  };
  constexpr int kChunks = D / 8;  // 16-byte chunks of a row, over its panels
  for (int at = thread; at < (ROWS - valid) * kChunks; at += THREADS)
    *reinterpret_cast<Chunk*>(tile + swizzled<ROWS>(valid + at / kChunks, at % kChunks)) = Chunk{};
}

}  // namespace legalpt::fa3
