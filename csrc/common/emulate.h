// CPU emulation of the CUDA features the FA2 kernels use, so that the same kernel source runs on a CPU when it is
// compiled with -DLEGALPT_EMULATE (tests/attention/test_fa2_emulated.py). Its purpose is checking the kernels'
// index math, fragment layouts, masks and barrier structure without a GPU; it is slow, meant for tiny shapes, and
// blind to races (fibers switch only at barriers and collectives, and cp.async copies are synchronous).
//
// Each CUDA thread of a block is a fiber (ucontext) on one OS thread. __syncthreads and the warp-collective
// instructions (ldmatrix, mma.sync, shuffles) are barriers between fibers; the collectives exchange their operands
// through per-warp scratch between two warp barriers, exactly as the hardware distributes fragments over lanes.
// Blocks run one after another.
#pragma once

#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <type_traits>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __grid_constant__
#define __shared__
#define __align__(n) __attribute__((aligned(n)))
#define __expf expf

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

struct float2 {
  float x, y;
};
inline float2 make_float2(float x, float y) { return {x, y}; }

// 16-bit floating-point storage types with the CUDA names the kernels are instantiated with.
struct __nv_bfloat16 {
  uint16_t bits;
};
struct __half {
  uint16_t bits;
};

inline float __bfloat162float(__nv_bfloat16 x) {
  const uint32_t u = static_cast<uint32_t>(x.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint16_t bf16_bits_rn(float f) {  // round to nearest even, as cvt.rn.bf16.f32
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if (std::isnan(f)) return 0x7FC0;
  return static_cast<uint16_t>((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}
inline float __half2float(__half x) {
  _Float16 h;
  std::memcpy(&h, &x.bits, 2);
  return static_cast<float>(h);
}
inline uint16_t half_bits_rn(float f) {
  const _Float16 h = static_cast<_Float16>(f);
  uint16_t bits;
  std::memcpy(&bits, &h, 2);
  return bits;
}

inline dim3 threadIdx, blockIdx, blockDim, gridDim;  // set by the scheduler before a fiber runs
using std::max;  // the integer min and max of device code
using std::min;

namespace legalpt::emu {

struct Barrier {
  int expected = 0, arrived = 0, generation = 0;
  void arrive();
};

struct Fiber {
  ucontext_t context;
  std::vector<char> stack;
  bool done = false;
  bool waiting = false;  // inside a barrier that has not completed yet
};

// Operands of one warp-collective instruction, one row per lane.
struct WarpScratch {
  const void* address[32];
  uint32_t regs[32][6];
  float value[32];
};

struct Block {
  ucontext_t scheduler;
  std::vector<Fiber> fibers;
  std::vector<Barrier> warp_barriers;
  std::vector<WarpScratch> scratch;
  Barrier block_barrier;
  int current = 0;
  long events = 0;  // barriers completed and threads finished: a scheduler round without any means deadlock
  void (*body)(const void*) = nullptr;
  const void* args = nullptr;
};

inline Block block;

inline void yield() { swapcontext(&block.fibers[block.current].context, &block.scheduler); }

inline void Barrier::arrive() {
  const int gen = generation;
  if (++arrived == expected) {
    arrived = 0;
    ++generation;
    ++block.events;
    return;
  }
  block.fibers[block.current].waiting = true;
  while (generation == gen) yield();
  block.fibers[block.current].waiting = false;
}

inline void fiber_entry() {
  block.body(block.args);
  block.fibers[block.current].done = true;
  ++block.events;
  swapcontext(&block.fibers[block.current].context, &block.scheduler);
}

inline int lane() { return static_cast<int>(threadIdx.x % 32); }
inline WarpScratch& warp_scratch() { return block.scratch[threadIdx.x / 32]; }
inline void warp_sync() { block.warp_barriers[threadIdx.x / 32].arrive(); }

template <typename Args>
inline void (*kernel_of)(Args) = nullptr;  // the kernel being launched, per argument type
template <typename Args>
void run_kernel(const void* args) {
  kernel_of<Args>(*static_cast<const Args*>(args));
}

// Runs kernel(args) over the grid, one block at a time, each thread a fiber.
template <typename Args>
void launch(void (*kernel)(Args), dim3 grid, int threads, const Args& args) {
  constexpr size_t kStack = 256 * 1024;
  if (threads % 32 != 0) throw std::invalid_argument("emulated launch: threads must be a multiple of 32");
  kernel_of<Args> = kernel;
  gridDim = grid;
  blockDim = dim3(threads);
  block.fibers.resize(threads);
  for (Fiber& f : block.fibers) f.stack.resize(kStack);
  block.warp_barriers.assign(threads / 32, Barrier{32, 0, 0});
  block.scratch.assign(threads / 32, WarpScratch{});
  block.body = &run_kernel<Args>;
  block.args = &args;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        blockIdx = dim3(x, y, z);
        block.block_barrier = Barrier{threads, 0, 0};
        for (int t = 0; t < threads; ++t) {
          Fiber& f = block.fibers[t];
          f.done = f.waiting = false;
          getcontext(&f.context);
          f.context.uc_stack.ss_sp = f.stack.data();
          f.context.uc_stack.ss_size = f.stack.size();
          f.context.uc_link = nullptr;
          makecontext(&f.context, fiber_entry, 0);
        }
        for (bool running = true; running;) {  // round robin until every thread of the block has returned
          running = false;
          bool all_waiting = true;
          const long events = block.events;
          for (int t = 0; t < threads; ++t) {
            if (block.fibers[t].done) continue;
            all_waiting = all_waiting && block.fibers[t].waiting;
            block.current = t;
            threadIdx = dim3(t);
            swapcontext(&block.scheduler, &block.fibers[t].context);
            running = running || !block.fibers[t].done;
          }
          if (running && all_waiting && block.events == events) {
            throw std::runtime_error("emulated kernel deadlocked: a barrier that not every thread of the block reaches");
          }
        }
      }
}

}  // namespace legalpt::emu

inline void __syncthreads() { legalpt::emu::block.block_barrier.arrive(); }

inline float __shfl_xor_sync(unsigned, float x, int mask) {
  using namespace legalpt::emu;
  WarpScratch& s = warp_scratch();
  s.value[lane()] = x;
  warp_sync();
  const float y = s.value[lane() ^ mask];
  warp_sync();
  return y;
}
