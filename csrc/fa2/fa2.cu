// The CUDA build of the FA2 path for one head dimension: host.h's forward, backward and preprocessing, launched on
// the current stream of the inputs' device. One extension per head dimension keeps each build small and lets the
// first use of a head dim compile only what it needs.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "host.h"

namespace legalpt::fa2 {
namespace {

// Launches on the current stream of the device it was made for (which it selects while it lives).
struct CudaLaunch {
  c10::cuda::CUDAGuard guard;
  explicit CudaLaunch(const at::Device& device) : guard(device) {}

  int processors() const {  // the device's SMs: the persistent kernels' grid
    return at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  }

  template <typename Args>
  void operator()(void (*kernel)(Args), dim3 grid, int threads, int smem, const Args& args) const {
    if (smem > 48 * 1024) {
      C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    }
    kernel<<<grid, threads, smem, at::cuda::getCurrentCUDAStream()>>>(args);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
};

}  // namespace
}  // namespace legalpt::fa2

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using legalpt::fa2::CudaLaunch;
  namespace host = legalpt::fa2::host;
  host::add_attributes(m);
  m.def("forward", &host::forward<CudaLaunch>, "FA2 attention forward (writes out and lse)");
  m.def("forward_fa3", &host::forward<CudaLaunch, true>, "the Hopper forward where built (`fa3`), else FA2's");
  m.def("prepare", &host::prepare<CudaLaunch>, "backward preprocessing: delta = rowsum(dO * O) - dlse, lse in log2, dq_accum zeroed");
  m.def("backward", &host::backward<CudaLaunch>, "FA2 attention backward (accumulates dq_accum, writes dk and dv)");
  m.def("backward_fa3", &host::backward<CudaLaunch, true>, "the Hopper backward where built (`fa3`), else FA2's");
}
