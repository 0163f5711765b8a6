// FA3 forward (Hopper, sm90a): one block of two warpgroups per (query tile of 128 rows, document, head), each
// warpgroup owning 64 rows. S = Q K^T and O += P V run on wgmma (wgmma.cuh): Q, K and V in swizzled shared memory,
// P straight from the registers S was computed in. Per visited key tile t, each warpgroup issues S(t) and then
// O += P(t-1) V(t-1), both asynchronous, waits for S(t) alone and computes its softmax while the tensor cores still
// run P V: FA3's overlap of the softmax with the other matmul, inside a warpgroup. The element rule, the schedule of
// visited tiles and the output are the FA2 forward's (csrc/fa2/fwd.cuh), and so is the online softmax, reordered
// around the wait for P V (its max and P first, O's rescale after).
//
// Copies are TMA (tma.cuh) issued by one thread (no producer warp yet): K(t+1) and V(t) load while tile t computes,
// into two buffers each, on one mbarrier per buffer pair; one block barrier per tile frees the buffers. Tile 0's
// copies go out with Q's and K(0)'s, so that a short visit list (a sliding window's 9 tiles) starts with them all
// in flight.
#pragma once

#include "../fa2/fwd.cuh"
#include "tma.cuh"
#include "wgmma.cuh"

namespace legalpt::fa3 {

using fa2::Document;
using fa2::Params;
using fa2::Visits;

template <typename T, int D>
struct FwdTraits {
  static constexpr int kWarpGroups = 2;
  static constexpr int kBlockM = 64 * kWarpGroups;  // query rows per block
  // Keys per tile: S (64 x 128) and O (64 x D) accumulators and P's fragments fit the 255 registers at D = 128.
  static constexpr int kBlockN = 128;
  static constexpr int kThreads = 128 * kWarpGroups;
  static constexpr int kTileBytes = kBlockN * D * sizeof(T);  // one K or V tile
  // Q, then K and V twice each; 3 mbarriers; 1024 bytes of slack to align the tiles to the swizzle's period
  static constexpr int kSmem = kBlockM * D * sizeof(T) + 4 * kTileBytes + 3 * sizeof(uint64_t) + 1024;
};

// The forward's arguments: fa2's, and the tensor maps of its TMA copies and of O's stores (boxes of 128 rows).
struct FwdArgs {
  Params p;
  TensorMap q, k, v;
  TensorMap o;  // stores of whole query tiles
};

// Tile t's scores s (a warpgroup's 64 rows x BN keys, raw) to P, as in the FA2 forward: the element rule, the new
// running max, P = exp2(logit - max) and the row sums. Then, once P V of the previous tile is done (`in_flight`), O is
// rescaled if a row of the warp moved its max, and P becomes the A fragments of the next P V.
template <typename T, int D, int BN, bool kGeneral>
__device__ __forceinline__ void online_softmax(const Params& p, float (&s)[BN / 8][4], float (&o)[D / 8][4],
                                               uint32_t (&pa)[BN / 16][4], float (&row_max)[2], float (&row_sum)[2],
                                               int t, const Visits& vis, int i0, const Document& doc, int b, int h,
                                               bool in_flight) {
  const int lane = threadIdx.x % 32;
  float(&s3)[1][BN / 8][4] = reinterpret_cast<float(&)[1][BN / 8][4]>(s);
  fa2::logits<kGeneral, 1, BN>(p, s3, t < vis.partial, i0, vis.tiles[t] * BN + 2 * (lane % 4), doc, b, h);
  float correction[2];
  bool move = false;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const float m = fmaxf(row_max[half], fa2::tile_row_max<kGeneral, BN>(p, s, half));
    move |= m > row_max[half];
    correction[half] = exp2f(row_max[half] - (m == -INFINITY ? 0.f : m));
    row_max[half] = m;
    row_sum[half] = row_sum[half] * correction[half] + fa2::exp_row<kGeneral, BN>(p, s, half, m);
  }
  if (in_flight) {
    wgmma_wait<0>();  // P V of the previous tile is done: O may be rescaled and P's fragments rewritten
    pin<D / 8>(o);
    if (__any_sync(0xffffffffu, move)) {
#pragma unroll
      for (int d = 0; d < D / 8; ++d)
#pragma unroll
        for (int c = 0; c < 4; ++c) o[d][c] *= correction[c / 2];
    }
  }
  to_fragments<T, BN>(s, pa);
}

