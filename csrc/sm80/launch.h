// Host side of the FA2 path (mma.sync, sm80+): the grids and launches of the forward, the backward (with the split
// key tiles' sum and the deterministic dQ pass) and the backward's preprocessing, over a Problem, through a Launch
// policy (csrc/common/cuda_launch.h on a GPU, the CPU emulation's in csrc/emulated.cpp). csrc/instantiations/
// instantiates them per head dim, element type and mask generality; csrc/api.h chooses which one runs.
#pragma once

#include <stdexcept>
#include <string>

#include "../common/problem.h"
#include "bwd.cuh"
#include "fwd.cuh"

namespace legalpt::fa2 {

// The blocks of a 1-D grid with one per work item. The blocks step through the items by gridDim.x in int where the
// grid is persistent (csrc/sm90/launch.h), so blockIdx.x + gridDim.x must stay below 2^31.
inline unsigned grid_items(int64_t items, const std::string& kernel) {
  if (items >= (int64_t{1} << 30)) {
    throw std::runtime_error(kernel + ": " + std::to_string(items) +
                             " work items (tiles x documents x heads), at most 2^30 are supported; split the batch");
  }
  return static_cast<unsigned>(items);
}

// A forward's schedule must be built for its kernel's query tiles (`tiles` in csrc/api.h): one of other tiles would
// have the kernel visit the wrong keys.
inline void check_schedule(const Problem& pb, int m_tiles, int rows, const std::string& kernel) {
  if (pb.tile_rows != rows || pb.p.schedule.rows != m_tiles) {
    throw std::invalid_argument(kernel + ": counts holds a schedule of " + std::to_string(pb.p.schedule.rows) +
                                " query tiles of " + std::to_string(pb.tile_rows) + " rows; this kernel runs " +
                                std::to_string(m_tiles) + " tiles of " + std::to_string(rows) +
                                " rows: build the schedule for the tiles that tiles() names");
  }
}

template <typename T, int D, bool kGeneral, typename Launch>
void run_fwd(const Problem& pb, const Launch& launch) {
  using Tr = FwdTraits<T, D>;
  const dim3 grid((pb.p.seqlen_q + Tr::kBlockM - 1) / Tr::kBlockM, pb.documents, pb.p.heads);
  check_schedule(pb, grid.x, Tr::kBlockM, "fa2 forward");
  launch(fwd_kernel<T, D, kGeneral>, grid, Tr::kThreads, Tr::kSmem, pb.p);
}

// Adds the split key tiles' parts of dK and dV (dkv_split) into dk and dv, after either path's backward kernel.
template <typename T, int D, typename Launch>
void run_split_dkv(const Problem& pb, const Launch& launch) {
  if (pb.p.split_chunks <= 1) return;
  constexpr int kKeys = BwdTraits<__half, D>::kBlockN;
  launch(split_dkv_kernel<T, D>, dim3(pb.p.split_tiles * kKeys, pb.documents), 256, 0, pb.p);
}

// The deterministic dQ pass: one block per forward query tile, over the forward's schedule (pb.dq_schedule).
template <typename T, int D, bool kGeneral, typename Launch>
void run_dq(const Problem& pb, const Launch& launch) {
  using Tr = DqTraits<T, D>;
  Params p = pb.p;
  p.schedule = pb.dq_schedule;
  const dim3 grid((p.seqlen_q + Tr::kBlockM - 1) / Tr::kBlockM, pb.documents, p.heads);
  launch(dq_kernel<T, D, kGeneral>, grid, Tr::kThreads, Tr::kSmem, p);
}

template <typename T, int D, bool kGeneral, typename Launch>
void run_bwd(const Problem& pb, const Launch& launch) {
  using Tr = BwdTraits<T, D>;
  const dim3 grid(grid_items(int64_t{key_blocks<D>(pb.p)} * pb.documents * pb.kv_heads, "fa2 backward"));
  launch(bwd_kernel<T, D, kGeneral>, grid, Tr::kThreads, Tr::kSmem, pb.p);
  run_split_dkv<T, D>(pb, launch);
  if (pb.p.deterministic) run_dq<T, D, kGeneral>(pb, launch);
}

// The backward's preprocessing (delta, the logsumexp in log2, dq_accum zeroed) over `blocks` blocks of 256 threads;
// kVec: 16-byte reads, where every row starts 16-byte aligned and holds whole chunks of 8 (a.group lanes per pair).
template <typename T, bool kVec, typename Launch>
void run_prepare(const PrepArgs& a, int64_t blocks, const Launch& launch) {
  if (kVec) {
    launch(bwd_prep_kernel<T, 8, kPrepChunks>, dim3(static_cast<unsigned>(blocks)), kPrepThreads, 0, a);
  } else {
    launch(bwd_prep_kernel<T, 1, 1>, dim3(static_cast<unsigned>(blocks)), kPrepThreads, 0, a);
  }
}

}  // namespace legalpt::fa2
