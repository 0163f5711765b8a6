// The extension's Python functions, shared by the CUDA build (api.cu) and the CPU emulation (emulated.cpp): they turn
// the tensors that legalpt/attention/backends/cuda.py has checked into one Problem (Params once), choose the
// instantiation by head dim, element type, mask generality and path, and run it through the build's Context (the
// call's device selected and its launch policy).
//
// The head dims built are those defined as LEGALPT_HDIM_<d> (setup.py, legalpt/attention/build.py), and the sm90
// path is built with LEGALPT_SM90. The run functions are templates of csrc/sm80/launch.h and csrc/sm90/launch.h:
// the CUDA build links their explicit instantiations (csrc/instantiations/), the emulation includes them.
#pragma once

#include <torch/extension.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <tuple>
#include <type_traits>
#include <vector>

#include "common/problem.h"
#include "sm80/bwd.cuh"
#include "sm80/fwd.cuh"
#ifdef LEGALPT_SM90
#include "sm90/bwd.cuh"
#include "sm90/fwd.cuh"
#include "sm90/quantize.cuh"
#endif

namespace legalpt {

namespace fa2 {
template <typename T, int D, bool kGeneral, typename Launch>
void run_fwd(const Problem& pb, const Launch& launch);
template <typename T, int D, bool kGeneral, typename Launch>
void run_bwd(const Problem& pb, const Launch& launch);
template <typename T, bool kVec, typename Launch>
void run_prepare(const PrepArgs& a, int64_t blocks, const Launch& launch);
}  // namespace fa2
namespace fa3 {
template <typename T, int D, bool kGeneral, typename Launch>
void run_fwd(const Problem& pb, const Launch& launch);
#ifdef LEGALPT_SM90
template <typename TO, int D, typename Launch>
void run_fwd_fp8(const Problem& pb, const Fp8Scales& scales, const Launch& launch);
template <typename T, typename Launch>
void run_quantize(const Fp8Quantize& job, const Launch& launch);
#endif
template <typename T, int D, bool kGeneral, typename Launch>
void run_bwd(const Problem& pb, const Launch& launch);
}  // namespace fa3

namespace api {

using OptTensor = std::optional<at::Tensor>;

// The head dims this build instantiates, ascending.
inline std::vector<int> head_dims() {
  std::vector<int> dims;
#ifdef LEGALPT_HDIM_32
  dims.push_back(32);
#endif
#ifdef LEGALPT_HDIM_64
  dims.push_back(64);
#endif
#ifdef LEGALPT_HDIM_96
  dims.push_back(96);
#endif
#ifdef LEGALPT_HDIM_128
  dims.push_back(128);
#endif
#ifdef LEGALPT_HDIM_192
  dims.push_back(192);
#endif
#ifdef LEGALPT_HDIM_256
  dims.push_back(256);
#endif
  return dims;
}

#ifdef LEGALPT_SM90
constexpr bool kSm90 = true;
#else
constexpr bool kSm90 = false;
#endif
// Whether the sm90 path has kernels at head dim D (elsewhere its calls run the sm80 path's).
template <int D>
constexpr bool kHasSm90 = kSm90 && (D == 64 || D == 128);

// Calls f(std::integral_constant<int, d>) for a head dim this build instantiates.
template <typename F>
void by_head_dim(int64_t d, F&& f) {
  switch (d) {
#ifdef LEGALPT_HDIM_32
    case 32: return f(std::integral_constant<int, 32>{});
#endif
#ifdef LEGALPT_HDIM_64
    case 64: return f(std::integral_constant<int, 64>{});
#endif
#ifdef LEGALPT_HDIM_96
    case 96: return f(std::integral_constant<int, 96>{});
#endif
#ifdef LEGALPT_HDIM_128
    case 128: return f(std::integral_constant<int, 128>{});
#endif
#ifdef LEGALPT_HDIM_192
    case 192: return f(std::integral_constant<int, 192>{});
#endif
#ifdef LEGALPT_HDIM_256
    case 256: return f(std::integral_constant<int, 256>{});
#endif
    default: TORCH_CHECK(false, "legalpt kernels: head_dim ", d, " is not built (set LEGALPT_HEAD_DIMS and reinstall)");
  }
}

template <typename T>
struct Tag {
  using type = T;
};

// Calls f(Tag<t's element type>): bf16 or fp16, the types the kernels are instantiated for.
template <typename F>
void by_type(const at::Tensor& t, F&& f) {
  TORCH_CHECK(t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf,
              "legalpt kernels: bfloat16 or float16 inputs, got ", t.scalar_type());
  if (t.scalar_type() == at::kBFloat16) {
    f(Tag<__nv_bfloat16>{});
  } else {
    f(Tag<__half>{});
  }
}

// Whether a call takes the kernels of general masks (softcap, dilation, block layout) and scales <= 0, which are
// instantiated apart from the rest (csrc/sm80/fwd.cuh says why); scale_log2: the softmax scale times log2(e)
// (log2_scale), as the kernels read it.
inline bool general_mask(float softcap, int dilation, bool layout, float scale_log2) {
  return softcap > 0.f || dilation > 1 || layout || !(scale_log2 > 0.f);
}
inline float log2_scale(double scale) { return static_cast<float>(scale * 1.4426950408889634); }

// Calls f(Tag<element type>, head dim, std::bool_constant<general>): the kernels are instantiated per element type,
// head dim and general_mask.
template <typename F>
void dispatch(const at::Tensor& q, const Params& p, F&& f) {
  const bool general = general_mask(p.softcap, p.mask.dilation, p.mask.layout != nullptr, p.scale_log2);
  by_head_dim(q.size(-1), [&](auto dim) {
    by_type(q, [&](auto tag) {
      if (general) {
        f(tag, dim, std::true_type{});
      } else {
        f(tag, dim, std::false_type{});
      }
    });
  });
}

inline Tensor4 view(const at::Tensor& t) {  // (B, S, H, D) or (total, H, D)
  if (t.dim() == 4) return {t.data_ptr(), t.stride(0), t.stride(1), t.stride(2)};
  return {t.data_ptr(), 0, t.stride(0), t.stride(1)};
}

inline const int* optional_int_ptr(const OptTensor& t) { return t.has_value() ? t->data_ptr<int>() : nullptr; }

// A (B, S, H, D) or packed (total, H, D) tensor as the sm90 path's TMA maps see it. A size-1 dimension's stride is
// never used to address, and PyTorch leaves it arbitrary even in a contiguous tensor; TMA wants every stride a
// multiple of 16 bytes, so it gets the extent of the dimensions inside it.
inline TensorDesc describe(const at::Tensor& t) {
  const bool packed = t.dim() == 3;
  const int64_t rows = packed ? t.size(0) : t.size(1), batches = packed ? 1 : t.size(0);
  TensorDesc desc{t.data_ptr(), Element::kF32, {t.size(-1), t.size(-2), rows, batches},
                  {t.stride(-2), t.stride(-3), packed ? 0 : t.stride(0)}};
  for (int d = 0; d < 3; ++d)
    if (desc.dims[d + 1] == 1) desc.strides[d] = d == 0 ? desc.dims[0] : desc.dims[d] * desc.strides[d - 1];
  const at::ScalarType type = t.scalar_type();
  TORCH_CHECK(type == at::kBFloat16 || type == at::kHalf || type == at::kFloat || type == at::kFloat8_e4m3fn,
              "fa3: TMA maps of bfloat16, float16, float32 or float8_e4m3fn tensors, got ", type);
  if (type == at::kBFloat16) desc.element = Element::kBf16;
  if (type == at::kHalf) desc.element = Element::kF16;
  if (type == at::kFloat8_e4m3fn) desc.element = Element::kE4m3;
  return desc;
}

inline Schedule schedule(const at::Tensor& counts, const at::Tensor& indices) {
  Schedule s{};
  s.counts = counts.data_ptr<int>();
  s.indices = indices.data_ptr<int>();
  s.stride_b = counts.size(0) > 1 ? counts.size(1) * counts.size(2) : 0;
  s.stride_h = counts.size(1) > 1 ? counts.size(2) : 0;
  s.cols = static_cast<int>(indices.size(3));
  s.rows = static_cast<int>(counts.size(2));
  return s;
}

// Everything both directions read: inputs, documents, scaling, mask and schedule.
inline Problem problem(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& lse,
                       const OptTensor& cu_q, const OptTensor& cu_k, int64_t max_q, int64_t max_k,
                       const at::Tensor& counts, const at::Tensor& indices, const OptTensor& layout,
                       const std::vector<int64_t>& mask, double scale, double softcap) {
  TORCH_CHECK(mask.size() == 7, "mask: [causal, left, right, global_tokens, dilation, layout_bq, layout_bk]");
  Problem pb{};
  Params& p = pb.p;
  p.q = view(q);
  p.k = view(k);
  p.v = view(v);
  p.lse = lse.data_ptr<float>();
  pb.varlen = q.dim() == 3;
  p.lse_batch_stride = pb.varlen ? 0 : lse.stride(0);
  p.lse_head_stride = pb.varlen ? lse.stride(0) : lse.stride(1);
  p.cu_seqlens_q = optional_int_ptr(cu_q);
  p.cu_seqlens_k = optional_int_ptr(cu_k);
  p.seqlen_q = static_cast<int>(max_q);
  p.seqlen_k = static_cast<int>(max_k);
  p.heads = static_cast<int>(q.size(-2));
  p.kv_group = static_cast<int>(q.size(-2) / k.size(-2));
  p.softcap = static_cast<float>(softcap);
  p.scale_log2 = log2_scale(scale);
  p.softcap_inv_scale = softcap > 0 ? static_cast<float>(scale / softcap) : 0.f;
  p.ds_scale = static_cast<float>(scale);
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
  p.schedule = schedule(counts, indices);
  pb.q = describe(q);
  pb.k = describe(k);
  pb.v = describe(v);
  pb.documents = static_cast<int>(cu_q.has_value() ? cu_q->size(0) - 1 : q.size(0));
  pb.kv_heads = static_cast<int>(k.size(-2));
  return pb;
}

// The forward: writes out and lse. sm90: the FA3 path where this build has it at q's head dim, else the FA2 path.
// counts and indices: the schedule of query tiles of tile_rows rows, which must be the kernel's (`tiles`).
template <typename Context>
void forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor& out, at::Tensor& lse,
             const OptTensor& cu_q, const OptTensor& cu_k, int64_t max_q, int64_t max_k, const at::Tensor& counts,
             const at::Tensor& indices, int64_t tile_rows, const OptTensor& layout, const std::vector<int64_t>& mask,
             double scale, double softcap, bool sm90) {
  const Context context(q.device());
  Problem pb = problem(q, k, v, lse, cu_q, cu_k, max_q, max_k, counts, indices, layout, mask, scale, softcap);
  pb.tile_rows = static_cast<int>(tile_rows);
  pb.p.o = view(out);
  pb.o = describe(out);
  dispatch(q, pb.p, [&](auto tag, auto dim, auto general) {
    using T = typename decltype(tag)::type;
    constexpr int D = decltype(dim)::value;
    constexpr bool kGeneral = decltype(general)::value;
    if constexpr (kHasSm90<D>) {
      if (sm90) return fa3::run_fwd<T, D, kGeneral>(pb, context.launch);
    }
    fa2::run_fwd<T, D, kGeneral>(pb, context.launch);
  });
}

#if defined(LEGALPT_HDIM_128) && defined(LEGALPT_SM90)
// The FP8 forward (csrc/sm90/fwd.cuh with e4m3 inputs; legalpt/attention/fp8.py lays its inputs out): q (B, Sq, H,
// 128) and k (B, Sk, Hk, 128) in e4m3, vt (B, 128, Hk, keys) V^T in e4m3 with its keys permuted within each 16 and
// padded to whole tiles, their float32 scales (q_scale (B, H, q blocks), k_scale (B, Hk, k blocks), v_scale (B,
// Hk)); writes out (bf16 or fp16, like q) and lse. Plain masks only (no softcap, dilation or layout).
template <typename Context>
void forward_fp8(const at::Tensor& q, const at::Tensor& k, const at::Tensor& vt, at::Tensor& out, at::Tensor& lse,
                 const at::Tensor& q_scale, const at::Tensor& k_scale, const at::Tensor& v_scale,
                 const at::Tensor& counts, const at::Tensor& indices, int64_t tile_rows,
                 const std::vector<int64_t>& mask, double scale) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && vt.dim() == 4, "forward_fp8: (B, S, H, D) q and k, (B, D, Hk, keys) vt");
  for (const at::Tensor* t : {&q, &k, &vt})
    TORCH_CHECK(t->scalar_type() == at::kFloat8_e4m3fn && t->device() == q.device(),
                "forward_fp8: q, k, vt in float8_e4m3fn on one device");
  TORCH_CHECK(q.size(-1) == 128 && k.size(-1) == 128 && vt.size(1) == 128, "forward_fp8: head dim 128");
  TORCH_CHECK(vt.size(0) == q.size(0) && vt.size(2) == k.size(2) && vt.size(3) % 128 == 0 && vt.size(3) >= k.size(1),
              "forward_fp8: vt (B, 128, Hk, keys padded to whole tiles of 128)");
  const int64_t q_blocks = (q.size(1) + 127) / 128, k_blocks = (k.size(1) + 127) / 128;
  for (const auto& [t, blocks, heads] : {std::tuple{&q_scale, q_blocks, q.size(2)}, {&k_scale, k_blocks, k.size(2)}})
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->is_contiguous() && t->dim() == 3 && t->size(0) == q.size(0) &&
                    t->size(1) == heads && t->size(2) == blocks,
                "forward_fp8: contiguous float32 scales (B, heads, tiles of 128 rows)");
  TORCH_CHECK(v_scale.scalar_type() == at::kFloat && v_scale.is_contiguous() && v_scale.dim() == 2 &&
                  v_scale.size(0) == q.size(0) && v_scale.size(1) == k.size(2),
              "forward_fp8: contiguous float32 v_scale (B, Hk)");
  TORCH_CHECK(mask.size() == 7 && mask[3] == 0 && mask[4] == 1, "forward_fp8: no global tokens or dilation");
  const Context context(q.device());
  Problem pb = problem(q, k, k, lse, std::nullopt, std::nullopt, q.size(1), k.size(1), counts, indices, std::nullopt,
                       mask, scale, 0.0);
  pb.tile_rows = static_cast<int>(tile_rows);
  pb.v = describe(vt);  // as (B, S, H, D): rows D, heads Hk, the keys along the lines
  pb.p.o = view(out);
  pb.o = describe(out);
  const fa3::Fp8Scales scales{q_scale.data_ptr<float>(), k_scale.data_ptr<float>(), v_scale.data_ptr<float>(),
                              static_cast<int>(q_scale.size(2)), static_cast<int>(k_scale.size(2))};
  by_type(out, [&](auto tag) { fa3::run_fwd_fp8<typename decltype(tag)::type, 128>(pb, scales, context.launch); });
}
#endif

