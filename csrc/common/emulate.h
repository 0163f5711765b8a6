// CPU emulation of the CUDA features the FA2 and FA3 kernels use, so that the same kernel source runs on a CPU when it is
// compiled with -DLEGALPT_EMULATE (tests/attention/test_fa2_emulated.py). Its purpose is checking the kernels'
// index math, fragment layouts, masks, barrier structure and cp.async protocol without a GPU; it is slow and meant
// for tiny shapes. Fibers switch only at barriers and collectives, so it cannot see races between plain shared-memory
// accesses; cp.async copies land only at their thread's wait and poison their destination until then, so a missing
// wait or a copy into a buffer still being read does show up (as NaN).
//
// Each CUDA thread of a block is a fiber (ucontext) on one OS thread. __syncthreads and the warp-collective
// instructions (ldmatrix, mma.sync, shuffles) are barriers between fibers; the collectives exchange their operands
// through per-warp scratch between two warp barriers, exactly as the hardware distributes fragments over lanes.
// wgmma (csrc/sm90/wgmma.cuh) does the same over a warpgroup, and runs when a wait for its group returns.
// Blocks run one after another.
#pragma once

#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iterator>
#include <numeric>
#include <random>
#include <stdexcept>
#include <type_traits>
#include <unordered_map>
#include <utility>
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
struct alignas(16) float4 {
  float x, y, z, w;
};
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }

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

// e4m3 (FP8) as cvt.rn.satfinite.e4m3x2.f32 rounds (to nearest even, saturated to +-448, NaN to 0x7F) and back.
inline uint32_t e4m3_bits_rn(float f) {
  if (std::isnan(f)) return 0x7F;
  const uint32_t sign = std::signbit(f) ? 0x80 : 0;
  const float a = std::fabs(f);
  // the spacing of e4m3 values around a: 2^-9 below the smallest normal 2^-6, else 2^(exponent - 3)
  const float quantum = a < 0x1p-6f ? 0x1p-9f : std::ldexp(1.f, std::ilogb(a) - 3);
  const float r = std::fmin(std::nearbyint(a / quantum) * quantum, 448.f);
  if (r < 0x1p-6f) return sign | static_cast<uint32_t>(r * 512.f);  // subnormal: r = m 2^-9 (m = 8 is 2^-6)
  const int e = std::ilogb(r);
  return sign | static_cast<uint32_t>(e + 7) << 3 | static_cast<uint32_t>(std::ldexp(r, -e) * 8.f - 8.f);
}
inline float e4m3_to_float(uint8_t bits) {
  const int exponent = bits >> 3 & 0xF, mantissa = bits & 7;
  if (exponent == 15 && mantissa == 7) return NAN;
  const float a = exponent == 0 ? std::ldexp(static_cast<float>(mantissa), -9)
                                : std::ldexp(1.f + mantissa / 8.f, exponent - 7);
  return bits & 0x80 ? -a : a;
}

