// FA3 backward (Hopper, sm90a): one block per (key tile of 128 keys, document, key head), its two consumer
// warpgroups each owning 64 keys and their dK and dV accumulators, over the same visits as the FA2 backward
// (csrc/sm80/bwd.cuh: every query head of the group, split key tiles, the deterministic dQ pass). Per query tile
// (BwdTraits::kBlockM rows), recomputed from Q, K and the saved logsumexp, on wgmma (wgmma.cuh):
//   S^T = K Q^T and dP^T = V dO^T (A and B from swizzled shared memory)
//   P^T = exp2(S^T - lse), dS^T = P^T (dP^T - delta) d(logit)/d(q.k), in registers (FA2's score_grads, or its
//   halves plain_prob and plain_grad)
//   dV += P^T dO and dK += dS^T Q (P^T and dS^T as register A operands, dO and Q N-major from shared memory)
//   dQ = dS K: dS^T goes through shared memory (M-major A)
// dQ needs both consumers' dS^T (one barrier); each consumer then computes a 64 x 64 block of it over all 128 keys:
// at D = 128 half of D's columns, at D = 64 half of the 128 query rows (BwdTraits::kDqByRows). The order keeps the
// tensor cores fed: P^T once S^T is done (dP^T still running), dV's MMAs issued, dS^T beside them (at D = 64 before
// them: BwdTraits::kDsFirst), then dQ's MMAs before dK's, so that dQ's store to shared memory runs beside dK's MMAs
// (the general kernels, whose softcap needs the raw score beside dP^T, wait for both first).
//
// Warp-specialized as the forward (fwd.cuh): a producer warpgroup copies, two consumer warpgroups compute. The
// producer's first thread brings K and V once and each query tile's Q and dO by TMA (tma.cuh), its second warp the
// tile's logsumexp and delta by cp.async (threads read them, not wgmma; zero-filled past the document), both on the
// stage's full mbarrier; the consumers free a stage on its empty mbarrier, so that the next query tile's copies fly
// while this one computes and the consumers meet only where dQ needs both halves of dS^T (double-buffered, so that
// one barrier per tile suffices). dQ leaves as FA3's does: the consumers put their float32 parts into a swizzled
// tile in shared memory and the producer's third warp adds the tile into dq_accum by TMA reductions, so that the
// consumers issue no atomics.
#pragma once

#include <type_traits>

#include "../common/backward.cuh"
#include "fwd.cuh"
#include "tma.cuh"
#include "warps.cuh"

