// FA3 forward (Hopper, sm90a): blocks of a producer and two or three consumer warpgroups (FwdTraits), each block
// taking items (query tile of 64 rows per consumer, document, head) in turn, every gridDim.x-th: persistent, one
// block per processor as in FA3, where the items cost alike (the host decides, csrc/sm90/launch.h), else one block
// per item. The producer issues every copy (TMA, tma.cuh); each consumer computes 64 query rows. The producer gives
// its registers to the consumers (warps.cuh). S = Q K^T and O += P V run on wgmma (wgmma.cuh): Q, K and V in
// swizzled shared memory, P straight from the registers S was computed in. Per visited key tile t, each consumer
// issues S(t) and then O += P(t-1) V(t-1), both asynchronous, waits for S(t) alone and computes its softmax while
// the tensor cores still run P V: FA3's overlap inside a warpgroup. Between the consumers, ping-pong around a ring:
// each issues its MMAs only in its turn, which the one before it hands over after issuing its own, so that one's
// softmax runs beside the others' MMAs. The element rule, the schedule of visited tiles and the output are the FA2
// forward's (csrc/sm80/fwd.cuh), and so is the online softmax, reordered around the wait for P V (its max and P
// first; O's rescale and P's fragments after, once P V(t - 1) is done, just before the next MMAs).
//
// K and V have two buffers each, each buffer a pair of mbarriers: full (the copy landed) and empty (every consumer
// warp is done with it), so the producer runs ahead of the consumers by up to two tiles and the consumers never wait
// for each other's buffers. Q has one buffer and such a pair: the consumers free it after an item's last S, so that
// the next item's Q, K and V load while this one finishes; O goes out from a buffer of its own.
#pragma once

#include "../common/softmax.cuh"
#include "tma.cuh"
#include "warps.cuh"
#include "wgmma.cuh"

