// The CUDA build's module, `legalpt._C`: api.h's functions on the call's device and its current stream. The kernels
// themselves are compiled in csrc/instantiations/, one file per head dim, element type, mask generality, direction
// and path, so that a build runs in parallel over files and an edit rebuilds only the files that include it.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "api.h"
#include "common/cuda_launch.h"

namespace legalpt {
namespace {

int processors(c10::DeviceIndex device) {
  int sms = 0;
  CudaLaunch::check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
}

// Selects the call's device while it lives; launches on its current stream.
struct CudaContext {
  c10::cuda::CUDAGuard guard;
  CudaLaunch launch;
  explicit CudaContext(const at::Device& device)
      : guard(device), launch{c10::cuda::getCurrentCUDAStream().stream(), processors(device.index())} {}
};

}  // namespace
}  // namespace legalpt

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { legalpt::api::bind<legalpt::CudaContext>(m); }