#if defined(LEGALPT_HDIM_128) && defined(LEGALPT_SM90)
// t (B, S, H, 128) in bf16 or fp16 as the quantization kernels read it: vector loads from 16-byte aligned rows.
inline void check_quantize_input(const at::Tensor& t, const char* name, const at::Tensor& q) {
  TORCH_CHECK(t.dim() == 4 && t.size(3) == 128, "quantize_fp8: ", name, " must be (B, S, H, 128), got ", t.sizes());
  TORCH_CHECK(t.scalar_type() == q.scalar_type() && t.device() == q.device(), "quantize_fp8: ", name,
              " must be ", q.scalar_type(), " on ", q.device(), " (as q), got ", t.scalar_type(), " on ", t.device());
  bool aligned = t.stride(3) == 1 && reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
  for (int d = 0; d < 3; ++d) aligned = aligned && (t.size(d) == 1 || t.stride(d) % 8 == 0);  // 1: unused
  TORCH_CHECK(aligned, "quantize_fp8: ", name, " must have a contiguous last dimension and 16-byte aligned rows");
}

// A buffer of the quantization (its outputs and factors): contiguous, 16-byte aligned (the kernels' vector
// accesses), of this type and shape, on q's device.
inline void check_quantize_buffer(const at::Tensor& t, const char* name, at::ScalarType type,
                                  at::IntArrayRef sizes, const at::Tensor& q) {
  TORCH_CHECK(t.scalar_type() == type && t.sizes() == sizes && t.is_contiguous() && t.device() == q.device() &&
                  reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0,
              "quantize_fp8: ", name, " must be contiguous, 16-byte aligned ", type, " of shape ", sizes, " on ",
              q.device(), ", got ", t.scalar_type(), " of shape ", t.sizes(), " on ", t.device());
}

