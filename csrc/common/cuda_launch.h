// The CUDA launch policy of the host code (csrc/sm80/launch.h, csrc/sm90/launch.h): a stream and the device's SM
// count, taken by csrc/api.cu from the call's device. The CPU emulation has its own (csrc/emulated.cpp).
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace legalpt {

struct CudaLaunch {
  cudaStream_t stream;
  int sms;  // the persistent kernels' grid

  int processors() const { return sms; }

  template <typename Args>
  void operator()(void (*kernel)(Args), dim3 grid, int threads, int smem, const Args& args) const {
    if (smem > 48 * 1024) check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    kernel<<<grid, threads, smem, stream>>>(args);
    check(cudaGetLastError());
  }

  static void check(cudaError_t status) {
    if (status != cudaSuccess) throw std::runtime_error(std::string("CUDA error: ") + cudaGetErrorString(status));
  }
};

}  // namespace legalpt
