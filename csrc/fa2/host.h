// Host side of the FA2 path for one head dimension (LEGALPT_HEAD_DIM, set by the build), shared by the CUDA build
// (fa2.cu) and the CPU emulation (emulated.cpp): turns the tensors that legalpt/attention/fa2.py has checked into
// Params and launches the kernels through a Launch policy, constructed with the device of the call, with an
// operator()(kernel, grid, threads, shared-memory bytes, arguments).
#pragma once

#include <torch/extension.h>

#include "bwd.cuh"
#include "fwd.cuh"
// The fa3 kernels are built where sm_90a is a target (LEGALPT_FA3, kernels.py) and in the CPU emulation.
#if defined(LEGALPT_FA3) || defined(LEGALPT_EMULATE)
#define LEGALPT_WITH_FA3
#include "../fa3/bwd.cuh"
#endif

#ifndef LEGALPT_HEAD_DIM
#error "build with -DLEGALPT_HEAD_DIM=<32|64|96|128|192|256>"
#endif

namespace legalpt::fa2::host {

constexpr int kHeadDim = LEGALPT_HEAD_DIM;

inline Tensor4 view(const at::Tensor& t) {  // (B, S, H, D) or (total, H, D)
  if (t.dim() == 4) return {t.data_ptr(), t.stride(0), t.stride(1), t.stride(2)};
  return {t.data_ptr(), 0, t.stride(0), t.stride(1)};
}

inline const int* optional_int_ptr(const std::optional<at::Tensor>& t) {
  return t.has_value() ? t->data_ptr<int>() : nullptr;
}

// Everything both directions read: inputs, documents, scaling, mask and schedule.
inline Params common_params(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& lse,
                            const std::optional<at::Tensor>& cu_q, const std::optional<at::Tensor>& cu_k,
                            int64_t max_q, int64_t max_k, const at::Tensor& counts, const at::Tensor& indices,
                            const std::optional<at::Tensor>& layout, std::vector<int64_t> mask, double scale,
                            double softcap) {
  Params p{};
  p.q = view(q);
  p.k = view(k);
  p.v = view(v);
  p.lse = lse.data_ptr<float>();
  const bool packed = q.dim() == 3;
  p.lse_batch_stride = packed ? 0 : lse.stride(0);
  p.lse_head_stride = packed ? lse.stride(0) : lse.stride(1);
  p.cu_seqlens_q = optional_int_ptr(cu_q);
  p.cu_seqlens_k = optional_int_ptr(cu_k);
  p.seqlen_q = static_cast<int>(max_q);
  p.seqlen_k = static_cast<int>(max_k);
  p.heads = static_cast<int>(q.size(-2));
  p.kv_group = static_cast<int>(q.size(-2) / k.size(-2));
  p.softcap = static_cast<float>(softcap);
  p.scale_log2 = static_cast<float>(scale * 1.4426950408889634);
  p.softcap_inv_scale = softcap > 0 ? static_cast<float>(scale / softcap) : 0.f;
  p.ds_scale = static_cast<float>(scale);
  // mask = [causal, left, right, global_tokens, dilation, layout_bq, layout_bk]
  p.mask.causal = static_cast<int>(mask[0]);
  p.mask.left = static_cast<int>(mask[1]);
  p.mask.right = static_cast<int>(mask[2]);
  p.mask.global_tokens = static_cast<int>(mask[3]);
  p.mask.dilation = static_cast<int>(mask[4]);
  p.mask.layout_bq = static_cast<int>(mask[5]);
  p.mask.layout_bk = static_cast<int>(mask[6]);
  if (layout.has_value()) {  // uint8 (Lb, Lh, nq, nk), contiguous
    p.mask.layout = layout->data_ptr<uint8_t>();
    p.mask.layout_stride_b = layout->size(0) > 1 ? layout->stride(0) : 0;
    p.mask.layout_stride_h = layout->size(1) > 1 ? layout->stride(1) : 0;
    p.mask.layout_stride_q = layout->stride(2);
  }
  p.schedule.counts = counts.data_ptr<int>();
  p.schedule.indices = indices.data_ptr<int>();
  p.schedule.stride_b = counts.size(0) > 1 ? counts.size(1) * counts.size(2) : 0;
  p.schedule.stride_h = counts.size(1) > 1 ? counts.size(2) : 0;
  p.schedule.cols = static_cast<int>(indices.size(3));
  return p;
}

template <typename T>
struct Tag {
  using type = T;
};

// Calls f(Tag<t's element type>): bf16 or fp16, the types the kernels are instantiated for.
template <typename F>
void by_type(const at::Tensor& t, F&& f) {
  if (t.scalar_type() == at::kBFloat16) {
    f(Tag<__nv_bfloat16>{});
  } else {
    f(Tag<__half>{});
  }
}

// Calls f(Tag<element type>, std::bool_constant<general>): the kernels are instantiated per element type and for
// general masks (softcap, dilation, block layout) and scales <= 0 apart from the rest (csrc/fa2/fwd.cuh says why).
template <typename F>
void dispatch(const at::Tensor& q, const Params& p, F&& f) {
  const bool general =
      p.softcap > 0.f || p.mask.dilation > 1 || p.mask.layout != nullptr || !(p.scale_log2 > 0.f);
  by_type(q, [&](auto tag) {
    if (general) {
      f(tag, std::true_type{});
    } else {
      f(tag, std::false_type{});
    }
  });
}

inline int documents(const at::Tensor& q, const std::optional<at::Tensor>& cu_q) {
  return static_cast<int>(cu_q.has_value() ? cu_q->size(0) - 1 : q.size(0));
}

#ifdef LEGALPT_WITH_FA3
// The fa3 kernels' TMA map of a (B, S, H, D) or packed (total, H, D) input, in boxes of box_rows rows. A size-1
// dimension's stride is never used to address, and PyTorch leaves it arbitrary even in a contiguous tensor; TMA
// wants every stride a multiple of 16 bytes, so it gets the extent of the dimensions inside it.
inline fa3::TensorMap tensor_map(const at::Tensor& t, int box_rows) {
  const bool packed = t.dim() == 3;
  const int64_t rows = packed ? t.size(0) : t.size(1), batches = packed ? 1 : t.size(0);
  const int64_t dims[4] = {t.size(-1), t.size(-2), rows, batches};
  int64_t strides[3] = {t.stride(-2), t.stride(-3), packed ? 0 : t.stride(0)};  // heads, rows, batches
  for (int d = 0; d < 3; ++d)
    if (dims[d + 1] == 1) strides[d] = d == 0 ? dims[0] : dims[d] * strides[d - 1];
  TORCH_CHECK(t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf || t.scalar_type() == at::kFloat,
              "fa3: TMA maps of bfloat16, float16 or float32 tensors, got ", t.scalar_type());
  const fa3::Element element = t.scalar_type() == at::kBFloat16 ? fa3::Element::kBf16
                               : t.scalar_type() == at::kHalf   ? fa3::Element::kF16
                                                                : fa3::Element::kF32;
  return fa3::make_tensor_map(t.data_ptr(), element, dims, strides, box_rows);
}
#endif

// Whether the fa3 kernels' items (query tiles in the forward, key tiles in the backward) all cost about alike, so
// that persistent blocks (one per processor, each taking every processor-th item) finish together: a sliding window
// without global tokens, layout or documents. Elsewhere (causal, varlen) the items' lengths differ by up to the whole
// sequence, and blocks that take every processor-th item in turn finish far apart (causal 16k: +50% forward time,
// session 11), so each item gets a block of its own, as in a plain grid.
inline bool balanced_items(const Params& p, bool varlen) {
  const bool window = p.mask.left >= 0 && (p.mask.causal || p.mask.right >= 0);
  return window && p.mask.global_tokens == 0 && p.mask.layout == nullptr && !varlen;
}

// The fa3 kernels' 1-D grid over their work items (tiles x documents x heads): one block per processor where
// persistent (balanced_items), else one per item. Checked before launch: the blocks step through the items by
// gridDim.x in int, so blockIdx.x + gridDim.x must stay below 2^31.
template <typename Launch>
dim3 item_grid(const Launch& launch, int64_t items, bool persistent, const char* kernel) {
  TORCH_CHECK(items < (int64_t{1} << 30), "fa3 ", kernel, ": ", items,
              " work items (tiles x documents x heads), at most 2^30 are supported; split the batch");
  return dim3(static_cast<unsigned>(persistent ? std::min<int64_t>(items, launch.processors()) : items));
}

// The forward: fa2's kernels (mma.sync, sm80+), or with kFa3 the Hopper ones (csrc/fa3, wgmma, sm90a) where the
// build has them for this head dim (kHasFa3).
#ifdef LEGALPT_WITH_FA3
constexpr bool kHasFa3 = kHeadDim == 64 || kHeadDim == 128;
#else
constexpr bool kHasFa3 = false;
#endif

template <typename Launch, bool kFa3 = false>
void forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor& out, at::Tensor& lse,
             const std::optional<at::Tensor>& cu_q, const std::optional<at::Tensor>& cu_k, int64_t max_q,
             int64_t max_k, const at::Tensor& counts, const at::Tensor& indices,
             const std::optional<at::Tensor>& layout, std::vector<int64_t> mask, double scale, double softcap) {
  TORCH_CHECK(q.size(-1) == kHeadDim, "fa2 extension for head_dim ", kHeadDim, " got ", q.size(-1));
  const Launch launch(q.device());
  Params p = common_params(q, k, v, lse, cu_q, cu_k, max_q, max_k, counts, indices, layout, mask, scale, softcap);
  p.o = view(out);
  dispatch(q, p, [&](auto tag, auto general) {
    using T = typename decltype(tag)::type;
    constexpr bool kGeneral = decltype(general)::value;
    if constexpr (kFa3 && kHasFa3) {
#ifdef LEGALPT_WITH_FA3
      using Tr = fa3::FwdTraits<T, kHeadDim>;
      const int m_tiles = static_cast<int>((max_q + Tr::kBlockM - 1) / Tr::kBlockM), docs = documents(q, cu_q);
      const fa3::FwdArgs args{p,
                              tensor_map(q, Tr::kBlockM),
                              tensor_map(k, Tr::kBlockN),
                              tensor_map(v, Tr::kBlockN),
                              tensor_map(out, Tr::kConsumerRows),
                              m_tiles,
                              docs};
      const dim3 grid =
          item_grid(launch, int64_t{m_tiles} * docs * p.heads, balanced_items(p, cu_q.has_value()), "forward");
      if (grid.x > 0) launch(fa3::fwd_kernel<T, kHeadDim, kGeneral>, grid, Tr::kThreads, Tr::kSmem, args);
#endif
    } else {
      using Tr = FwdTraits<T, kHeadDim>;
      const dim3 grid((max_q + Tr::kBlockM - 1) / Tr::kBlockM, documents(q, cu_q), p.heads);
      launch(fwd_kernel<T, kHeadDim, kGeneral>, grid, Tr::kThreads, Tr::kSmem, p);
    }
  });
}