// The FP8 forward's inputs from bf16 or fp16 ones (csrc/sm90/quantize.cuh; legalpt/attention/fp8.py's
// kernel_quantize): q (B, Sq, H, 128), k and v (B, Sk, Hk, 128), factors (128,) float32 (the incoherence matrix's
// first row) or None for no rotation. Writes q8 and k8 (e4m3, q's and k's shapes), their scales q_scale (B, H, q
// blocks) and k_scale (B, Hk, k blocks), vt (B, 128, Hk, keys padded to whole tiles) in e4m3 and its scales v_scale
// (B, Hk) float32, as forward_fp8 reads them.
template <typename Context>
void quantize_fp8(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const OptTensor& factors,
                  at::Tensor& q8, at::Tensor& k8, at::Tensor& vt, at::Tensor& q_scale, at::Tensor& k_scale,
                  at::Tensor& v_scale) {
  TORCH_CHECK(q.scalar_type() == at::kBFloat16 || q.scalar_type() == at::kHalf,
              "quantize_fp8: q must be bfloat16 or float16, got ", q.scalar_type());
  check_quantize_input(q, "q", q);
  check_quantize_input(k, "k", q);
  check_quantize_input(v, "v", q);
  TORCH_CHECK(k.size(0) == q.size(0) && v.sizes() == k.sizes(), "quantize_fp8: k and v (B, Sk, Hk, 128) with q's B");
  // V's scales are written by its key tiles: a head without keys would leave them unwritten
  TORCH_CHECK(q.size(0) > 0 && q.size(1) > 0 && q.size(2) > 0 && k.size(1) > 0 && k.size(2) > 0,
              "quantize_fp8: q and k need a batch row, a row and a head, got ", q.sizes(), " and ", k.sizes());
  const int64_t batch = q.size(0), seqlen_k = k.size(1), kv_heads = k.size(2);
  const int64_t q_blocks = (q.size(1) + 127) / 128, k_blocks = (seqlen_k + 127) / 128;
  // grid.x: the batch's row blocks (and key tiles), below 2^31 as the kernels' int rows; grid.y: heads, below 2^16
  const int64_t limit = int64_t{1} << 31;
  TORCH_CHECK(q.size(2) < 65536 && kv_heads < 65536 && batch * std::max(q_blocks, k_blocks) * 128 < limit,
              "quantize_fp8: at most 65535 heads, and 2^31 - 1 rows over the batch");
  check_quantize_buffer(q8, "q8", at::kFloat8_e4m3fn, q.sizes(), q);
  check_quantize_buffer(k8, "k8", at::kFloat8_e4m3fn, k.sizes(), q);
  check_quantize_buffer(vt, "vt", at::kFloat8_e4m3fn, {batch, 128, kv_heads, k_blocks * 128}, q);
  check_quantize_buffer(q_scale, "q_scale", at::kFloat, {batch, q.size(2), q_blocks}, q);
  check_quantize_buffer(k_scale, "k_scale", at::kFloat, {batch, kv_heads, k_blocks}, q);
  check_quantize_buffer(v_scale, "v_scale", at::kFloat, {batch, kv_heads}, q);
  if (factors.has_value()) check_quantize_buffer(*factors, "factors", at::kFloat, {128}, q);
  const float* rotation = factors.has_value() ? factors->data_ptr<float>() : nullptr;
  const auto rows = [&](const at::Tensor& x, at::Tensor& out, at::Tensor& scale) {
    return fa3::QuantizeArgs{view(x), static_cast<uint8_t*>(out.data_ptr()), scale.data_ptr<float>(), nullptr,
                             rotation, static_cast<int>(x.size(1)), static_cast<int>(x.size(2)),
                             static_cast<int>(scale.size(2))};
  };
  const Context context(q.device());
  // V's amax per (batch row, key head), reduced by the kernels into zeros (the bits of floats >= 0 order as they do)
  at::Tensor v_amax = at::zeros({batch, kv_heads}, q.options().dtype(at::kInt));
  auto* amax_bits = reinterpret_cast<uint32_t*>(v_amax.data_ptr<int32_t>());
  const fa3::QuantizeArgs amax_pass{view(v), nullptr, nullptr, amax_bits, nullptr, static_cast<int>(seqlen_k),
                                    static_cast<int>(kv_heads), static_cast<int>(k_blocks)};
  const fa3::TransposeArgs transpose{view(v),
                                     amax_bits,
                                     v_scale.data_ptr<float>(),
                                     static_cast<uint8_t*>(vt.data_ptr()),
                                     static_cast<int>(seqlen_k),
                                     static_cast<int>(kv_heads),
                                     static_cast<int>(vt.size(3))};
  const fa3::Fp8Quantize job{rows(q, q8, q_scale), rows(k, k8, k_scale), amax_pass, transpose,
                             static_cast<int>(batch)};
  by_type(q, [&](auto tag) { fa3::run_quantize<typename decltype(tag)::type>(job, context.launch); });
}
#endif

