// Warp specialization (Hopper): a producer warpgroup issues the TMA copies and consumer warpgroups compute, as in
// FA3. The producer gives most of its registers to the consumers (setmaxnreg), and the consumers meet at named
// barriers; the backward's dQ warp of the producer joins two of them (kDqFree, kDqStored).
#pragma once

#include "../common/ptx.cuh"

namespace legalpt::fa3 {

// The named barriers of the fa3 kernels (ids; 0 is __syncthreads'): the consumers' threads, and for kDqFree and
// kDqStored the backward's dQ warp beside them.
enum NamedBarrier {
  kConsumersSync = 1,  // every consumer thread: zeroed rows, stored epilogue tiles
  kDsStored = 2,       // the backward: both consumers' dS^T are in shared memory
  kTurn0 = 3,          // the forward's ping-pong: consumer w's turn is kTurn0 + w (w < 3)
  kDqFree = 6,         // the backward: the dQ warp's reduction has read the dQ tile (consumers and the dQ warp)
  kDqStored = 7,       // the backward: both consumers' dQ parts are in shared memory (the same threads)
  kOStored0 = 8,       // the forward's epilogue: consumer w's O rows are in its part of sO (kOStored0 + w)
};

#ifndef LEGALPT_EMULATE
// The warpgroup's registers per thread lowered to N (the producer), or raised to N (the consumers): every warp of
// the warpgroup executes it.
template <int N>
__device__ __forceinline__ void registers_down() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void registers_up() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
// Named barrier `id` (1-15; 0 is __syncthreads') of `threads` threads: arrive and wait, or arrive only.
__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
#else
template <int N>
inline void registers_down() {}
template <int N>
inline void registers_up() {}
inline void named_sync(int id, int threads) {
  emu::block.named[id].expected = threads;
  emu::block.named[id].arrive();
}
inline void named_arrive(int id, int threads) {
  emu::block.named[id].expected = threads;
  emu::block.named[id].arrive_only();
}
#endif

}  // namespace legalpt::fa3