inline float __fdiv_rn(float a, float b) { return a / b; }  // IEEE division, as the CPU's
inline float __fmul_rn(float a, float b) { return a * b; }
inline uint32_t atomicMax(uint32_t* address, uint32_t value) {  // fibers never interleave inside it
  const uint32_t old = *address;
  *address = std::max(old, value);
  return old;
}
inline float __uint_as_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t __float_as_uint(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline dim3 threadIdx, blockIdx, blockDim, gridDim;  // set by the scheduler before a fiber runs
using std::max;  // the integer min and max of device code
using std::min;

namespace legalpt::emu {

struct Barrier {
  int expected = 0, arrived = 0, generation = 0;
  bool async = false;  // an mbarrier's phases: completed by copies that another thread issues, never by arrivals
  // Per thread, the phase it last arrived in (+1): a second arrival in one phase, which the hardware would count as
  // another thread's, is a kernel bug (a producer running a phase ahead of its consumers)
  std::vector<int> arrived_in;
  void arrive();         // and wait for the others (bar.sync)
  void arrive_only();    // without waiting (bar.arrive)
  void count_arrival();
};

// A cp.async copy in flight. It lands when its thread waits for its group; its destination holds all-ones bytes
// (NaN in every float type) from the issue until then.
struct Copy {
  void* dst;
  const void* src;  // nullptr: zero-fill
  int bytes;
};

// An mbarrier (csrc/sm90/tma.cuh): a phase completes once `count` arrivals came and the copies brought every byte
// the arrivals armed (expect_tx); the waiters then wake. A barrier of TMA copies has one arrival per phase, the
// issuing thread's; one that frees a buffer has the consumers' arrivals and no bytes. The copies land when a
// thread's wait for the phase returns; until then their destinations hold all-ones bytes, as cp.async's do, so that
// a read without the wait sees NaN.
struct Mbarrier {
  int count = 1;                  // arrivals per phase (mbarrier.init)
  int phases = 0;                 // completed phases; waiting for parity p returns once phases % 2 != p
  int arrived = 0;                // arrivals of the running phase
  int expected = 0, issued = 0;   // bytes the running phase's arrivals armed, and its copies brought so far
  std::vector<Copy> pending;      // copies of the running phase
  std::vector<Copy> landing;      // of completed phases, until a wait lands them
  Barrier gate{0, 0, 0, true};  // its generation counts completed phases: waiting fibers park on it
  void arrive(int bytes);                 // one arrival that arms `bytes` more (0: a plain arrival)
  void copy(void* dst, const void* src);  // 16 bytes; src nullptr: zero-fill
  void complete_if_done();
  void wait(int parity);
};
// Operations a thread issues in committed groups that take effect only when a wait for their group returns (or
// never, if the thread ends first): TMA stores and reductions, warpgroup MMAs
struct Deferred {
  std::vector<std::function<void()>> open;                 // issued since the last commit
  std::vector<std::vector<std::function<void()>>> groups;  // committed, oldest first
  void commit() {
    groups.push_back(std::move(open));
    open.clear();
  }
  void wait(int pending) {  // until at most `pending` committed groups are in flight
    while (static_cast<int>(groups.size()) > pending) {
      for (const std::function<void()>& op : groups.front()) op();
      groups.erase(groups.begin());
    }
  }
  bool idle() const { return open.empty() && groups.empty(); }
  void clear() {
    open.clear();
    groups.clear();
  }
};

struct Fiber {
  ucontext_t context;
  std::vector<char> stack;
  bool done = false;
  const Barrier* waiting_on = nullptr;    // the barrier it waits at, until that completes
  int wait_generation = 0;                // of that barrier
  std::vector<Copy> open;                 // cp.async copies issued since the last commit
  std::vector<std::vector<Copy>> groups;  // committed groups, oldest first
  // TMA stores and reductions (bulk groups): they read shared memory when a wait for their group returns, so that
  // shared memory rewritten before that wait shows in the result
  Deferred bulk;
  // Warpgroup MMAs likewise: they read shared memory and write their accumulators at that wait, so that an operand
  // rewritten, or an accumulator read, before it shows in the result
  Deferred wgmma;
};

// Operands of one warp-collective instruction, one row per lane.
struct WarpScratch {
  const void* address[32];
  uint32_t regs[32][6];
  float value[32];
};

// Operands of one warpgroup-collective instruction (wgmma with A in registers), one row per thread of the group.
struct GroupScratch {
  uint32_t regs[128][4];
};

struct Block {
  ucontext_t scheduler;
  std::vector<Fiber> fibers;
  std::vector<Barrier> warp_barriers;
  std::vector<WarpScratch> scratch;
  std::vector<Barrier> group_barriers;  // one per warpgroup (128 threads): wgmma's operand exchange
  std::vector<GroupScratch> group_scratch;
  Barrier block_barrier;
  std::unordered_map<const void*, Mbarrier> mbarriers;  // by shared-memory address, for the running block
  Barrier named[16];  // bar.sync / bar.arrive by id, their thread counts set at each use
  int current = 0;
  long events = 0;  // barrier arrivals and threads finished: scheduling steps without any mean deadlock
  const char* fault = nullptr;  // a misuse that a fiber found; the scheduler raises it
  void (*body)(const void*) = nullptr;
  const void* args = nullptr;
};

inline Block block;

inline void yield() { swapcontext(&block.fibers[block.current].context, &block.scheduler); }

// cp.async: poisoned at the issue, landed at the wait. A read before its thread's wait, or a copy into a buffer that
// other threads still read in the same barrier phase, therefore sees NaN: the hardware's races made deterministic.
inline void async_copy(void* dst, const void* src, int bytes) {
  std::memset(dst, 0xFF, bytes);
  block.fibers[block.current].open.push_back({dst, src, bytes});
}
inline void async_commit() {
  Fiber& f = block.fibers[block.current];
  f.groups.push_back(std::move(f.open));
  f.open.clear();
}
inline void async_wait(int pending) {  // until at most `pending` of the thread's committed groups are in flight
  Fiber& f = block.fibers[block.current];
  while (static_cast<int>(f.groups.size()) > pending) {
    for (const Copy& c : f.groups.front()) {
      if (c.src != nullptr) {
        std::memcpy(c.dst, c.src, c.bytes);
      } else {
        std::memset(c.dst, 0, c.bytes);
      }
    }
    f.groups.erase(f.groups.begin());
  }
}

inline void bulk_issue(std::function<void()> op) { block.fibers[block.current].bulk.open.push_back(std::move(op)); }
inline void bulk_commit() { block.fibers[block.current].bulk.commit(); }
inline void bulk_wait(int pending) { block.fibers[block.current].bulk.wait(pending); }
inline void wgmma_issue(std::function<void()> op) { block.fibers[block.current].wgmma.open.push_back(std::move(op)); }
inline void wgmma_commit() { block.fibers[block.current].wgmma.commit(); }
inline void wgmma_wait(int pending) { block.fibers[block.current].wgmma.wait(pending); }

inline Mbarrier& mbarrier(const uint64_t* bar) { return block.mbarriers[bar]; }
inline void Mbarrier::arrive(int bytes) {
  while (arrived == count) {  // the hardware would count it into the next phase: a kernel bug, raised by the scheduler
    block.fault = "emulated kernel arrived at an mbarrier again before its phase completed";
    yield();
  }
  ++arrived;
  expected += bytes;
  complete_if_done();
}
inline void Mbarrier::copy(void* dst, const void* src) {
  std::memset(dst, 0xFF, 16);
  pending.push_back({dst, src, 16});
  issued += 16;
  complete_if_done();
}
inline void Mbarrier::complete_if_done() {
  if (arrived != count || issued != expected) return;
  landing.insert(landing.end(), pending.begin(), pending.end());
  pending.clear();
  arrived = expected = issued = 0;
  ++phases;
  ++gate.generation;
  ++block.events;
}
inline void Mbarrier::wait(int parity) {
  Fiber& f = block.fibers[block.current];
  if (phases % 2 == parity) ++block.events;  // parking is a step, as arriving at a barrier is
  while (phases % 2 == parity) {
    f.waiting_on = &gate;
    f.wait_generation = gate.generation;
    yield();
  }
  f.waiting_on = nullptr;
  for (const Copy& c : landing) {
    if (c.src != nullptr) {
      std::memcpy(c.dst, c.src, c.bytes);
    } else {
      std::memset(c.dst, 0, c.bytes);
    }
  }
  landing.clear();
}

inline void Barrier::count_arrival() {
  ++block.events;
  if (arrived_in.size() <= static_cast<size_t>(block.current)) arrived_in.resize(block.fibers.size(), 0);
  int& mine = arrived_in[block.current];
  if (mine == generation + 1) block.fault = "emulated kernel: a thread arrived twice in one phase of a barrier";
  mine = generation + 1;
}
inline void Barrier::arrive_only() {
  count_arrival();
  if (++arrived == expected) {
    arrived = 0;
    ++generation;
  }
}
inline void Barrier::arrive() {
  count_arrival();
  const int gen = generation;
  if (++arrived == expected) {
    arrived = 0;
    ++generation;
    return;
  }
  Fiber& f = block.fibers[block.current];
  f.waiting_on = this;
  f.wait_generation = gen;
  while (generation == gen) yield();
  f.waiting_on = nullptr;
}

// Waiting at a barrier that the running unit of warps cannot complete alone: __syncthreads, or, when warps run one
// at a time, a warpgroup's barrier. A warp barrier completes within the warp's own turn, so it never parks.
inline bool parked(const Fiber& f, bool warpgroups) {
  if (f.waiting_on == nullptr || f.waiting_on->generation != f.wait_generation) return false;
  const bool named = f.waiting_on >= std::begin(block.named) && f.waiting_on < std::end(block.named);
  if (f.waiting_on == &block.block_barrier || f.waiting_on->async || named) return true;
  const bool warp_barrier = f.waiting_on >= &block.warp_barriers.front() && f.waiting_on <= &block.warp_barriers.back();
  return !warp_barrier && !warpgroups;
}

inline void fiber_entry() {
  block.body(block.args);
  Fiber& f = block.fibers[block.current];
  if (!f.bulk.idle()) {  // they would read shared memory the block no longer owns
    block.fault = "emulated kernel ended with TMA stores or reductions it never waited for (bulk_wait_read)";
  }
  if (!f.wgmma.idle()) {
    block.fault = "emulated kernel ended with warpgroup MMAs it never waited for (wgmma_wait)";
  }
  f.done = true;
  ++block.events;
  swapcontext(&block.fibers[block.current].context, &block.scheduler);
}

inline int lane() { return static_cast<int>(threadIdx.x % 32); }
inline WarpScratch& warp_scratch() { return block.scratch[threadIdx.x / 32]; }
inline void warp_sync() { block.warp_barriers[threadIdx.x / 32].arrive(); }
inline GroupScratch& group_scratch() { return block.group_scratch[threadIdx.x / 128]; }
inline void group_sync() { block.group_barriers[threadIdx.x / 128].arrive(); }

template <typename Args>
inline void (*kernel_of)(Args) = nullptr;  // the kernel being launched, per argument type
template <typename Args>
void run_kernel(const void* args) {
  kernel_of<Args>(*static_cast<const Args*>(args));
}

// Runs the fibers of the current block to the end under one of four legal schedules. 0, lockstep: one step of
// every thread per round. 1 and 2, warp-serial: warp by warp, ascending (1) or descending (2), each until all its
// threads wait at __syncthreads (or a warpgroup's barrier) or have returned. 3, warpgroup-serial: the same with the
// four warps of a warpgroup (blocks of whole warpgroups) as the unit. Serial schedules put one warp (or warpgroup)
// a whole barrier phase ahead of the others, so a read of what another writes in the same phase, or a write of what
// another still reads there (a missing barrier), gives a result that differs from lockstep's.
inline void run_block(int threads, int schedule) {
  const int warps = threads / 32;
  const bool warpgroups = schedule == 3 && warps % 4 == 0;
  const int unit = warpgroups ? 4 : 1, units = warps / unit;  // warps that run together, and how many such units
  for (bool running = true; running;) {
    running = false;
    const long round_events = block.events;
    for (int i = 0; i < units; ++i) {
      const int w = schedule == 2 ? units - 1 - i : i;
      for (bool again = true; again;) {
        again = false;
        const long events = block.events;
        for (int t = 32 * unit * w; t < 32 * unit * (w + 1); ++t) {
          Fiber& f = block.fibers[t];
          if (f.done || (schedule != 0 && parked(f, warpgroups))) continue;
          block.current = t;
          threadIdx = dim3(t);
          swapcontext(&block.scheduler, &f.context);
          if (const char* fault = std::exchange(block.fault, nullptr)) throw std::runtime_error(fault);
          running = true;
          again = schedule != 0;
        }
        if (again && block.events == events) {
          throw std::runtime_error("emulated kernel deadlocked: a warp waits at a barrier that cannot complete");
        }
      }
    }
    if (running && block.events == round_events) {
      throw std::runtime_error("emulated kernel deadlocked: a barrier that not every thread of the block reaches");
    }
  }
  for (const Fiber& f : block.fibers) {
    if (!f.done) throw std::runtime_error("emulated kernel deadlocked: a barrier that not every thread reaches");
  }
}

inline unsigned launches = 0;  // launches so far: the seed of the next one's block order

// Runs kernel(args) over the grid, one block at a time, each thread a fiber, the blocks in an order shuffled anew
// at each launch (seeded by its number, so that a run repeats): a kernel whose result depends on the order of its
// blocks (one block's copy overwriting another's) shows it over a few launches.
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
  block.group_barriers.assign(threads / 128, Barrier{128, 0, 0});  // blocks of whole warpgroups use them
  block.group_scratch.assign(threads / 128, GroupScratch{});
  block.body = &run_kernel<Args>;
  block.args = &args;
  std::vector<unsigned> order(grid.x * grid.y * grid.z);
  std::iota(order.begin(), order.end(), 0u);
  std::shuffle(order.begin(), order.end(), std::mt19937(++launches));
  for (const unsigned at : order) {
    const unsigned x = at % grid.x, y = at / grid.x % grid.y, z = at / grid.x / grid.y;
    blockIdx = dim3(x, y, z);
    block.block_barrier = Barrier{threads, 0, 0};
    block.mbarriers.clear();
    for (Barrier& b : block.named) b = Barrier{};
    for (int t = 0; t < threads; ++t) {
      Fiber& f = block.fibers[t];
      f.done = false;
      f.waiting_on = nullptr;
      f.open.clear();  // copies still in flight when the previous block ended never land
      f.groups.clear();
      f.bulk.clear();
      f.wgmma.clear();
      getcontext(&f.context);
      f.context.uc_stack.ss_sp = f.stack.data();
      f.context.uc_stack.ss_size = f.stack.size();
      f.context.uc_link = nullptr;
      makecontext(&f.context, fiber_entry, 0);
    }
    run_block(threads, static_cast<int>(at % 4));
    for (const Barrier& b : block.named) {
      if (b.arrived != 0) throw std::runtime_error("emulated kernel left a named barrier with unmatched arrivals");
    }
  }
}

}  // namespace legalpt::emu

inline void __syncthreads() { legalpt::emu::block.block_barrier.arrive(); }

inline void __syncwarp(unsigned = 0xffffffffu) { legalpt::emu::warp_sync(); }

inline bool __any_sync(unsigned, bool predicate) {
  using namespace legalpt::emu;
  WarpScratch& s = warp_scratch();
  s.value[lane()] = predicate ? 1.f : 0.f;
  warp_sync();
  bool any = false;
  for (int l = 0; l < 32; ++l) any = any || s.value[l] != 0.f;
  warp_sync();
  return any;
}

inline float __shfl_xor_sync(unsigned, float x, int mask) {
  using namespace legalpt::emu;
  WarpScratch& s = warp_scratch();
  s.value[lane()] = x;
  warp_sync();
  const float y = s.value[lane() ^ mask];
  warp_sync();
  return y;
}
inline unsigned __shfl_xor_sync(unsigned member_mask, unsigned x, int mask) {  // the float one's, on the bits
  return __float_as_uint(__shfl_xor_sync(member_mask, __uint_as_float(x), mask));
}