// The backward: fa2's kernel, or with kFa3 the Hopper one (csrc/fa3) where the build has it; both over 128-key tiles.
template <typename Launch, bool kFa3 = false>
void backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
              const at::Tensor& lse_log2, const at::Tensor& delta, at::Tensor& dq_accum, at::Tensor& dk, at::Tensor& dv,
              const std::optional<at::Tensor>& cu_q, const std::optional<at::Tensor>& cu_k, int64_t max_q,
              int64_t max_k, const at::Tensor& counts, const at::Tensor& indices,
              const std::optional<at::Tensor>& layout, std::vector<int64_t> mask, double scale, double softcap,
              const at::Tensor& dq_counts, const at::Tensor& dq_indices, bool deterministic, int64_t split_tiles,
              int64_t split_chunks, const at::Tensor& dkv_split) {
  TORCH_CHECK(q.size(-1) == kHeadDim, "fa2 extension for head_dim ", kHeadDim, " got ", q.size(-1));
  const Launch launch(q.device());
  Params p =
      common_params(q, k, v, lse_log2, cu_q, cu_k, max_q, max_k, counts, indices, layout, mask, scale, softcap);
  p.o = view(dout);
  p.deterministic = deterministic;
  p.lse_log2 = lse_log2.data_ptr<float>();
  p.delta = delta.data_ptr<float>();
  p.dq_accum = view(dq_accum);
  p.dk = view(dk);
  p.dv = view(dv);
  p.split_tiles = static_cast<int>(split_tiles);
  p.split_chunks = static_cast<int>(split_chunks);
  p.dkv_split = view(dkv_split);
  constexpr int kKeys = BwdTraits<__half, kHeadDim>::kBlockN;
  const int key_blocks = (max_k + kKeys - 1) / kKeys + p.split_tiles * (p.split_chunks - 1);
  dispatch(q, p, [&](auto tag, auto general) {
    using T = typename decltype(tag)::type;
    constexpr bool kGeneral = decltype(general)::value;
    if constexpr (kFa3 && kHasFa3) {
#ifdef LEGALPT_WITH_FA3
      using Tr = fa3::BwdTraits<T, kHeadDim>;
      static_assert(Tr::kBlockN == kKeys, "split_dkv_kernel and the grid assume fa2's key tiles");
      const fa3::BwdArgs args{p,
                              tensor_map(q, Tr::kBlockM),
                              tensor_map(dout, Tr::kBlockM),
                              tensor_map(k, Tr::kBlockN),
                              tensor_map(v, Tr::kBlockN),
                              tensor_map(dk, Tr::kBlockN),
                              tensor_map(dv, Tr::kBlockN),
                              tensor_map(dq_accum, Tr::kBlockM),
                              key_blocks,
                              documents(q, cu_q)};
      // Persistent where the key tiles cost alike: the next item's K, V, Q and dO load while this one's last tile
      // and its dK, dV store run
      const dim3 grid = item_grid(launch, int64_t{key_blocks} * args.documents * k.size(-2),
                                  balanced_items(p, cu_q.has_value()), "backward");
      if (grid.x > 0) launch(fa3::bwd_kernel<T, kHeadDim, kGeneral>, grid, Tr::kThreads, Tr::kSmem, args);
#endif
    } else {
      using Tr = BwdTraits<T, kHeadDim>;
      const dim3 grid(key_blocks, documents(q, cu_q), k.size(-2));
      launch(bwd_kernel<T, kHeadDim, kGeneral>, grid, Tr::kThreads, Tr::kSmem, p);
    }
    if (p.split_chunks > 1) {
      launch(split_dkv_kernel<T, kHeadDim>, dim3(p.split_tiles * kKeys, documents(q, cu_q)), 256, 0, p);
    }
  });
  if (!deterministic) return;
  // dQ over the forward schedule (dq_counts, dq_indices: the forward's tiles)
  Params pq = common_params(q, k, v, lse_log2, cu_q, cu_k, max_q, max_k, dq_counts, dq_indices, layout, mask,
                            scale, softcap);
  pq.o = p.o;
  pq.lse_log2 = p.lse_log2;
  pq.delta = p.delta;
  pq.dq_accum = p.dq_accum;
  constexpr int kDqRows = DqTraits<__half, kHeadDim>::kBlockM;
  const dim3 dq_grid((max_q + kDqRows - 1) / kDqRows, documents(q, cu_q), p.heads);
  dispatch(q, pq, [&](auto tag, auto general) {
    using T = typename decltype(tag)::type;
    using Tr = DqTraits<T, kHeadDim>;
    launch(dq_kernel<T, kHeadDim, decltype(general)::value>, dq_grid, Tr::kThreads, Tr::kSmem, pq);
  });
}