namespace legalpt::fa3 {

template <typename T, int D>
struct BwdTraits {
  static constexpr int kHeadDim = D;
  // Query rows per visited tile: the N of S^T's and dP^T's wgmma. At D = 64 128, as FA3's: S^T and dP^T (64 x 128
  // each per consumer) fit beside dK and dV (64 x 64) when dS^T is computed before dV's MMAs (kDsFirst; ptxas: a
  // 4-byte spill), and each key tile's K and V are read by twice as many query rows per pass over shared memory.
  // At D = 128, 64: dK and dV take 64 x 128 each there.
  static constexpr int kBlockM = D == 64 ? 128 : 64;
  static constexpr int kBlockN = 128;  // keys per block: 64 per consumer, the M of every wgmma
  static constexpr int kThreads = 384;  // the producer warpgroup, then two consumers
  static constexpr int kConsumerThreads = 256;
  // Registers per thread, moved by setmaxnreg as in the forward (FwdTraits), in steps of 8: 24 / 240 and 40 / 232
  // are neighbouring splits. The producer's walk over items spills at 24 (ptxas: 56 bytes at D = 64, 52 at
  // D = 128). At D = 64 the consumers spill no more at 232 than at 240 (4 bytes), so the producer gets 40 and
  // does not spill; at D = 128 the consumers spill below 240, and the producer's small spill in its bookkeeping is
  // the cheaper one.
  static constexpr int kProducerRegisters = D == 64 ? 40 : 24;
  static constexpr int kConsumerRegisters = D == 64 ? 232 : 240;
  static constexpr int kLaunchRegisters = 65536 / kThreads / 8 * 8;
  static_assert((kLaunchRegisters - kProducerRegisters) * (kThreads - kConsumerThreads) >=
                    (kConsumerRegisters - kLaunchRegisters) * kConsumerThreads,
                "the consumers' registers must come from the producer's");
  static constexpr int kKeyTileBytes = kBlockN * D * sizeof(T);    // K or V
  static constexpr int kQueryTileBytes = kBlockM * D * sizeof(T);  // Q or dO, one stage
  static constexpr int kDsBytes = kBlockN * kBlockM * sizeof(T);   // dS^T, one buffer
  static constexpr int kDqBytes = kBlockM * D * sizeof(float);     // dQ of a query tile, float32
  // dQ (BM x D) in two 64 x 64 blocks, one per consumer, each over all BN keys (wgmma m64n64): at D = 64 the
  // consumers split the 128 query rows, at D = 128 D's columns. (At D = 64 with 64-row tiles they took turns at the
  // whole tile, as column halves would be n32 wgmmas, which read 3 KB of shared memory per 16 of the tensor cores'
  // cycles where n64 reads 4 KB per 32.)
  static constexpr bool kDqByRows = D == 64;
  static_assert(kBlockM * D == 2 * 64 * 64, "dQ's tile is the two consumers' 64 x 64 blocks");
  // dS^T computed once dP^T is done, before dV's MMAs are issued, instead of beside them: at D = 64 the pending dV
  // MMAs' P^T fragments beside S^T and dP^T (64 x 128 each) spilled (ptxas: 80 bytes, which serialized every
  // wgmma); so ordered, 4 bytes.
  static constexpr bool kDsFirst = D == 64;
  // mbarriers: K and V's copies (full) and release (empty); per query stage likewise. One buffer of K and V: a
  // second, for the next item's to land while this one computes, fits neither head dim's 227 KB.
  static constexpr int kBarriers = 2 + 4;
  // K and V; Q and dO twice; dS^T twice; dQ; logsumexp and delta twice; the mbarriers; 1024 bytes to align to the
  // swizzle's period. An item's dK and dV leave through the dS^T buffers and dQ's, so that the next item's Q and dO
  // may land in the query stages meanwhile.
  static constexpr int kSmem = 2 * kKeyTileBytes + 4 * kQueryTileBytes + 2 * kDsBytes + kDqBytes +
                               4 * kBlockM * sizeof(float) + kBarriers * sizeof(uint64_t) + 1024;
  static constexpr int kDqThreads = kConsumerThreads + 32;  // the named barriers between the consumers and dQ's warp
  // An item's dK and dV leave through the two dS^T buffers where both fit (D = 64), else dV through dQ's, which
  // must first wait for the dQ warp's last reduction to have read it.
  static constexpr bool kDkvThroughDs = 2 * kDsBytes >= 2 * kKeyTileBytes;
};

// The backward's arguments: fa2's, and the tensor maps of its TMA copies (tma.cuh; boxes of kBlockM query rows,
// kBlockN keys) and stores.
struct BwdArgs {
  Params p;
  TensorMap q, dout, k, v;
  TensorMap dk, dv;  // stores of whole key tiles (boxes of kBlockN rows)
  TensorMap dq;      // reductions into dq_accum (float32, boxes of kBlockM rows)
  int key_blocks, documents;  // items: key_blocks (split parts first) x documents x key heads (bwd_block_index)
};

// Item i: a key tile, or a split key tile's part, of one document and key head (bwd_block_index's order).
// Every side of the block decodes its items here, so that all skip the same ones and visit the same pairs.
struct BwdItem {
  int n_blk, chunk, b, hk;  // chunk: the split tile's part, -1 for a whole tile
  bool split;
  Document doc;
  int batch;     // the tensor maps' batch coordinate (map_batch)
  bool skipped;  // the key tile starts past its document's end: no side does anything for it
  BwdWork work;  // its first (query head, query tile) pair, if any
};
template <int BN>
__device__ __forceinline__ BwdItem bwd_item(const BwdArgs& a, int i) {
  const Params& p = a.p;
  const BwdBlockIndex x = bwd_block_index(p, i, a.key_blocks, a.documents);
  BwdItem item{};
  item.n_blk = x.n_blk;
  item.chunk = x.chunk;
  item.b = x.b;
  item.hk = x.hk;
  item.split = x.split;
  item.doc = document(p, item.b);
  item.batch = map_batch(p, item.b);
  item.skipped = item.n_blk * BN >= item.doc.lk;
  item.work = {-1, 0, 0, 0, {}};
  if (!item.skipped) advance(p, item.work, item.b, item.hk, item.n_blk, item.chunk);
  return item;
}

// The dQ warp of the backward's producer, for one item: per visited query tile, once the consumers have stored its
// dQ (BM x D, float32) in sdQ, lane 0 adds it into dq_accum by TMA reductions (BM-row by 32-column boxes) and frees
// sdQ once they have read it. Rows past a varlen document's end add zeros to the next document's (their P is masked
// to 0). At D = 128 the warp meets the consumers at kDqFree once more at the item's end (a sync, so that it never
// arrives a phase ahead): sdQ then carries the item's dV out (BwdTraits::kDkvThroughDs).
template <typename Tr>
__device__ __forceinline__ void add_dq_tiles(const BwdArgs& a, BwdWork work, const unsigned char* sdQ,
                                             const Document& doc, int b, int batch, int hk, int n_blk, int chunk) {
  constexpr int BM = Tr::kBlockM, D = Tr::kHeadDim;
  const Params& p = a.p;
  for (; work.g < p.kv_group; advance(p, work, b, hk, n_blk, chunk)) {
    named_arrive(kDqFree, Tr::kDqThreads);
    named_sync(kDqStored, Tr::kDqThreads);
    if (threadIdx.x % 32 == 0) {
      const int h = hk * p.kv_group + work.g, row = doc.q_start + work.tile * BM;
#pragma unroll
      for (int c = 0; c < D / 32; ++c) tma_reduce_add(a.dq, sdQ + c * BM * 128, 32 * c, h, row, batch);
      bulk_commit();
      bulk_wait_read<0>();  // the reductions have read sdQ
    }
    __syncwarp();
  }
  if constexpr (!Tr::kDkvThroughDs) named_sync(kDqFree, Tr::kDqThreads);
}

template <typename T, int D, bool kGeneral>  // kGeneral: as for fwd_kernel
__global__ void __launch_bounds__(BwdTraits<T, D>::kThreads, 1) bwd_kernel(const __grid_constant__ BwdArgs a) {
  static_assert(D == 64 || D == 128, "the fa3 backward is instantiated for head dims 64 and 128");
#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || defined(LEGALPT_EMULATE)  // sm_90a and the CPU emulation
  using Tr = BwdTraits<T, D>;
  constexpr int BM = Tr::kBlockM, BN = Tr::kBlockN, kConsumerThreads = Tr::kConsumerThreads;
  const Params& p = a.p;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* sK = smem_raw + (-smem_addr(smem_raw) & 1023);  // (BN, D), swizzled
  unsigned char* sV = sK + Tr::kKeyTileBytes;                     // (BN, D)
  unsigned char* sQ0 = sV + Tr::kKeyTileBytes;                    // 2 x (BM, D)
  unsigned char* sdO0 = sQ0 + 2 * Tr::kQueryTileBytes;             // 2 x (BM, D)
  unsigned char* sdS0 = sdO0 + 2 * Tr::kQueryTileBytes;            // 2 x (BN, BM): dS^T; an item's dK at its end
  unsigned char* sdQ = sdS0 + 2 * Tr::kDsBytes;                     // (BM, D) float32, swizzled; an item's dV
  float* sLse0 = reinterpret_cast<float*>(sdQ + Tr::kDqBytes);       // 2 x (BM) log2 domain
  float* sDelta0 = sLse0 + 2 * BM;                                   // 2 x (BM)
  uint64_t* bars = reinterpret_cast<uint64_t*>(sDelta0 + 2 * BM);
  uint64_t *kv_full = bars, *kv_empty = bars + 1;      // K and V's
  uint64_t *q_full = bars + 2, *q_empty = q_full + 2;  // per query stage
  const int items = a.key_blocks * a.documents * (p.heads / p.kv_group);
  const int lane = threadIdx.x % 32;

  if (threadIdx.x == 0) {
    mbar_init(kv_full);
    mbar_init(kv_empty, kConsumerThreads / 32);  // one arrival per consumer warp
    for (int s = 0; s < 2; ++s) {
      mbar_init(q_full + s, 1 + 32);                      // the TMA thread's and the second warp's 32 lanes'
      mbar_init(q_empty + s, kConsumerThreads / 32);
    }
    mbar_fence_init();
  }
  __syncthreads();  // the barriers are initialized; the warpgroups part here
  // Every side walks the block's items (every gridDim.x-th: persistent where the host launches fewer blocks than
  // items) and counts K/V's (n) and the query stages' (it) uses over all of them: the buffers' phases run on. An item
  // whose key tile starts past its document's end is skipped by all; one that no query sees still stores zeros.

  if (threadIdx.x < 128) {  // the producer: thread 0 issues the TMA copies, warp 1 the logsumexp's and delta's,
    registers_down<Tr::kProducerRegisters>();  // warp 2 adds dQ into dq_accum
    const int warp = threadIdx.x / 32;
    if (warp > 2 || (warp == 0 && lane != 0) || (warp == 2 && p.deterministic)) return;
    for (int i = blockIdx.x, n = 0, it = 0; i < items; i += gridDim.x) {
      BwdItem item = bwd_item<BN>(a, i);
      if (item.skipped) continue;
      const int b = item.b, hk = item.hk, n_blk = item.n_blk, chunk = item.chunk, batch = item.batch;
      const Document& doc = item.doc;
      BwdWork& work = item.work;
      if (warp == 2) {
        add_dq_tiles<Tr>(a, work, sdQ, doc, b, batch, hk, n_blk, chunk);
        continue;
      }
      if (warp == 0) {  // K and V once the last item's MMAs are done with them
        if (n > 0) mbar_wait(kv_empty, (n - 1) % 2);
        mbar_expect(kv_full, 2 * Tr::kKeyTileBytes);
        tma_load_tile<BN, D>(sK, a.k, hk, doc.k_start + n_blk * BN, batch, kv_full);
        tma_load_tile<BN, D>(sV, a.v, hk, doc.k_start + n_blk * BN, batch, kv_full);
      }
      ++n;
      // One query tile of one head into its stage, once the consumers have freed it (two tiles ago). Q and dO: rows
      // past the document hold the next one's or zeros (the tile is partial, its mask zeroes their P, the consumers
      // zero those rows); logsumexp and delta: zero-filled there.
      for (; work.g < p.kv_group; ++it) {
        const int stage = it % 2, h = hk * p.kv_group + work.g, row = doc.q_start + work.tile * BM;
        if (it >= 2) mbar_wait(q_empty + stage, (it / 2 - 1) % 2);
        if (warp == 0) {
          mbar_expect(q_full + stage, 2 * Tr::kQueryTileBytes);
          tma_load_tile<BM, D>(sQ0 + stage * Tr::kQueryTileBytes, a.q, h, row, batch, q_full + stage);
          tma_load_tile<BM, D>(sdO0 + stage * Tr::kQueryTileBytes, a.dout, h, row, batch, q_full + stage);
        } else {
          const int valid = doc.lq - work.tile * BM;
#pragma unroll
          for (int r = lane; r < BM; r += 32) {
            const int64_t at = b * p.lse_batch_stride + h * p.lse_head_stride + row + r;
            cp_async4(sLse0 + stage * BM + r, p.lse_log2 + at, r < valid);
            cp_async4(sDelta0 + stage * BM + r, p.delta + at, r < valid);
          }
          cp_async_arrive(q_full + stage);
        }
        advance(p, work, b, hk, n_blk, chunk);
      }
    }
    return;
  }

  registers_up<Tr::kConsumerRegisters>();
  const int wg = threadIdx.x / 128 - 1, thread = threadIdx.x - 128;  // the consumer, and the thread among them
  const int key0 = 64 * wg + 16 * (threadIdx.x / 32 % 4);  // the warp's first key in the tile (+ lane / 4, + 8)
  // Rows [valid, ROWS) of the tiles at `x` and `y` (landed) zeroed by both consumers, which meet there
  const auto zero_past_document = [&](auto rows, unsigned char* x, unsigned char* y, int valid) {
    zero_rows<decltype(rows)::value, D, kConsumerThreads>(x, valid, thread);
    zero_rows<decltype(rows)::value, D, kConsumerThreads>(y, valid, thread);
    fence_proxy_async();
    named_sync(kConsumersSync, kConsumerThreads);
  };

  // The consumer's 64 keys of K and V as A operands (K-major), the dQ operands (M-major dS^T, N-major K)
  const uint64_t k_desc = descriptor(smem_addr(sK) + 64 * wg * 128);
  const uint64_t v_desc = descriptor(smem_addr(sV) + 64 * wg * 128);
  // The consumer's 64 x 64 block of dQ (BwdTraits::kDqByRows): its first query row and column
  const int dq_row0 = Tr::kDqByRows ? 64 * wg : 0, dq_col0 = Tr::kDqByRows ? 0 : 64 * wg;
  // dS^T's queries [dq_row0, dq_row0 + 64): one panel of (BN, BM)
  const uint64_t ds_desc = descriptor(smem_addr(sdS0) + (dq_row0 / 64) * BN * 128);
  // K's columns [dq_col0, dq_col0 + 64): one panel
  const uint64_t kt_desc = descriptor(smem_addr(sK) + (dq_col0 / 64) * BN * 128);
  // Whether an item's TMA store of dK and dV may still be reading sdS and sdQ. The consumers wait for it (its issuing
  // thread, then a barrier) only before they next write either, so that the next item's first MMAs run meanwhile.
  bool storing = false;
  const auto settle = [&] {
    if (storing) {
      if (thread == 0) bulk_wait_read<0>();
      named_sync(kConsumersSync, kConsumerThreads);
      storing = false;
    }
  };

  for (int i = blockIdx.x, n = 0, it = 0; i < items; i += gridDim.x) {
    BwdItem item = bwd_item<BN>(a, i);
    if (item.skipped) continue;
    const int b = item.b, hk = item.hk, n_blk = item.n_blk, chunk = item.chunk, batch = item.batch;
    const bool split = item.split;
    const Document& doc = item.doc;
    BwdWork& work = item.work;
    float dk[1][D / 8][4] = {}, dv[1][D / 8][4] = {};  // rows key0 + lane / 4 (+8), columns 8 n + 2 (lane % 4) (+1)
    BwdWork next = work;  // read an iteration ahead: its tile index comes from global memory
    advance(p, next, b, hk, n_blk, chunk);
    mbar_wait(kv_full, n % 2);
    if (p.cu_seqlens_k != nullptr && (n_blk + 1) * BN > doc.lk) {
      zero_past_document(std::integral_constant<int, BN>{}, sK, sV, doc.lk - n_blk * BN);
    }
    for (; work.g < p.kv_group; ++it) {
      const int stage = it % 2;
      mbar_wait(q_full + stage, (it / 2) % 2);  // the stage's Q, dO, logsumexp and delta
      if (p.cu_seqlens_q != nullptr && (work.tile + 1) * BM > doc.lq) {
        zero_past_document(std::integral_constant<int, BM>{}, sQ0 + stage * Tr::kQueryTileBytes,
                           sdO0 + stage * Tr::kQueryTileBytes, doc.lq - work.tile * BM);
      }
      const int h = hk * p.kv_group + work.g, m_blk = work.tile;
      const uint32_t sq = smem_addr(sQ0 + stage * Tr::kQueryTileBytes), sdo = smem_addr(sdO0 + stage * Tr::kQueryTileBytes);
      const uint64_t q_desc = descriptor(sq), do_desc = descriptor(sdo);  // K-major: B of S^T and dP^T
      const uint64_t q_desc_n = descriptor(sq, BM * 128), do_desc_n = descriptor(sdo, BM * 128);  // N-major: of dK, dV

      float st[BM / 8][4], dpt[BM / 8][4];  // S^T and dP^T: rows key0 + lane / 4 (+8), queries 8 n + 2 (lane % 4) (+1)
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {  // 16 columns of D are 32 bytes of a line; 64 columns a panel
        const int at = (kk % 4) * 32;
        wgmma_ss<T, BM>(st, k_desc + ((kk / 4) * BN * 128 + at) / 16, q_desc + ((kk / 4) * BM * 128 + at) / 16, kk > 0);
      }
      wgmma_commit();
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        const int at = (kk % 4) * 32;
        wgmma_ss<T, BM>(dpt, v_desc + ((kk / 4) * BN * 128 + at) / 16, do_desc + ((kk / 4) * BM * 128 + at) / 16,
                        kk > 0);
      }
      wgmma_commit();
      const float* lse = sLse0 + stage * BM;
      const float* delta = sDelta0 + stage * BM;
      auto query = [&](int n, int c) { return 8 * n + 2 * (lane % 4) + c % 2; };  // the query of st[n][c] in the tile
      const bool partial = work.t < work.vis.partial;
      // The pair after next: its tile index comes from global memory, read while the MMAs run (ptxas moves it to
      // a uniform register at once, which waits for the load)
      BwdWork after = next;
      advance(p, after, b, hk, n_blk, chunk);
      uint32_t pa[BM / 16][4], dsa[BM / 16][4];  // P^T and dS^T as A fragments, 16 queries each
      if constexpr (kGeneral) {  // softcap's dS needs the raw score beside dP^T: both first
        wgmma_wait<0>();
        pin<BM / 8>(st);
        pin<BM / 8>(dpt);
#pragma unroll
        for (int n = 0; n < BM / 8; ++n)
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            score_grads<kGeneral>(p, st[n][c], dpt[n][c], lse[query(n, c)], delta[query(n, c)]);
          }
        if (partial) {
          mask_transposed<kGeneral, BM>(p, m_blk * BM, n_blk * BN + key0, doc, b, h,
                                             [&](int n, int c) { st[n][c] = dpt[n][c] = 0.f; });
        }
      } else {  // P^T while dP^T is still computed; masked P^T is 0, and so is its dS^T
        wgmma_wait<1>();
        pin<BM / 8>(st);
#pragma unroll
        for (int n = 0; n < BM / 8; ++n)
#pragma unroll
          for (int c = 0; c < 4; ++c) st[n][c] = plain_prob(p, st[n][c], lse[query(n, c)]);
        if (partial) {
          mask_transposed<kGeneral, BM>(p, m_blk * BM, n_blk * BN + key0, doc, b, h,
                                             [&](int n, int c) { st[n][c] = 0.f; });
        }
      }
      const auto ds_of_dp = [&] {  // dS^T in place of dP^T
        wgmma_wait<Tr::kDsFirst ? 0 : 1>();
        pin<BM / 8>(dpt);
#pragma unroll
        for (int n = 0; n < BM / 8; ++n)
#pragma unroll
          for (int c = 0; c < 4; ++c) dpt[n][c] = plain_grad(p, st[n][c], dpt[n][c], delta[query(n, c)]);
      };
      if constexpr (!kGeneral && Tr::kDsFirst) ds_of_dp();
      to_fragments<T, BM>(st, pa);
      pin<D / 8>(dv[0]);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < BM / 16; ++kk)  // dV += P^T dO, 16 queries: 16 lines of every panel
        wgmma_rs<T, D>(dv[0], pa[kk], do_desc_n + (kk * 16 * 128) / 16);
      wgmma_commit();
      if constexpr (!kGeneral && !Tr::kDsFirst) ds_of_dp();  // while dV's MMAs run
      to_fragments<T, BM>(dpt, dsa);

