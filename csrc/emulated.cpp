// The CPU emulation build of the FA2 and FA3 paths (csrc/common/emulate.h says how it works): the kernels and host
// code of the CUDA build, run on CPU tensors, so that tests can check the kernels' index math, masks and barriers
// without a GPU (tests/attention/test_fa2_emulated.py). Built by legalpt.attention.kernels.emulated for one head
// dim (LEGALPT_HDIM_<d>), with the sm90 path (LEGALPT_SM90); the same Python functions as the CUDA build's.
#ifndef LEGALPT_EMULATE
#error "build with -DLEGALPT_EMULATE"
#endif

#include "api.h"
#include "sm80/launch.h"
#include "sm90/launch.h"

namespace legalpt::fa2 {

alignas(16) unsigned char smem[227 * 1024];  // the shared memory of the one block that runs at a time

namespace {

struct EmulatedLaunch {

  // Three, so that the persistent kernels' blocks take several items each, and a grid of fewer blocks than items
  // is exercised.
  int processors() const { return 3; }

  template <typename Args>
  void operator()(void (*kernel)(Args), dim3 grid, int threads, int smem_bytes, const Args& args) const {
    TORCH_CHECK(smem_bytes <= static_cast<int>(sizeof(smem)), "shared memory: ", smem_bytes, " bytes requested");
    emu::launch(kernel, grid, threads, args);
  }
};

// The call's "device": checked to be the CPU, the only one the emulation runs on.
struct EmulatedContext {
  EmulatedLaunch launch;
  explicit EmulatedContext(const at::Device& device) {
    TORCH_CHECK(device.is_cpu(), "the emulated kernels take CPU tensors, got ", device);
  }
};

}  // namespace

// Scores on which the plain rule's bit masks (seen_keys for the forward's rows, seen_queries for the backward's
// transposed tiles) disagree with `allowed`, for one document of lq queries and lk keys: every thread start (first
// key, or first query) and its 32 strided neighbours, past the document's ends too.
inline int64_t mask_bit_mismatches(int64_t lq, int64_t lk, bool causal, int64_t left, int64_t right,
                                   int64_t global_tokens) {
  MaskParams m{};
  m.causal = causal;
  m.left = static_cast<int>(left);
  m.right = static_cast<int>(right);
  m.global_tokens = static_cast<int>(global_tokens);
  m.dilation = 1;
  const int nq = static_cast<int>(lq), nk = static_cast<int>(lk);
  int64_t wrong = 0;
  for (int i = 0; i < nq + 16; ++i) {
    const RowMask r = row_mask(m, i, nq, nk);
    for (int j = 0; j < nk + 16; ++j) {
      const uint32_t seen = seen_keys(r, j);
      for (int n = 0; n < 32; ++n) wrong += ((seen >> n & 1u) != 0) != allowed<false>(m, r, i, j + 8 * n, 0, 0);
    }
  }
  for (int j = 0; j < nk + 16; ++j)
    for (int i = 0; i < nq + 16; ++i) {
      const uint32_t seen = seen_queries(m, j, i + (nk - nq), nk);
      for (int n = 0; n < 32; ++n) {
        const RowMask r = row_mask(m, i + 8 * n, nq, nk);
        wrong += ((seen >> n & 1u) != 0) != allowed<false>(m, r, i + 8 * n, j, 0, 0);
      }
    }
  return wrong;
}
}  // namespace legalpt::fa2

namespace legalpt::fa3 {
alignas(1024) unsigned char smem_raw[227 * 1024];  // the fa3 kernels' (wgmma.cuh decodes addresses within it)

// Small kernels of 64 threads (two warps) that pin down the emulation's synchronization, one per named check; each
// writes what its waiting thread saw into out[block]. Run over 4 blocks, one per schedule of emulate.h.
namespace checks {

struct Args {
  int* out;
};

// Warp 0 writes 1 and arrives at named barrier 1; warp 1 waits there, then reads: 1, whichever warp runs first.
void named_barrier(Args a) {
  int* word = reinterpret_cast<int*>(smem_raw);
  if (threadIdx.x == 0) *word = 0;
  __syncthreads();
  if (threadIdx.x < 32) {
    if (threadIdx.x == 0) *word = 1;
    named_arrive(1, 64);
  } else {
    named_sync(1, 64);
    if (threadIdx.x == 32) a.out[blockIdx.x] = *word;
  }
}

// Warp 1 arrives at named barrier 1 and nobody waits: the launch raises.
void named_barrier_left_over(Args) {
  if (threadIdx.x >= 32) named_arrive(1, 64);
}

// An mbarrier of two arrivals: thread 0 arrives and waits; thread 32 writes 1, then arrives. The phase completes only
// with the second arrival, so thread 0 reads 1.
void mbarrier_arrivals(Args a) {
  uint64_t* bar = reinterpret_cast<uint64_t*>(smem_raw + 64);
  int* word = reinterpret_cast<int*>(smem_raw);
  if (threadIdx.x == 0) {
    *word = 0;
    mbar_init(bar, 2);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    mbar_arrive(bar);
    mbar_wait(bar, 0);
    a.out[blockIdx.x] = *word;
  } else if (threadIdx.x == 32) {
    *word = 1;
    mbar_arrive(bar);
  }
}

// Three arrivals at an mbarrier of two within one phase (the third comes before anyone waits): the launch raises.
void mbarrier_extra_arrival(Args) {
  uint64_t* bar = reinterpret_cast<uint64_t*>(smem_raw + 64);
  if (threadIdx.x == 0) mbar_init(bar, 1);
  __syncthreads();
  if (threadIdx.x == 0) {
    mbar_expect(bar, 16);  // one arrival, and 16 bytes that never come: the phase stays open
    mbar_arrive(bar);
  }
}

// Warp 0 arrives twice at named barrier 1 of 64 threads before warp 1 gets there (a producer a phase ahead of its
// consumer): the hardware would count the second arrival as warp 1's and complete the phase without it. The launch
// raises.
void named_barrier_arrived_twice(Args) {
  if (threadIdx.x < 32) {
    named_arrive(1, 64);
    named_arrive(1, 64);
  }
  __syncthreads();
  if (threadIdx.x >= 32) named_sync(1, 64);
}

}  // namespace checks

// Runs check `name` over 4 blocks (every schedule); what the waiting thread saw in each block.
inline at::Tensor check_emulation(const std::string& name) {
  const std::unordered_map<std::string, void (*)(checks::Args)> kernels = {
      {"named_barrier", checks::named_barrier},
      {"named_barrier_left_over", checks::named_barrier_left_over},
      {"mbarrier_arrivals", checks::mbarrier_arrivals},
      {"mbarrier_extra_arrival", checks::mbarrier_extra_arrival},
      {"named_barrier_arrived_twice", checks::named_barrier_arrived_twice},
  };
  const auto kernel = kernels.find(name);
  TORCH_CHECK(kernel != kernels.end(), "check_emulation: no check named '", name, "'");
  at::Tensor out = at::full({4}, -1, at::kInt);
  emu::launch(kernel->second, dim3(4), 64, checks::Args{out.data_ptr<int>()});
  return out;
}
}  // namespace legalpt::fa3

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  legalpt::api::bind<legalpt::fa2::EmulatedContext>(m);
  m.def("check_emulation", &legalpt::fa3::check_emulation, "runs one of the emulation's synchronization checks");
  m.def("mask_bit_mismatches", &legalpt::fa2::mask_bit_mismatches, "the plain rule's bit masks against `allowed`");
}