// The backward: accumulates dq_accum (zeroed by prepare), writes dk and dv. dq_counts, dq_indices: the forward's
// schedule, read by the deterministic dQ pass. split_tiles key tiles are each split over split_chunks blocks adding
// into dkv_split: shares of the global keys' rows, or split_heads heads of the GQA group each (Params).
template <typename Context>
void backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
              const at::Tensor& lse_log2, const at::Tensor& delta, at::Tensor& dq_accum, at::Tensor& dk,
              at::Tensor& dv, const OptTensor& cu_q, const OptTensor& cu_k, int64_t max_q, int64_t max_k,
              const at::Tensor& counts, const at::Tensor& indices, const OptTensor& layout,
              const std::vector<int64_t>& mask, double scale, double softcap, const at::Tensor& dq_counts,
              const at::Tensor& dq_indices, bool deterministic, int64_t split_tiles, int64_t split_chunks,
              int64_t split_heads, const at::Tensor& dkv_split, bool sm90) {
  const Context context(q.device());
  Problem pb = problem(q, k, v, lse_log2, cu_q, cu_k, max_q, max_k, counts, indices, layout, mask, scale, softcap);
  Params& p = pb.p;
  p.o = view(dout);
  p.deterministic = deterministic;
  p.lse_log2 = lse_log2.data_ptr<float>();
  p.delta = delta.data_ptr<float>();
  p.dq_accum = view(dq_accum);
  p.dk = view(dk);
  p.dv = view(dv);
  p.split_tiles = static_cast<int>(split_tiles);
  p.split_chunks = static_cast<int>(split_chunks);
  p.split_heads = static_cast<int>(split_heads);
  p.dkv_split = view(dkv_split);
  pb.o = describe(dout);
  pb.dq_accum = describe(dq_accum);
  pb.dk = describe(dk);
  pb.dv = describe(dv);
  pb.dq_schedule = schedule(dq_counts, dq_indices);
  dispatch(q, p, [&](auto tag, auto dim, auto general) {
    using T = typename decltype(tag)::type;
    constexpr int D = decltype(dim)::value;
    constexpr bool kGeneral = decltype(general)::value;
    if constexpr (kHasSm90<D>) {
      if (sm90) return fa3::run_bwd<T, D, kGeneral>(pb, context.launch);
    }
    fa2::run_bwd<T, D, kGeneral>(pb, context.launch);
  });
}