      auto dk_grads = [&] {  // dK += dS^T Q
        pin<D / 8>(dk[0]);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BM / 16; ++kk) wgmma_rs<T, D>(dk[0], dsa[kk], q_desc_n + (kk * 16 * 128) / 16);
        wgmma_commit();
      };
      if (p.deterministic) {
        dk_grads();
      } else {  // dQ's MMAs before dK's, so that its store runs beside dK's MMAs
        // dS^T's buffer it % 2: the other consumer read the tile before it (it - 2) before it stored the last one's
        settle();
        store_swizzled<BN, BM>(sdS0 + stage * Tr::kDsBytes, dsa, key0);
        fence_proxy_async();
        named_sync(kDsStored, kConsumerThreads);  // both consumers' dS^T are stored
        float dq[1][64 / 8][4];  // rows dq_row0 + 16 (warp % 4) + lane / 4 (+8), columns dq_col0 + 8 n + ...
        const uint64_t ds = ds_desc + stage * Tr::kDsBytes / 16;
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk)  // 16 keys: 16 lines
          wgmma_ss<T, 64, 1, 1>(dq[0], ds + (kk * 16 * 128) / 16, kt_desc + (kk * 16 * 128) / 16, kk > 0);
        wgmma_commit();
        dk_grads();
        wgmma_wait<1>();  // dV's and dQ's
        pin<64 / 8>(dq[0]);
        named_sync(kDqFree, Tr::kDqThreads);  // the last tile's reduction has read sdQ
        store_swizzled_f32<BM, 64>(sdQ, dq[0], dq_row0 + 16 * (threadIdx.x / 32 % 4), dq_col0);
        fence_proxy_async();
        named_arrive(kDqStored, Tr::kDqThreads);
      }
      wgmma_wait<0>();
      pin<D / 8>(dk[0]);
      pin<D / 8>(dv[0]);
      if (lane == 0) mbar_arrive(q_empty + stage);  // the warp is done with the stage
      work = next;
      next = after;
    }
    if (lane == 0) mbar_arrive(kv_empty);  // the warp's MMAs are done with K and V: a later item's may come
    ++n;
    // The item's dK and dV (2 x (BN, D)) go out through the dS^T buffers, and at D = 128 dV through dQ's, while the
    // next item's Q and dO land in the query stages and its first MMAs run. The last tile's kDqFree has ordered
    // both consumers' dQ MMAs (done with sdS) before it; at D = 128 the consumers meet the dQ warp there once more,
    // for its last reduction to have read sdQ. A whole key tile goes out by TMA (128-byte lines instead of every
    // thread's 4-byte stores); a tile past a varlen document's end and a split tile's part (float32 sums) keep
    // fa2's stores.
    if constexpr (!Tr::kDkvThroughDs) {
      if (!p.deterministic) named_sync(kDqFree, Tr::kDqThreads);
    }
    if (!split && (p.cu_seqlens_k == nullptr || (n_blk + 1) * BN <= doc.lk)) {
      static_assert(2 * Tr::kDsBytes >= Tr::kKeyTileBytes && Tr::kDqBytes >= Tr::kKeyTileBytes,
                    "dK fits the dS^T buffers and dV dQ's");
      unsigned char* sdV = Tr::kDkvThroughDs ? sdS0 + Tr::kDsBytes : sdQ;
      settle();
      store_swizzled<T, BN, D>(sdS0, dk[0], key0);
      store_swizzled<T, BN, D>(sdV, dv[0], key0);
      fence_proxy_async();
      named_sync(kConsumersSync, kConsumerThreads);  // both consumers' rows are stored
      if (thread == 0) {
        tma_store_tile<BN, D>(a.dk, sdS0, hk, doc.k_start + n_blk * BN, batch);
        tma_store_tile<BN, D>(a.dv, sdV, hk, doc.k_start + n_blk * BN, batch);
        bulk_commit();
      }
      storing = true;
    } else {
      store_dkv<T, 1, D, D>(p, dk, dv, doc, b, hk, n_blk * BN + key0, 0, split);
    }
  }
  if (thread == 0) bulk_wait_read<0>();  // before the block's shared memory goes
#elif defined(__CUDA_ARCH__)
  __trap();  // another target's code: fa3.check never launches it there, and it must not pass silently
#endif
}

}  // namespace legalpt::fa3