namespace legalpt::fa3 {


// T: the inputs' element type (bf16, fp16, or e4m3 for the FP8 forward), TO: the output's; kGeneral: the kernel of
// general masks (fwd_kernel).
template <typename T, int D, typename TO = T, bool kGeneral = false>
struct FwdTraits {
  // Consumer warpgroups: three in the plain kernel at D = 64 (192 query rows a block, as FA3's), where a consumer's
  // S, O and P fit 160 registers and each K and V tile serves more rows; two at D = 128, whose O takes 32 registers
  // more, and in the general kernel, whose element rule spills 742 bytes in 160.
  static constexpr int kConsumers = D == 64 && !kGeneral ? 3 : 2;
  static constexpr int kConsumerRows = 64;                    // query rows per consumer: a wgmma's M
  static constexpr int kBlockM = kConsumerRows * kConsumers;  // query rows per block
  // Keys per tile: S (64 x 128) and O (64 x D) accumulators and P's fragments fit a consumer's registers.
  static constexpr int kBlockN = 128;
  static constexpr int kThreads = 128 * (1 + kConsumers);  // the producer warpgroup first
  static constexpr int kConsumerThreads = 128 * kConsumers;
  // Registers per thread: 24 for the producer, 240 (two consumers) or 160 (three) for the consumers. setmaxnreg
  // moves registers within the block, from the launch's share (65 536 / threads in steps of 8: 168 or 128): the
  // consumers' increase waits until the producer's decrease has freed them, so a split past the share hangs
  // (128 x 24 + 256 x 240 = 384 x 168; 128 x 24 + 384 x 160 <= 512 x 128)
  static constexpr int kProducerRegisters = 24, kConsumerRegisters = kConsumers == 3 ? 160 : 240;
  static constexpr int kLaunchRegisters = 65536 / kThreads / 8 * 8;
  static_assert((kLaunchRegisters - kProducerRegisters) * 128 >=
                    (kConsumerRegisters - kLaunchRegisters) * kConsumerThreads,
                "the consumers' registers must come from the producer's");
  static_assert(kOStored0 + kConsumers <= 16, "a named barrier id per consumer's O store");
  static constexpr int kTileBytes = kBlockN * D * sizeof(T);  // one K or V tile (the FP8 forward's V^T: D x BN)
  // mbarriers: Q's, K's and V's full and empty, per buffer
  static constexpr int kBarriers = 10;
  // Q, then K and V twice each, then O; the mbarriers; 1024 bytes of slack to align the tiles to the swizzle's period
  static constexpr int kSmem =
      kBlockM * D * (sizeof(T) + sizeof(TO)) + 4 * kTileBytes + kBarriers * sizeof(uint64_t) + 1024;
};


// The FP8 forward's scales (legalpt/attention/fp8.py): x ~= e4m3 value x scale, float32, contiguous.
struct Fp8Scales {
  const float* q;  // (B, H, q_blocks): one per 128 query rows
  const float* k;  // (B, Hk, k_blocks): one per 128 keys
  const float* v;  // (B, Hk)
  int q_blocks, k_blocks;
};

// The forward's arguments: fa2's, and the tensor maps of its TMA copies (boxes of a query tile's rows, a key tile's)
// and of O's stores (boxes of a consumer's 64 rows). The FP8 forward's v map reads V^T (keys along its lines), and
// `scales` holds its scales (null elsewhere).
struct FwdArgs {
  Params p;
  TensorMap q, k, v;
  TensorMap o;             // stores of a consumer's 64 rows
  int m_tiles, documents;  // query tiles of the longest document; items: m_tiles x documents x heads
  Fp8Scales scales;
};

// The tensor maps' batch coordinate of document b: its batch row, or 0 on a packed varlen axis (a single row)
__device__ __forceinline__ int map_batch(const Params& p, int b) { return p.cu_seqlens_q == nullptr ? b : 0; }

// Item i: a head's query tiles in turn, the last (under causal the longest) first, so that the blocks at work at once
// share a head's K and V in L2.
struct FwdItem {
  int m_blk, b, h;
};
__device__ __forceinline__ FwdItem fwd_item(const FwdArgs& a, int i) {
  const int rest = i / a.m_tiles;
  return {a.m_tiles - 1 - i % a.m_tiles, rest % a.documents, rest / a.documents};
}

// The FP8 forward's P is exp2(logit - max + kFp8Shift), in (0, 256] instead of (0, 1]: e4m3's normal range
// (legalpt/attention/fp8.py, P_SHIFT). The logsumexp takes the shift off.
constexpr float kFp8Shift = 8.f;

// Scores s of key tile `tile` (a warpgroup's 64 rows x BN keys, raw) to P in place, as in the FA2 forward: the
// element rule where the tile is partial, the new running max, P = exp2(logit - max) and the row sums. O is
// rescaled later (`rescale`), once the P V that reads it is done: `correction` holds the factors and `move` whether
// a row of this thread moved its max. kFp8: `scale` (the tile's) takes the raw scores to log2-domain logits instead
// of to_log2, and P is shifted by kFp8Shift.
template <int BN, bool kGeneral, bool kFp8 = false>
__device__ __forceinline__ void online_softmax(const Params& p, float (&s)[BN / 8][4], float (&row_max)[2],
                                               float (&row_sum)[2], float (&correction)[2], bool& move,
                                               bool partial, int tile, int i0, const Document& doc, int b, int h,
                                               float scale) {
  const int lane = threadIdx.x % 32;
  float(&s3)[1][BN / 8][4] = reinterpret_cast<float(&)[1][BN / 8][4]>(s);
  logits<kGeneral, 1, BN>(p, s3, partial, i0, tile * BN + 2 * (lane % 4), doc, b, h);
  move = false;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const float m = fmaxf(row_max[half], kFp8 ? tile_row_max<BN>(s, half, scale) : tile_row_max<kGeneral, BN>(p, s, half));
    move |= m > row_max[half];
    correction[half] = exp2f(row_max[half] - (m == -INFINITY ? 0.f : m));
    row_max[half] = m;
    row_sum[half] = row_sum[half] * correction[half] +
                    (kFp8 ? exp_row<BN>(s, half, m - kFp8Shift, scale) : exp_row<kGeneral, BN>(p, s, half, m));
  }
}

// O by the factors of the latest softmax, skipped when no row of the warp moved its max (a uniform branch)
template <int D>
__device__ __forceinline__ void rescale(float (&o)[D / 8][4], const float (&correction)[2], bool move) {
  if (__any_sync(0xffffffffu, move)) {
#pragma unroll
    for (int d = 0; d < D / 8; ++d)
#pragma unroll
      for (int c = 0; c < 4; ++c) o[d][c] *= correction[c / 2];
  }
}