// The backward's preprocessing: delta = rowsum(dO * O) - dlse, the logsumexp in log2, dq_accum zeroed.
template <typename Context>
void prepare(const at::Tensor& out, const at::Tensor& dout, const at::Tensor& lse, const OptTensor& dlse,
             at::Tensor& lse_log2, at::Tensor& delta, at::Tensor& dq_accum) {
  TORCH_CHECK(dq_accum.scalar_type() == at::kFloat && dq_accum.is_contiguous() && dq_accum.numel() % 4 == 0 &&
                  reinterpret_cast<uintptr_t>(dq_accum.data_ptr()) % 16 == 0,
              "prepare: dq_accum must be contiguous float32 of whole 16-byte chunks");
  const Context context(out.device());
  const bool packed = out.dim() == 3;
  fa2::PrepArgs a{};
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
  a.group = 32;
  while (vec && a.group > 1 && a.group / 2 * 8 * fa2::kPrepChunks >= a.head_dim) a.group /= 2;  // fewest lanes
  const int64_t rows = (static_cast<int64_t>(a.rows) + fa2::kPrepRows - 1) / fa2::kPrepRows * fa2::kPrepRows;
  const int64_t blocks = (rows * a.heads * a.group + fa2::kPrepThreads - 1) / fa2::kPrepThreads;
  if (blocks == 0) return;
  by_type(out, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (vec) {
      fa2::run_prepare<T, true>(a, blocks, context.launch);
    } else {
      fa2::run_prepare<T, false>(a, blocks, context.launch);
    }
  });
}