// kGeneral: as in the FA2 forward (softcap, dilation, block layout, scales <= 0).
template <typename T, int D, bool kGeneral>
__global__ void __launch_bounds__(FwdTraits<T, D>::kThreads, 1) fwd_kernel(const __grid_constant__ FwdArgs a) {
  static_assert(D == 64 || D == 128, "the fa3 forward is instantiated for head dims 64 and 128");
#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || defined(LEGALPT_EMULATE)  // sm_90a and the CPU emulation
  using Tr = FwdTraits<T, D>;
  constexpr int BM = Tr::kBlockM, BN = Tr::kBlockN;
  static_assert(BM == BN, "Q, K and V share the tensor maps' box of 128 rows");
  const Params& p = a.p;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* sQ = smem_raw + (-smem_addr(smem_raw) & 1023);  // (BM, D), swizzled
  unsigned char* sK = sQ + BM * D * sizeof(T);                    // 2 x (BN, D)
  unsigned char* sV = sK + 2 * Tr::kTileBytes;                    // 2 x (BN, D)
  uint64_t* bars = reinterpret_cast<uint64_t*>(sV + 2 * Tr::kTileBytes);  // Q and K(0)'s; then per buffer pair

  const int m_blk = gridDim.x - 1 - blockIdx.x;  // the last query tiles see the most keys under causal: start them first
  const int b = blockIdx.y, h = blockIdx.z, hk = h / p.kv_group;
  const Document doc = fa2::document(p, b);
  if (m_blk * BM >= doc.lq) return;
  const int wg = threadIdx.x / 128, lane = threadIdx.x % 32;
  const int i0 = m_blk * BM + 64 * wg + 16 * (threadIdx.x / 32 % 4) + lane / 4;  // the thread's rows: i0, i0 + 8
  const Visits vis = fa2::visits(p.schedule, b, h, m_blk);

  if (threadIdx.x == 0) {
    for (int i = 0; i < 3; ++i) mbar_init(bars + i);
    mbar_fence_init();
  }
  __syncthreads();  // the barriers are initialized
  // A tile of `map`'s rows from `row` of this document into the swizzled (128, D) tile at `dst`, on `bar`
  const int batch = p.cu_seqlens_q == nullptr ? b : 0;  // the tensor maps' batch coordinate (one packed row: 0)
  const auto load = [&](unsigned char* dst, const TensorMap& map, int head, int row, uint64_t* bar) {
#pragma unroll
    for (int c = 0; c < D / 64; ++c) tma_load(dst + c * BN * 128, map, 64 * c, head, row, batch, bar);
  };
  // Copies of tile t: K(t+1) and V(t), on barrier 1 + t % 2 into the buffers (t+1) % 2 and t % 2
  const auto issue_copies = [&](int t) {
    const bool k_next = t + 1 < vis.count;
    mbar_expect(bars + 1 + t % 2, (k_next ? 2 : 1) * Tr::kTileBytes);
    if (k_next) load(sK + (t + 1) % 2 * Tr::kTileBytes, a.k, hk, doc.k_start + vis.tiles[t + 1] * BN, bars + 1 + t % 2);
    load(sV + t % 2 * Tr::kTileBytes, a.v, hk, doc.k_start + vis.tiles[t] * BN, bars + 1 + t % 2);
  };
  if (threadIdx.x == 0 && vis.count > 0) {  // without a visited key tile the output is written from no copy
    mbar_expect(bars, BM * D * sizeof(T) + Tr::kTileBytes);
    load(sQ, a.q, h, doc.q_start + m_blk * BM, bars);
    load(sK, a.k, hk, doc.k_start + vis.tiles[0] * BN, bars);
    issue_copies(0);  // every buffer is free: tile 0's copies fly beside Q's and K(0)'s
  }

  // The warpgroup's 64 rows of Q (each panel holds BM rows), and the first K and V tiles
  const uint64_t q_desc = descriptor(smem_addr(sQ) + 64 * wg * 128);
  const uint64_t k_desc = descriptor(smem_addr(sK));
  const uint64_t v_desc = descriptor(smem_addr(sV), BN * 128);

  float o[D / 8][4] = {};
  uint32_t pa[BN / 16][4];  // P of the latest tile, as A fragments
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};  // log2 domain; row_sum: this thread's part
  float s[BN / 8][4];
  // Rows of key tile t's K or V (landed at `tile`) past a varlen document's end zeroed (zero_rows); a barrier follows
  const auto past_document = [&](unsigned char* tile, int t) {
    const int valid = doc.lk - vis.tiles[t] * BN;
    if (p.cu_seqlens_k != nullptr && valid < BN) {
      zero_rows<BN, D, Tr::kThreads>(tile, valid);
      fence_proxy_async();
    }
  };
  // Before tile t (t >= 1): wait for K(t) and V(t-1) (the copies of tile t-1), then issue tile t's once every
  // warpgroup is done with the buffers they overwrite (S(t-1) and P V(t-2) have been waited for before the block
  // barrier)
  const auto next_copies = [&](int t) {
    mbar_wait(bars + 1 + (t - 1) % 2, (t - 1) / 2 % 2);
    if (t < vis.count) past_document(sK + t % 2 * Tr::kTileBytes, t);
    past_document(sV + (t - 1) % 2 * Tr::kTileBytes, t - 1);
    __syncthreads();
    if (threadIdx.x == 0 && t < vis.count) issue_copies(t);
  };
  const auto issue_s = [&](int t) {  // S = Q K(t)^T; 16 columns of D are 32 bytes of a line, 64 columns a panel
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
      wgmma_ss<T, BN>(s, q_desc + ((kk / 4) * BM * 128 + (kk % 4) * 32) / 16,
                      k_desc + ((t % 2) * Tr::kTileBytes + (kk / 4) * BN * 128 + (kk % 4) * 32) / 16, kk > 0);
    wgmma_commit();
  };
  const auto issue_pv = [&](int t) {  // O += P(t) V(t); 16 keys are 16 lines of every panel
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk)
      wgmma_rs<T, D>(o, pa[kk], v_desc + ((t % 2) * Tr::kTileBytes + kk * 16 * 128) / 16);
    wgmma_commit();
  };

  if (vis.count > 0) {
    mbar_wait(bars, 0);  // Q and K(0)
    if (p.cu_seqlens_k != nullptr && doc.lk - vis.tiles[0] * BN < BN) {  // uniform over the block
      past_document(sK, 0);
      __syncthreads();
    }
    wgmma_fence();
    issue_s(0);
    wgmma_wait<0>();
    pin<BN / 8>(s);
    online_softmax<T, D, BN, kGeneral>(p, s, o, pa, row_max, row_sum, 0, vis, i0, doc, b, h, false);
  }
  for (int t = 1; t < vis.count; ++t) {
    next_copies(t);
    pin<D / 8>(o);
    wgmma_fence();
    issue_s(t);
    issue_pv(t - 1);
    wgmma_wait<1>();  // S(t) is done; P V of the previous tile may still run
    pin<BN / 8>(s);
    online_softmax<T, D, BN, kGeneral>(p, s, o, pa, row_max, row_sum, t, vis, i0, doc, b, h, true);
  }
  if (vis.count > 0) {
    next_copies(vis.count);
    pin<D / 8>(o);
    wgmma_fence();
    issue_pv(vis.count - 1);
    wgmma_wait<0>();
    pin<D / 8>(o);
  }

  const float2 inv = fa2::finish_rows(p, row_max, row_sum, i0, doc, b, h);
  // A whole query tile's O goes out by TMA from Q's buffer, free since the last S (the copies' barrier): 128-byte
  // lines instead of every thread's 4-byte stores. A tile past a varlen document's end keeps fa2's stores.
  if (p.cu_seqlens_q == nullptr || (m_blk + 1) * BM <= doc.lq) {
#pragma unroll
    for (int d = 0; d < D / 8; ++d)
#pragma unroll
      for (int c = 0; c < 4; ++c) o[d][c] *= c < 2 ? inv.x : inv.y;
    store_swizzled<T, BM, D>(sQ, o, 64 * wg + 16 * (threadIdx.x / 32 % 4));
    fence_proxy_async();
    __syncthreads();  // both warpgroups' rows are stored
    if (threadIdx.x == 0) {
#pragma unroll
      for (int c = 0; c < D / 64; ++c) tma_store(a.o, sQ + c * BM * 128, 64 * c, h, doc.q_start + m_blk * BM, batch);
      tma_store_drain();
    }
  } else {
    fa2::store_rows<T, D>(p, o, inv, i0, doc, b, h);
  }
#elif defined(__CUDA_ARCH__)
  __trap();  // another target's code: fa3.check never launches it there, and it must not pass silently
#endif
}

}  // namespace legalpt::fa3