// kGeneral: as in the FA2 forward (softcap, dilation, block layout, scales <= 0). T = e4m3: the FP8 forward (plain
// masks, D = 128, equal-length rows), with TO its output type: Q, K and V^T in e4m3 with per-tile scales (a.scales),
// S = Q K^T and O += P V on e4m3 wgmmas (k32), P in e4m3 with V^T's keys permuted to its fragments
// (to_fragments_e4m3).
template <typename T, int D, bool kGeneral, typename TO = T>
__global__ void __launch_bounds__(FwdTraits<T, D, TO, kGeneral>::kThreads, 1)
    fwd_kernel(const __grid_constant__ FwdArgs a) {
  static_assert(D == 64 || D == 128, "the fa3 forward is instantiated for head dims 64 and 128");
  constexpr bool kFp8 = std::is_same_v<T, e4m3>;
  static_assert(!kFp8 || (D == 128 && !kGeneral), "the FP8 forward: D = 128 (one 128-byte line a row), plain masks");
#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || defined(LEGALPT_EMULATE)  // sm_90a and the CPU emulation
  using Tr = FwdTraits<T, D, TO, kGeneral>;
  constexpr int BM = Tr::kBlockM, BN = Tr::kBlockN, kConsumerThreads = Tr::kConsumerThreads;
  constexpr int kConsumers = Tr::kConsumers, kLast = kConsumers - 1;
  static_assert(!kFp8 || BM == 128, "the FP8 scales of Q are per 128 query rows: one per block");
  const Params& p = a.p;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* sQ = smem_raw + (-smem_addr(smem_raw) & 1023);  // (BM, D), swizzled
  unsigned char* sK = sQ + BM * D * sizeof(T);                    // 2 x (BN, D)
  unsigned char* sV = sK + 2 * Tr::kTileBytes;                    // 2 x (BN, D)
  unsigned char* sO = sV + 2 * Tr::kTileBytes;                    // consumers x (64, D): each one's O
  uint64_t* bars = reinterpret_cast<uint64_t*>(sO + BM * D * sizeof(TO));
  uint64_t *q_full = bars, *q_empty = bars + 1, *k_full = bars + 2, *v_full = bars + 4, *k_empty = bars + 6,
           *v_empty = bars + 8;
  const int items = a.m_tiles * a.documents * p.heads;
  if (threadIdx.x == 0) {
    for (int i : {0, 2, 3, 4, 5}) mbar_init(bars + i);
    for (int i : {1, 6, 7, 8, 9}) mbar_init(bars + i, kConsumerThreads / 32);  // one arrival per consumer warp
    mbar_fence_init();
  }
  __syncthreads();  // the barriers are initialized; the warpgroups part here
  // Both sides walk the same items and count Q's and K/V's tiles over all of them: the buffers' phases run on.
  // An item whose tile starts past its document's end is skipped; one that visits no key tile loads nothing.

  if (threadIdx.x < 128) {  // the producer: one thread issues every copy, in the order the consumers need them
    registers_down<Tr::kProducerRegisters>();
    if (threadIdx.x != 0) return;
    unsigned nq = 0, g = 0;  // unsigned: a buffer and a phase are bits of these counts, not signed divisions
    for (int i = blockIdx.x; i < items; i += gridDim.x) {
      const FwdItem it = fwd_item(a, i);
      const Document doc = document(p, it.b);
      const Visits vis = visits(p.schedule, it.b, it.h, it.m_blk);
      if (it.m_blk * BM >= doc.lq || vis.count == 0) continue;
      const int hk = it.h / p.kv_group, batch = map_batch(p, it.b);
      // K(t) or V(t) of this item, the block's tile g + t, into buffer (g + t) % 2 once its tile g + t - 2 is done
      const auto load_kv = [&](unsigned char* tiles, uint64_t* full, uint64_t* empty, const TensorMap& map, int t) {
        const unsigned j = g + t;
        if (j >= 2) mbar_wait(empty + j % 2, (j / 2 - 1) % 2);
        mbar_expect(full + j % 2, Tr::kTileBytes);
        if constexpr (kFp8) {
          if (tiles == sV) {  // V^T: the tile's keys along the lines of D rows
            tma_load(tiles + j % 2 * Tr::kTileBytes, map, doc.k_start + vis.tiles[t] * BN, hk, 0, batch, full + j % 2);
            return;
          }
        }
        tma_load_tile<BN, D, sizeof(T)>(tiles + j % 2 * Tr::kTileBytes, map, hk, doc.k_start + vis.tiles[t] * BN,
                                        batch, full + j % 2);
      };
      if (nq > 0) mbar_wait(q_empty, (nq - 1) % 2);  // the last item's S are done
      mbar_expect(q_full, BM * D * sizeof(T));
      tma_load_tile<BM, D, sizeof(T)>(sQ, a.q, it.h, doc.q_start + it.m_blk * BM, batch, q_full);
      load_kv(sK, k_full, k_empty, a.k, 0);
      for (int t = 0; t < vis.count; ++t) {  // K runs a tile ahead of V: S(t + 1) is issued with P V(t)
        if (t + 1 < vis.count) load_kv(sK, k_full, k_empty, a.k, t + 1);
        load_kv(sV, v_full, v_empty, a.v, t);
      }
      ++nq;
      g += vis.count;
    }
    return;
  }

  registers_up<Tr::kConsumerRegisters>();
  const int wg = threadIdx.x / 128 - 1, lane = threadIdx.x % 32;  // the consumer, 0 to kLast
  // The warpgroup's 64 rows of Q (each panel holds BM rows), and the first K and V buffers
  const uint64_t q_desc = descriptor(smem_addr(sQ) + 64 * wg * 128);
  const uint64_t k_desc = descriptor(smem_addr(sK));
  const uint64_t v_desc = kFp8 ? descriptor(smem_addr(sV)) : descriptor(smem_addr(sV), BN * 128);  // V^T K-major
  // Ping-pong, around a ring of the consumers: a consumer issues its MMAs between its turn's start and the next's.
  // A turn's barrier counts the consumer that waits and the one before it that hands it over.
  const auto my_turn = [&] { named_sync(kTurn0 + wg, 256); };
  const auto your_turn = [&] { named_arrive(kTurn0 + (wg == kLast ? 0 : wg + 1), 256); };
  // Whether item i of the block visits key tiles
  const auto works = [&](int i) {
    const FwdItem it = fwd_item(a, i);
    return it.m_blk * BM < document(p, it.b).lq && visits(p.schedule, it.b, it.h, it.m_blk).count > 0;
  };
  // The last consumer hands consumer 0 its first turn of an item at the end of its last one, where the block has a
  // next item, so that consumer 0's first MMAs run beside the last consumer's epilogue
  bool handed = false;
  unsigned nq = 0, g = 0;
  for (int i = blockIdx.x; i < items; i += gridDim.x) {
    const FwdItem it = fwd_item(a, i);
    const Document doc = document(p, it.b);
    if (it.m_blk * BM >= doc.lq) continue;
    const Visits vis = visits(p.schedule, it.b, it.h, it.m_blk);
    const int m_blk = it.m_blk, b = it.b, h = it.h;
    const int i0 = m_blk * BM + 64 * wg + 16 * (threadIdx.x / 32 % 4) + lane / 4;  // the thread's rows: i0, i0 + 8
    float o[D / 8][4] = {};
    constexpr int kPk = kFp8 ? 32 : 16;  // keys per MMA of O += P V
    uint32_t pa[BN / kPk][4];            // P of the latest tile, as A fragments
    float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};  // log2 domain; row_sum: this thread's part
    float s[BN / 8][4];
    // Waits for K(t) (kv) or V(t), key tile `tile`, to land in buffer (g + t) % 2. In a varlen document's last,
    // partial tile the rows past its end are zeroed (zero_rows) by all consumers, which meet there (the condition
    // is the same for all).
    const auto landed = [&](bool kv, int t, int tile) {
      const unsigned j = g + t;
      unsigned char* buffer = (kv ? sK : sV) + j % 2 * Tr::kTileBytes;
      mbar_wait((kv ? k_full : v_full) + j % 2, j / 2 % 2);
      if (const int valid = doc.lk - tile * BN; p.cu_seqlens_k != nullptr && valid < BN) {
        zero_rows<BN, D, kConsumerThreads>(buffer, valid, threadIdx.x - 128);
        fence_proxy_async();
        named_sync(kConsumersSync, kConsumerThreads);
      }
    };
    // The consumer's warps are done with K's (kv) or V's buffer of tile t: one arrival per warp
    const auto release = [&](bool kv, int t) {
      if (lane == 0) mbar_arrive((kv ? k_empty : v_empty) + (g + t) % 2);
    };
    const auto issue_s = [&](int t) {  // S = Q K(t)^T; an MMA's k (16 bf16, 32 e4m3) is 32 bytes of a line
      const unsigned j = (g + t) % 2;
#pragma unroll
      for (int kk = 0; kk < D * int{sizeof(T)} / 32; ++kk) {
        const uint64_t qk = q_desc + ((kk / 4) * BM * 128 + (kk % 4) * 32) / 16;
        const uint64_t kd = k_desc + (j * Tr::kTileBytes + (kk / 4) * BN * 128 + (kk % 4) * 32) / 16;
        if constexpr (kFp8) {
          wgmma_ss_e4m3(s, qk, kd, kk > 0);
        } else {
          wgmma_ss<T, BN>(s, qk, kd, kk > 0);
        }
      }
      wgmma_commit();
    };
    const auto issue_pv = [&](int t) {  // O += P(t) V(t); 16 keys are 16 lines of every panel, 32 of V^T's line
      const unsigned j = (g + t) % 2;
#pragma unroll
      for (int kk = 0; kk < BN / kPk; ++kk) {
        if constexpr (kFp8) {
          wgmma_rs_e4m3(o, pa[kk], v_desc + (j * Tr::kTileBytes + kk * 32) / 16);
        } else {
          wgmma_rs<T, D>(o, pa[kk], v_desc + (j * Tr::kTileBytes + kk * 16 * 128) / 16);
        }
      }
      wgmma_commit();
    };

    float correction[2];  // the latest softmax's O factors, applied once the P V before it is done
    bool move;
    // P(t) into the A fragments of O += P(t) V(t), once P V(t - 1), which reads them, is done; O rescaled first.
    // This runs after the next copies' waits, not at the end of the softmax: ptxas hoists a wgmma wait to the start
    // of its basic block, and there it kept the softmax from overlapping P V(t - 1).
    const auto prepare_pv = [&](int t) {
      wgmma_wait<0>();
      pin<D / 8>(o);
      if (t > 0) release(false, t - 1);
      rescale<D>(o, correction, move);
      if constexpr (kFp8) {
        to_fragments_e4m3<BN>(s, pa);
      } else {
        to_fragments<T, BN>(s, pa);
      }
    };

    // The key tiles of t - 1, t and t + 1, each index read an iteration before its use: read after an mbarrier wait
    // (a memory clobber), an index is read there again, and the tile waits for the load
    int prev_tile = 0, tile = vis.count > 0 ? vis.tiles[0] : 0, next_tile = vis.count > 1 ? vis.tiles[1] : 0;
    // The FP8 forward's logits' scale of each tile (softmax scale x Q's scale x K(t)'s), read with the tile's index;
    // elsewhere to_log2
    float scale = 0.f, next_scale = 0.f;
    const float* k_scales = a.scales.k + (int64_t{b} * (p.heads / p.kv_group) + h / p.kv_group) * a.scales.k_blocks;
    const auto tile_scale = [&](int key_tile) {
      return p.scale_log2 * a.scales.q[(int64_t{b} * p.heads + h) * a.scales.q_blocks + m_blk] * k_scales[key_tile];
    };
    if constexpr (kFp8) {
      if (vis.count > 0) scale = tile_scale(tile);
      if (vis.count > 1) next_scale = tile_scale(next_tile);
    }
    if (vis.count > 0) {
      if (wg == kLast && !handed) your_turn();  // consumer 0 goes first
      mbar_wait(q_full, nq % 2);
      landed(true, 0, tile);
      my_turn();
      wgmma_fence();
      issue_s(0);
      your_turn();
      wgmma_wait<0>();
      release(true, 0);
      pin<BN / 8>(s);
      online_softmax<BN, kGeneral, kFp8>(p, s, row_max, row_sum, correction, move, 0 < vis.partial, tile, i0, doc,
                                         b, h, scale);
    }
    for (int t = 1; t < vis.count; ++t) {
      prev_tile = tile;
      tile = next_tile;
      if constexpr (kFp8) scale = next_scale;
      if (t + 1 < vis.count) {
        next_tile = vis.tiles[t + 1];
        if constexpr (kFp8) next_scale = tile_scale(next_tile);
      }
      landed(true, t, tile);
      landed(false, t - 1, prev_tile);
      prepare_pv(t - 1);
      pin<D / 8>(o);
      my_turn();
      wgmma_fence();
      issue_s(t);
      issue_pv(t - 1);
      your_turn();
      wgmma_wait<1>();  // S(t) is done; P V of the previous tile may still run
      release(true, t);
      pin<BN / 8>(s);
      online_softmax<BN, kGeneral, kFp8>(p, s, row_max, row_sum, correction, move, t < vis.partial, tile, i0, doc,
                                         b, h, scale);
    }
    if (vis.count > 0) {
      if (lane == 0) mbar_arrive(q_empty);  // every S is done: the next item's Q may come
      landed(false, vis.count - 1, tile);
      prepare_pv(vis.count - 1);
      pin<D / 8>(o);
      my_turn();
      wgmma_fence();
      issue_pv(vis.count - 1);
      // The last consumer's hand-over after the block's last item is not awaited: its arrival would be left over
      if (wg == kLast) {
        handed = false;
        for (int j = i + gridDim.x; j < items && !handed; j += gridDim.x) handed = works(j);
      }
      if (wg != kLast || handed) your_turn();
      wgmma_wait<0>();
      pin<D / 8>(o);
      release(false, vis.count - 1);
      ++nq;
      g += vis.count;
    }

    float2 inv;
    if constexpr (kFp8) {  // the logsumexp without P's shift; O times V's scale
      const float unshifted[2] = {row_max[0] - kFp8Shift, row_max[1] - kFp8Shift};
      const float v_scale = a.scales.v[int64_t{b} * (p.heads / p.kv_group) + h / p.kv_group];
      inv = finish_rows(p, unshifted, row_sum, i0, doc, b, h);
      inv.x *= v_scale;
      inv.y *= v_scale;
    } else {
      inv = finish_rows(p, row_max, row_sum, i0, doc, b, h);
    }
    // A whole query tile's O goes out by TMA: 128-byte lines instead of every thread's 4-byte stores. Each consumer
    // stores its 64 rows from its part of sO, issued and awaited by its first thread, so that the consumers do not
    // meet between items. A tile past a varlen document's end keeps fa2's stores.
    if (p.cu_seqlens_q == nullptr || (m_blk + 1) * BM <= doc.lq) {
#pragma unroll
      for (int d = 0; d < D / 8; ++d)
#pragma unroll
        for (int c = 0; c < 4; ++c) o[d][c] *= c < 2 ? inv.x : inv.y;
      constexpr int kRows = Tr::kConsumerRows;
      unsigned char* so = sO + wg * kRows * D * sizeof(TO);  // (kRows, D), swizzled
      if (threadIdx.x % 128 == 0) bulk_wait_read<0>();   // the consumer's last store has read it
      named_sync(kOStored0 + wg, 128);
      store_swizzled<TO, kRows, D>(so, o, 16 * (threadIdx.x / 32 % 4));
      fence_proxy_async();
      named_sync(kOStored0 + wg, 128);  // the consumer's rows are stored
      if (threadIdx.x % 128 == 0) {
        tma_store_tile<kRows, D>(a.o, so, h, doc.q_start + m_blk * BM + kRows * wg, map_batch(p, b));
        bulk_commit();
      }
    } else {
      store_rows<TO, D>(p, o, inv, i0, doc, b, h);
    }
  }
  if (threadIdx.x % 128 == 0) bulk_wait_read<0>();  // before the block's shared memory goes
#elif defined(__CUDA_ARCH__)
  __trap();  // another target's code: fa3.check never launches it there, and it must not pass silently
#endif
}

}  // namespace legalpt::fa3