// ((query rows, keys) of a forward tile, (query rows, keys) of a backward tile) at head dim d, of the sm90 path where
// it has kernels there (sm90), else the sm80 path's: the tiles the schedules must be built for. The fa3 forward's
// depend on the call's mask and scale (general_mask: softcap, dilation, a block layout, the softmax scale).
inline pybind11::tuple tiles(int64_t d, bool sm90, double softcap, int64_t dilation, bool layout, double scale) {
  const bool general = general_mask(static_cast<float>(softcap), static_cast<int>(dilation), layout, log2_scale(scale));
  pybind11::tuple result;
  by_head_dim(d, [&](auto dim) {
    constexpr int D = decltype(dim)::value;
    using Fwd = fa2::FwdTraits<__half, D>;
    using Bwd = fa2::BwdTraits<__half, D>;
    result = pybind11::make_tuple(pybind11::make_tuple(Fwd::kBlockM, Fwd::kBlockN),
                                  pybind11::make_tuple(Bwd::kBlockM, Bwd::kBlockN));
#ifdef LEGALPT_SM90
    if constexpr (kHasSm90<D>) {
      using Bwd3 = fa3::BwdTraits<__half, D>;
      if (sm90) {
        const int rows = general ? fa3::FwdTraits<__half, D, __half, true>::kBlockM : fa3::FwdTraits<__half, D>::kBlockM;
        result = pybind11::make_tuple(pybind11::make_tuple(rows, fa3::FwdTraits<__half, D>::kBlockN),
                                      pybind11::make_tuple(Bwd3::kBlockM, Bwd3::kBlockN));
      }
    }
#endif
  });
  return result;
}