template <typename Launch>
void prepare(const at::Tensor& out, const at::Tensor& dout, const at::Tensor& lse,
             const std::optional<at::Tensor>& dlse, at::Tensor& lse_log2, at::Tensor& delta, at::Tensor& dq_accum) {
  TORCH_CHECK(dq_accum.scalar_type() == at::kFloat && dq_accum.is_contiguous() && dq_accum.numel() % 4 == 0 &&
                  reinterpret_cast<uintptr_t>(dq_accum.data_ptr()) % 16 == 0,
              "prepare: dq_accum must be contiguous float32 of whole 16-byte chunks");
  const Launch launch(out.device());
  const bool packed = out.dim() == 3;
  PrepArgs a{};
  a.out = view(out);
  a.dout = view(dout);
  a.lse = lse.data_ptr<float>();
  a.dlse = dlse.has_value() ? dlse->data_ptr<float>() : nullptr;
  a.lse_log2 = lse_log2.data_ptr<float>();
  a.delta = delta.data_ptr<float>();
  a.lse_batch_stride = packed ? 0 : lse.stride(0);
  a.lse_head_stride = packed ? lse.stride(0) : lse.stride(1);
  a.seqlen_q = packed ? 0 : static_cast<int>(out.size(1));
  a.rows = static_cast<int>(packed ? out.size(0) : out.size(0) * out.size(1));
  a.heads = static_cast<int>(out.size(-2));
  a.head_dim = static_cast<int>(out.size(-1));
  a.dq_accum = reinterpret_cast<float4*>(dq_accum.data_ptr<float>());
  a.dq_chunks = dq_accum.numel() / 4;
  // 16-byte reads where every row starts 16-byte aligned and holds whole chunks of 8
  const auto aligned = [](const at::Tensor& t) {
    bool ok = t.size(-1) % 8 == 0 && reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
    for (int d = 0; d < t.dim() - 1; ++d) ok = ok && (t.size(d) == 1 || t.stride(d) % 8 == 0);
    return ok;
  };
  const bool vec = aligned(out) && aligned(dout);
  constexpr int kChunks = 2;  // chunks of 8 per lane where the rows are aligned
  a.group = 32;
  while (vec && a.group > 1 && a.group / 2 * 8 * kChunks >= a.head_dim) a.group /= 2;  // the fewest lanes for that
  constexpr int kThreads = 256;
  const int64_t pairs = (static_cast<int64_t>(a.rows) + kPrepRows - 1) / kPrepRows * kPrepRows * a.heads;
  const int64_t blocks = (pairs * a.group + kThreads - 1) / kThreads;
  if (blocks == 0) return;
  const dim3 grid(static_cast<unsigned>(blocks));
  by_type(out, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (vec) {
      launch(bwd_prep_kernel<T, 8, kChunks>, grid, kThreads, 0, a);
    } else {
      launch(bwd_prep_kernel<T, 1, 1>, grid, kThreads, 0, a);
    }
  });
}

