// Host side of the FA3 path (wgmma and TMA, sm90a): the tensor maps, the 1-D grids over work items and the launches
// of the forward and backward over a Problem, through a Launch policy (as csrc/sm80/launch.h), and of the FP8
// forward's quantization. The backward's split key tiles and deterministic dQ pass are the FA2 path's. Instantiated
// at head dims 64 and 128.
#pragma once

#include <algorithm>
#include <stdexcept>
#include <string>

#include "../sm80/launch.h"
#include "bwd.cuh"
#include "fwd.cuh"
#include "quantize.cuh"

namespace legalpt::fa3 {

inline TensorMap tensor_map(const TensorDesc& t, int box_rows) {
  return make_tensor_map(t.ptr, t.element, t.dims, t.strides, box_rows);
}

// Whether the items (query tiles in the forward, key tiles in the backward) all cost about alike, so that persistent
// blocks (one per processor, each taking every processor-th item) finish together: a sliding window without global
// tokens, layout or documents. Elsewhere (causal, varlen) the items' lengths differ by up to the whole sequence, and
// blocks that take every processor-th item in turn finish far apart (causal 16k: +50% forward time), so each item
// gets a block of its own, as in a plain grid.
inline bool balanced_items(const Problem& pb) {
  const MaskParams& m = pb.p.mask;
  const bool window = m.left >= 0 && (m.causal || m.right >= 0);
  return window && m.global_tokens == 0 && m.layout == nullptr && !pb.varlen;
}

// The 1-D grid over the work items (tiles x documents x heads): one block per processor where persistent
// (balanced_items), else one per item.
template <typename Launch>
dim3 item_grid(const Launch& launch, int64_t items, bool persistent, const char* kernel) {
  const unsigned blocks = fa2::grid_items(items, std::string("fa3 ") + kernel);
  return dim3(persistent ? std::min(blocks, static_cast<unsigned>(launch.processors())) : blocks);
}

template <typename T, int D, bool kGeneral, typename Launch>
void run_fwd(const Problem& pb, const Launch& launch) {
  using Tr = FwdTraits<T, D, T, kGeneral>;
  const int m_tiles = (pb.p.seqlen_q + Tr::kBlockM - 1) / Tr::kBlockM;
  fa2::check_schedule(pb, m_tiles, Tr::kBlockM, "fa3 forward");
  const FwdArgs args{pb.p,
                     tensor_map(pb.q, Tr::kBlockM),
                     tensor_map(pb.k, Tr::kBlockN),
                     tensor_map(pb.v, Tr::kBlockN),
                     tensor_map(pb.o, Tr::kConsumerRows),
                     m_tiles,
                     pb.documents,
                     {}};
  const dim3 grid = item_grid(launch, int64_t{m_tiles} * pb.documents * pb.p.heads, balanced_items(pb), "forward");
  if (grid.x > 0) launch(fwd_kernel<T, D, kGeneral>, grid, Tr::kThreads, Tr::kSmem, args);
}

// The FP8 forward (fwd_kernel with e4m3 inputs, plain masks, equal-length rows): pb's q and k in e4m3, its v V^T
// ((B, D, Hk, keys): rows D, heads Hk, the keys along the lines, its strides increasing as TMA maps' do), o in TO.
template <typename TO, int D, typename Launch>
void run_fwd_fp8(const Problem& pb, const Fp8Scales& scales, const Launch& launch) {
  using Tr = FwdTraits<e4m3, D, TO>;
  const int m_tiles = (pb.p.seqlen_q + Tr::kBlockM - 1) / Tr::kBlockM;
  fa2::check_schedule(pb, m_tiles, Tr::kBlockM, "fa3 FP8 forward");
  const FwdArgs args{pb.p,
                     tensor_map(pb.q, Tr::kBlockM),
                     tensor_map(pb.k, Tr::kBlockN),
                     tensor_map(pb.v, D),
                     tensor_map(pb.o, Tr::kConsumerRows),
                     m_tiles,
                     pb.documents,
                     scales};
  const dim3 grid =
      item_grid(launch, int64_t{m_tiles} * pb.documents * pb.p.heads, balanced_items(pb), "FP8 forward");
  if (grid.x > 0) launch(fwd_kernel<e4m3, D, false, TO>, grid, Tr::kThreads, Tr::kSmem, args);
}

// The FP8 forward's quantization (quantize.cuh) of T inputs: Q's and K's row blocks, V's amax, then V^T's key tiles.
template <typename T, typename Launch>
void run_quantize(const Fp8Quantize& job, const Launch& launch) {
  for (const QuantizeArgs* rows : {&job.q, &job.k, &job.v_amax}) {
    const int64_t blocks = int64_t{rows->blocks} * job.batch;  // the batch on grid.x (quantize_qk)
    if (blocks > 0 && rows->heads > 0) {
      launch(quantize_qk<T>, dim3(static_cast<unsigned>(blocks), rows->heads), kQuantThreads, kQuantSmem, *rows);
    }
  }
  const int64_t tiles = int64_t{job.v.keys / kQuantRows} * job.batch;
  if (tiles > 0 && job.v.heads > 0) {
    launch(quantize_vt<T>, dim3(static_cast<unsigned>(tiles), job.v.heads), kQuantThreads, 0, job.v);
  }
}

template <typename T, int D, bool kGeneral, typename Launch>
void run_bwd(const Problem& pb, const Launch& launch) {
  using Tr = BwdTraits<T, D>;
  static_assert(Tr::kBlockN == fa2::BwdTraits<T, D>::kBlockN, "split_dkv_kernel and the grid assume fa2's key tiles");
  const BwdArgs args{pb.p,
                     tensor_map(pb.q, Tr::kBlockM),
                     tensor_map(pb.o, Tr::kBlockM),
                     tensor_map(pb.k, Tr::kBlockN),
                     tensor_map(pb.v, Tr::kBlockN),
                     tensor_map(pb.dk, Tr::kBlockN),
                     tensor_map(pb.dv, Tr::kBlockN),
                     tensor_map(pb.dq_accum, Tr::kBlockM),
                     fa2::key_blocks<D>(pb.p),
                     pb.documents};
  // Persistent where the key tiles cost alike: the next item's Q and dO load while this one's last tile and its dK,
  // dV store run (its K and V once this item's MMAs are done: one buffer)
  const dim3 grid =
      item_grid(launch, int64_t{args.key_blocks} * pb.documents * pb.kv_heads, balanced_items(pb), "backward");
  if (grid.x > 0) launch(bwd_kernel<T, D, kGeneral>, grid, Tr::kThreads, Tr::kSmem, args);
  fa2::run_split_dkv<T, D>(pb, launch);
  if (pb.p.deterministic) fa2::run_dq<T, D, kGeneral>(pb, launch);
}

}  // namespace legalpt::fa3