// The module's functions and attributes, on the build's Context.
template <typename Context>
void bind(pybind11::module& m) {
  m.attr("head_dims") = pybind11::tuple(pybind11::cast(head_dims()));
  m.attr("has_sm90") = kSm90;  // the FA3 path's kernels (sm_90a) are built
  m.def("tiles", &tiles, "((fwd rows, keys), (bwd rows, keys)) of a head dim's tiles on the sm80 or sm90 path",
        pybind11::arg("d"), pybind11::arg("sm90"), pybind11::arg("softcap") = 0.0, pybind11::arg("dilation") = 1,
        pybind11::arg("layout") = false, pybind11::arg("scale") = 1.0);
  m.def("forward", &forward<Context>, "attention forward: writes out and lse");
#if defined(LEGALPT_HDIM_128) && defined(LEGALPT_SM90)
  m.def("forward_fp8", &forward_fp8<Context>, "FP8 attention forward at head dim 128: writes out and lse");
  m.def("quantize_fp8", &quantize_fp8<Context>, "the FP8 forward's e4m3 inputs and scales from bf16 or fp16 ones");
#endif
  m.def("prepare", &prepare<Context>, "backward preprocessing: delta = rowsum(dO * O) - dlse, lse in log2");
  m.def("backward", &backward<Context>, "attention backward: accumulates dq_accum, writes dk and dv");
}

}  // namespace api
}  // namespace legalpt