// The attributes Python reads: the head dim and the tiles the schedules must be built for.
inline void add_attributes(pybind11::module& m) {
  using Fwd = FwdTraits<__half, kHeadDim>;
  using Bwd = BwdTraits<__half, kHeadDim>;
  m.attr("head_dim") = kHeadDim;
  m.attr("fwd_tile") = pybind11::make_tuple(Fwd::kBlockM, Fwd::kBlockN);  // (query rows, keys) per forward tile
  m.attr("bwd_tile") = pybind11::make_tuple(Bwd::kBlockM, Bwd::kBlockN);  // (query rows, keys) per backward tile
  // (query rows, keys) of forward_fa3's and backward_fa3's tiles: the Hopper kernels' where built, else fa2's
#ifdef LEGALPT_WITH_FA3
  using Fa3Fwd = fa3::FwdTraits<__half, kHeadDim>;
  using Fa3Bwd = fa3::BwdTraits<__half, kHeadDim>;
  m.attr("fa3_fwd_tile") = kHasFa3 ? pybind11::make_tuple(Fa3Fwd::kBlockM, Fa3Fwd::kBlockN) : m.attr("fwd_tile");
  m.attr("fa3_bwd_tile") = kHasFa3 ? pybind11::make_tuple(Fa3Bwd::kBlockM, Fa3Bwd::kBlockN) : m.attr("bwd_tile");
#else
  m.attr("fa3_fwd_tile") = m.attr("fwd_tile");
  m.attr("fa3_bwd_tile") = m.attr("bwd_tile");
#endif
}

}  // namespace legalpt::fa2::host
