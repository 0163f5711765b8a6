// The CPU emulation build of the FA2 and FA3 paths (csrc/common/emulate.h says how it works): the kernels and host
// code of the CUDA build, run on CPU tensors, so that tests can check the kernels' index math, masks and barriers
// without a GPU (tests/attention/test_fa2_emulated.py). Built by legalpt.attention.kernels.fa2_emulated.
#ifndef LEGALPT_EMULATE
#error "build with -DLEGALPT_EMULATE"
#endif

#include "host.h"

namespace legalpt::fa2 {

alignas(16) unsigned char smem[227 * 1024];  // the shared memory of the one block that runs at a time

namespace {

struct EmulatedLaunch {
  explicit EmulatedLaunch(const at::Device& device) {
    TORCH_CHECK(device.is_cpu(), "the emulated fa2 kernels take CPU tensors, got ", device);
  }

  // Three, so that the persistent kernels' blocks take several items each, and a grid of fewer blocks than items
  // is exercised.
  int processors() const { return 3; }

  template <typename Args>
  void operator()(void (*kernel)(Args), dim3 grid, int threads, int smem_bytes, const Args& args) const {
    TORCH_CHECK(smem_bytes <= static_cast<int>(sizeof(smem)), "shared memory: ", smem_bytes, " bytes requested");
    emu::launch(kernel, grid, threads, args);
  }
};

}  // namespace
}  // namespace legalpt::fa2

namespace legalpt::fa3 {
alignas(1024) unsigned char smem_raw[227 * 1024];  // the fa3 kernels' (wgmma.cuh decodes addresses within it)
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using legalpt::fa2::EmulatedLaunch;
  namespace host = legalpt::fa2::host;
  host::add_attributes(m);
  m.def("forward", &host::forward<EmulatedLaunch>, "FA2 attention forward, emulated on the CPU");
  m.def("prepare", &host::prepare<EmulatedLaunch>, "backward preprocessing, emulated on the CPU");
  m.def("backward", &host::backward<EmulatedLaunch>, "FA2 attention backward, emulated on the CPU");
  m.def("forward_fa3", &host::forward<EmulatedLaunch, true>, "the Hopper forward (d64, d128), emulated on the CPU");
  m.def("backward_fa3", &host::backward<EmulatedLaunch, true>, "the Hopper backward (d64, d128), emulated");
}
