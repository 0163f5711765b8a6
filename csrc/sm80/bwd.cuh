// FA2 backward: one thread block per (key tile, document, key head), accumulating dK and dV in registers while
// it visits the query tiles of every query head of its group. Split over several blocks whose parts of dK and dV
// are added in float32 (dkv_split): the key tiles of global tokens, which every query tile visits (`split_tiles` x
// `split_chunks` of each row), and under a causal GQA mask every key tile, a block per `split_heads` query heads.
// Per visited query tile, recomputed from Q, K and the saved logsumexp:
//   S = Q K^T, P = exp2(S - lse), dP = dO V^T, dS = P (dP - delta) * d(logit)/d(q.k)
//   dV += P^T dO, dK += dS^T Q, dQ += dS K   (dQ: float32 atomics into dq_accum)
// 8 warps, in one of two layouts (BwdTraits::kTwoLevel):
// - two-level, head dims 64 and 128 (FA2's layout): S and dP over (BM / 32) x (8 warps / that) warps of 32 queries
//   each (d128: 64-row tiles, 2 x 4 warps of 32 keys; d64: 128-row tiles, 4 x 2 warps of 64 keys); P and dS go
//   through shared memory; then dK/dV over 4 x 2 warps of 32 keys x D/2 and dQ over the same warp grid as S, each
//   warp 32 rows. Each fragment read from shared memory serves two m16 tiles, and a query tile costs 2 barriers.
// - one-level, the other head dims: each warp owns 16 keys; S^T and dP^T stay in registers as the A operands of dV
//   and dK, and dS^T goes through shared memory for dQ (4 row groups x 2 column halves). Over D = 128, 64 keys
//   per block and the dK/dV columns split in two halves.
// With `deterministic`, dQ comes instead from `dq_kernel`: one block per query tile that owns its rows of dQ and
// adds the key tiles in a fixed order (S and dP are computed twice, the price of bitwise-repeatable gradients).
#pragma once

#include "../common/backward.cuh"
#include "fwd.cuh"

namespace legalpt::fa2 {

template <typename T, int D>
struct BwdTraits {
  static constexpr bool kTwoLevel = D == 64 || D == 128;  // dQ's columns per warp (D/4 or D/2) need D % 64 == 0
  // Query rows per visited tile. 128 at d64 (FA2's on sm90): bwd 0.86-0.91x SDPA flash on the H200, 0.73-0.76x with 64
  static constexpr int kBlockM = kTwoLevel && D == 64 ? 128 : 64;
  static constexpr int kWarps = 8;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kKeysPerWarp = kTwoLevel ? 32 : 16;         // dK/dV rows per warp
  static constexpr int kColParts = kTwoLevel || D > 128 ? 2 : 1;   // dK/dV column split: D/parts accumulators a key
  static constexpr int kKeyWarps = kWarps / kColParts;
  static constexpr int kCols = D / kColParts;  // dK/dV columns per warp
  // A warp's dK (or dV) accumulators: kKeysPerWarp keys (m16 tiles) x kCols columns (n8 tiles), mma layout
  using Acc = float[kKeysPerWarp / 16][kCols / 8][4];
  // The first key (within the tile) and the first column of a warp's dK and dV
  __device__ static int key0(int warp) { return (warp % kKeyWarps) * kKeysPerWarp; }
  __device__ static int col0(int warp) { return (warp / kKeyWarps) * kCols; }
  static constexpr int kBlockN = kKeysPerWarp * kKeyWarps;  // keys per block: 128 up to D = 128, so that a Q/dO copy
                                                            // and a dQ atomic serve many keys; 64 over
  // the score gradients' scratch: P and dS, (BM, BN + 8) each, when two-level; else dS^T, (BN, BM + 8)
  static constexpr int kScratch = kTwoLevel ? 2 * kBlockM * (kBlockN + 8) : kBlockN * (kBlockM + 8);
  // K, V; Q, dO, logsumexp and delta twice (the next query tile loads while this one computes); the scratch
  static constexpr int kSmem = 2 * kBlockN * (D + 8) * sizeof(T) +
                               2 * (2 * kBlockM * (D + 8) * sizeof(T) + 2 * kBlockM * sizeof(float)) +
                               kScratch * sizeof(T);
};

// The backward's blocks per document and key head (both paths'): one per key tile of BwdTraits' keys, and the split
// key tiles' extra parts.
template <int D>
__host__ __device__ __forceinline__ int key_blocks(const Params& p) {
  constexpr int kKeys = BwdTraits<__half, D>::kBlockN;
  return (p.seqlen_k + kKeys - 1) / kKeys + p.split_tiles * (p.split_chunks - 1);
}

// What every warp of a backward block shares: the key tile in shared memory, the score gradients' scratch.
template <typename T>
struct BwdBlock {
  Document doc;
  int b, n_blk;
  const T* sK;  // (BN, D + 8)
  const T* sV;  // (BN, D + 8)
  T* scratch;   // BwdTraits::kScratch
};

// One visited query tile: its stage in shared memory, its head and position.
template <typename T>
struct BwdTile {
  const T* sQ;           // (BM, D + 8)
  const T* sdO;          // (BM, D + 8)
  const float* sLse;     // (BM) log2 domain
  const float* sDelta;   // (BM)
  int h, m_blk;
  bool partial;          // the mask cuts through the tile: apply the element rule
};

// dQ rows of a warp into dq_accum: MT m16 tiles from row i0 (within the document), DQ columns from dq0.
template <int MT, int DQ>
__device__ __forceinline__ void add_dq(const Params& p, const float (&dq)[MT][DQ / 8][4], const Document& doc, int b,
                                       int h, int i0, int dq0) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int i = i0 + 16 * m + lane / 4 + 8 * r;
      if (i >= doc.lq) continue;
      float* out = row_ptr<float>(p.dq_accum, b, doc.q_start, i, h) + dq0 + 2 * (lane % 4);
#pragma unroll
      for (int n = 0; n < DQ / 8; ++n) atomic_add2(out + 8 * n, dq[m][n][2 * r], dq[m][n][2 * r + 1]);
    }
}

// Two-level, first part: S and dP of the warp's 32 queries x SK keys, P and dS into the scratch, then dV and dK of
// its 32 keys x D/2 columns.
template <typename T, int D, bool kGeneral>
__device__ __forceinline__ void kv_grads_two_level(const Params& p, const BwdBlock<T>& blk, const BwdTile<T>& tile,
                                                   typename BwdTraits<T, D>::Acc& dk,
                                                   typename BwdTraits<T, D>::Acc& dv) {
  using Tr = BwdTraits<T, D>;
  constexpr int BM = Tr::kBlockM, BN = Tr::kBlockN, DP = D + 8, PP = BN + 8;
  constexpr int SW = BM / 32, SK = BN / (Tr::kWarps / SW);  // S/dP: warps along the queries, keys of a warp
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int sq0 = (warp % SW) * 32, sk0 = (warp / SW) * SK;  // S/dP: the warp's queries and keys in the tiles
  const int key0 = Tr::key0(warp), d0 = Tr::col0(warp);  // dK/dV: the warp's 32 keys and D/2 columns
  T* sP = blk.scratch;      // (BM, PP)
  T* sdS = sP + BM * PP;    // (BM, PP)

  float s[2][SK / 8][4] = {}, dp[2][SK / 8][4] = {};  // S and dP: (32 queries, SK keys)
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t aq[2][4], ao[2][4];
#pragma unroll
    for (int m = 0; m < 2; ++m) {
      ldmatrix_x4(aq[m], tile.sQ + (sq0 + 16 * m + (lane & 15)) * DP + kk * 16 + (lane >> 4) * 8);
      ldmatrix_x4(ao[m], tile.sdO + (sq0 + 16 * m + (lane & 15)) * DP + kk * 16 + (lane >> 4) * 8);
    }
#pragma unroll
    for (int nj = 0; nj < SK / 16; ++nj) {
      const int offset = (sk0 + nj * 16 + (lane & 7) + (lane >> 4) * 8) * DP + kk * 16 + ((lane >> 3) & 1) * 8;
      uint32_t bk[4], bv[4];
      ldmatrix_x4(bk, blk.sK + offset);
      ldmatrix_x4(bv, blk.sV + offset);
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        mma_16x16<T>(s[m][2 * nj], s[m][2 * nj + 1], aq[m], bk);
        mma_16x16<T>(dp[m][2 * nj], dp[m][2 * nj + 1], ao[m], bv);
      }
    }
  }

#pragma unroll
  for (int m = 0; m < 2; ++m) {
    float lse[2], delta[2];  // of the thread's two query rows
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      lse[r] = tile.sLse[sq0 + 16 * m + lane / 4 + 8 * r];
      delta[r] = tile.sDelta[sq0 + 16 * m + lane / 4 + 8 * r];
    }
#pragma unroll
    for (int n = 0; n < SK / 8; ++n)
#pragma unroll
      for (int c = 0; c < 4; ++c) score_grads<kGeneral>(p, s[m][n][c], dp[m][n][c], lse[c >> 1], delta[c >> 1]);
    if (tile.partial) {
      mask_rows<kGeneral, SK>(p, tile.m_blk * BM + sq0 + 16 * m, blk.n_blk * BN + sk0, blk.doc, blk.b, tile.h,
                              [&](int n, int c) { s[m][n][c] = dp[m][n][c] = 0.f; });
    }
#pragma unroll
    for (int n = 0; n < SK / 8; ++n)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int at = (sq0 + 16 * m + lane / 4 + 8 * r) * PP + sk0 + 8 * n + 2 * (lane % 4);
        *reinterpret_cast<uint32_t*>(sP + at) = pack2<T>(s[m][n][2 * r], s[m][n][2 * r + 1]);
        *reinterpret_cast<uint32_t*>(sdS + at) = pack2<T>(dp[m][n][2 * r], dp[m][n][2 * r + 1]);
      }
  }
  __syncthreads();  // P and dS complete

  // dV += P^T dO and dK += dS^T Q: the A operands (keys x queries) read transposed from sP and sdS
#pragma unroll
  for (int kq = 0; kq < BM / 16; ++kq) {
    uint32_t ap[2][4], as[2][4];
#pragma unroll
    for (int m = 0; m < 2; ++m) {
      const int offset = (kq * 16 + (lane & 7) + (lane >> 4) * 8) * PP + key0 + 16 * m + ((lane >> 3) & 1) * 8;
      ldmatrix_x4_trans(ap[m], sP + offset);
      ldmatrix_x4_trans(as[m], sdS + offset);
    }
#pragma unroll
    for (int nd = 0; nd < D / 32; ++nd) {
      const int offset = (kq * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * DP + d0 + nd * 16 + (lane >> 4) * 8;
      uint32_t bo[4], bq[4];
      ldmatrix_x4_trans(bo, tile.sdO + offset);
      ldmatrix_x4_trans(bq, tile.sQ + offset);
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        mma_16x16<T>(dv[m][2 * nd], dv[m][2 * nd + 1], ap[m], bo);
        mma_16x16<T>(dk[m][2 * nd], dk[m][2 * nd + 1], as[m], bq);
      }
    }
  }
}

// Two-level, second part: dQ += dS K of the warp's 32 rows x DQ columns (D/4 at d128, D/2 at d64), dS from the
// scratch.
template <typename T, int D>
__device__ __forceinline__ void q_grads_two_level(const Params& p, const BwdBlock<T>& blk, const BwdTile<T>& tile) {
  using Tr = BwdTraits<T, D>;
  constexpr int BM = Tr::kBlockM, BN = Tr::kBlockN, DP = D + 8, PP = BN + 8;
  constexpr int QW = BM / 32, DQ = D / (Tr::kWarps / QW);  // warps along the rows, columns of a warp
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int q0 = (warp % QW) * 32, dq0 = (warp / QW) * DQ;
  const T* sdS = blk.scratch + BM * PP;
  float dq[2][DQ / 8][4] = {};
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) {
    uint32_t a[2][4];
#pragma unroll
    for (int m = 0; m < 2; ++m) ldmatrix_x4(a[m], sdS + (q0 + 16 * m + (lane & 15)) * PP + kk * 16 + (lane >> 4) * 8);
#pragma unroll
    for (int nd = 0; nd < DQ / 16; ++nd) {
      uint32_t bk[4];
      ldmatrix_x4_trans(bk, blk.sK + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * DP + dq0 + nd * 16 +
                                (lane >> 4) * 8);
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        mma_16x16<T>(dq[m][2 * nd], dq[m][2 * nd + 1], a[m], bk);
      }
    }
  }
  add_dq<2, DQ>(p, dq, blk.doc, blk.b, tile.h, tile.m_blk * BM + q0, dq0);
}

// One-level, first part: S^T and dP^T of the warp's 16 keys x BM queries, then dV and dK of its 16 keys x D/parts
// columns with P^T and dS^T as register A operands; dS^T into the scratch for dQ.
template <typename T, int D, bool kGeneral>
__device__ __forceinline__ void kv_grads_one_level(const Params& p, const BwdBlock<T>& blk, const BwdTile<T>& tile,
                                                   typename BwdTraits<T, D>::Acc& dk,
                                                   typename BwdTraits<T, D>::Acc& dv) {
  using Tr = BwdTraits<T, D>;
  constexpr int BM = Tr::kBlockM, BN = Tr::kBlockN, DP = D + 8, SP = BM + 8, DW = Tr::kCols;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int key0 = Tr::key0(warp), d0 = Tr::col0(warp);
  float st[BM / 8][4] = {}, dpt[BM / 8][4] = {};  // S^T and dP^T: (16 keys, BM queries)
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t ak[4], av[4];
    ldmatrix_x4(ak, blk.sK + (key0 + (lane & 15)) * DP + kk * 16 + (lane >> 4) * 8);
    ldmatrix_x4(av, blk.sV + (key0 + (lane & 15)) * DP + kk * 16 + (lane >> 4) * 8);
#pragma unroll
    for (int nj = 0; nj < BM / 16; ++nj) {
      const int offset = (nj * 16 + (lane & 7) + (lane >> 4) * 8) * DP + kk * 16 + ((lane >> 3) & 1) * 8;
      uint32_t bq[4], bo[4];
      ldmatrix_x4(bq, tile.sQ + offset);
      ldmatrix_x4(bo, tile.sdO + offset);
      mma_16x16<T>(st[2 * nj], st[2 * nj + 1], ak, bq);
      mma_16x16<T>(dpt[2 * nj], dpt[2 * nj + 1], av, bo);
    }
  }
#pragma unroll
  for (int n = 0; n < BM / 8; ++n)
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int col = n * 8 + 2 * (lane % 4) + (c & 1);  // query within the tile
      score_grads<kGeneral>(p, st[n][c], dpt[n][c], tile.sLse[col], tile.sDelta[col]);
    }
  if (tile.partial) {
    mask_transposed<kGeneral, BM>(p, tile.m_blk * BM, blk.n_blk * BN + key0, blk.doc, blk.b, tile.h,
                                  [&](int n, int c) { st[n][c] = dpt[n][c] = 0.f; });
  }
#pragma unroll
  for (int kq = 0; kq < BM / 16; ++kq) {
    const uint32_t ap[4] = {pack2<T>(st[2 * kq][0], st[2 * kq][1]), pack2<T>(st[2 * kq][2], st[2 * kq][3]),
                            pack2<T>(st[2 * kq + 1][0], st[2 * kq + 1][1]),
                            pack2<T>(st[2 * kq + 1][2], st[2 * kq + 1][3])};
    const uint32_t as[4] = {pack2<T>(dpt[2 * kq][0], dpt[2 * kq][1]), pack2<T>(dpt[2 * kq][2], dpt[2 * kq][3]),
                            pack2<T>(dpt[2 * kq + 1][0], dpt[2 * kq + 1][1]),
                            pack2<T>(dpt[2 * kq + 1][2], dpt[2 * kq + 1][3])};
#pragma unroll
    for (int nd = 0; nd < DW / 16; ++nd) {
      const int offset = (kq * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * DP + d0 + nd * 16 + (lane >> 4) * 8;
      uint32_t bo[4], bq[4];
      ldmatrix_x4_trans(bo, tile.sdO + offset);
      ldmatrix_x4_trans(bq, tile.sQ + offset);
      mma_16x16<T>(dv[0][2 * nd], dv[0][2 * nd + 1], ap, bo);
      mma_16x16<T>(dk[0][2 * nd], dk[0][2 * nd + 1], as, bq);
    }
    if (d0 == 0 && !p.deterministic) {  // one copy of dS^T for dQ
      T* row = blk.scratch + (key0 + lane / 4) * SP + kq * 16 + 2 * (lane % 4);
      *reinterpret_cast<uint32_t*>(row) = as[0];
      *reinterpret_cast<uint32_t*>(row + 8 * SP) = as[1];
      *reinterpret_cast<uint32_t*>(row + 8) = as[2];
      *reinterpret_cast<uint32_t*>(row + 8 * SP + 8) = as[3];
    }
  }
}

// One-level, second part: dQ += dS K of the warp's 16 rows x D/2 columns, dS^T from the scratch.
template <typename T, int D>
__device__ __forceinline__ void q_grads_one_level(const Params& p, const BwdBlock<T>& blk, const BwdTile<T>& tile) {
  using Tr = BwdTraits<T, D>;
  constexpr int BM = Tr::kBlockM, BN = Tr::kBlockN, DP = D + 8, SP = BM + 8, DQ = D / 2;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int q0 = (warp % 4) * 16, dq0 = (warp / 4) * DQ;
  __syncthreads();  // dS^T complete
  float dq[1][DQ / 8][4] = {};
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) {
    uint32_t a[4];
    ldmatrix_x4_trans(a, blk.scratch + (kk * 16 + (lane & 7) + (lane >> 4) * 8) * SP + q0 + ((lane >> 3) & 1) * 8);
#pragma unroll
    for (int nd = 0; nd < DQ / 16; ++nd) {
      uint32_t bk[4];
      ldmatrix_x4_trans(bk, blk.sK + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * DP + dq0 + nd * 16 +
                                (lane >> 4) * 8);
      mma_16x16<T>(dq[0][2 * nd], dq[0][2 * nd + 1], a, bk);
    }
  }
  add_dq<1, DQ>(p, dq, blk.doc, blk.b, tile.h, tile.m_blk * BM + q0, dq0);
}

template <typename T, int D, bool kGeneral>  // kGeneral: as for fwd_kernel
__global__ void __launch_bounds__(BwdTraits<T, D>::kThreads) bwd_kernel(const __grid_constant__ Params p) {
  using Tr = BwdTraits<T, D>;
  constexpr int BM = Tr::kBlockM, BN = Tr::kBlockN, DP = D + 8, NT = Tr::kThreads;
  constexpr int KT = Tr::kKeysPerWarp / 16, DW = Tr::kCols;  // dK/dV of a warp: KT m16 tiles x DW columns
  extern __shared__ __align__(16) unsigned char smem[];
  T* sK = reinterpret_cast<T*>(smem);  // (BN, DP)
  T* sV = sK + BN * DP;                // (BN, DP)
  T* sQ0 = sV + BN * DP;               // (2, BM, DP): two stages
  T* sdO0 = sQ0 + 2 * BM * DP;         // (2, BM, DP)
  T* scratch = sdO0 + 2 * BM * DP;     // Tr::kScratch
  float* sLse0 = reinterpret_cast<float*>(scratch + Tr::kScratch);  // (2, BM) log2 domain
  float* sDelta0 = sLse0 + 2 * BM;                                  // (2, BM)

  // A 1-D grid (bwd_block_index): the split key tiles' parts first, then the whole key tiles, each over every
  // document and key head.
  const int blocks = key_blocks<D>(p), documents = gridDim.x / (blocks * (p.heads / p.kv_group));
  const BwdBlockIndex index = bwd_block_index(p, blockIdx.x, blocks, documents);
  const int b = index.b, hk = index.hk, n_blk = index.n_blk, chunk = index.chunk;
  const bool split = index.split;
  const BwdBlock<T> blk{document(p, b), b, n_blk, sK, sV, scratch};
  const Document& doc = blk.doc;
  if (n_blk * BN >= doc.lk) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int key0 = Tr::key0(warp), d0 = Tr::col0(warp);

  load_tile<T, BN, D, NT>(sK, row_ptr<const T>(p.k, b, doc.k_start, n_blk * BN, hk), p.k.row_stride,
                          doc.lk - n_blk * BN);
  load_tile<T, BN, D, NT>(sV, row_ptr<const T>(p.v, b, doc.k_start, n_blk * BN, hk), p.v.row_stride,
                          doc.lk - n_blk * BN);
  cp_async_commit();

  // Copies of one query tile of one head into stage `stage`: Q, dO, and its rows' logsumexp and delta.
  auto load_query_tile = [&](const BwdWork& w, int stage) {
    const int h = hk * p.kv_group + w.g, valid = doc.lq - w.tile * BM;
    load_tile<T, BM, D, NT>(sQ0 + stage * BM * DP, row_ptr<const T>(p.q, b, doc.q_start, w.tile * BM, h),
                            p.q.row_stride, valid);
    load_tile<T, BM, D, NT>(sdO0 + stage * BM * DP, row_ptr<const T>(p.o, b, doc.q_start, w.tile * BM, h),
                            p.o.row_stride, valid);
    for (int r = threadIdx.x; r < BM; r += NT) {  // rows past the document read 0: the mask zeroes their P
      const int64_t at = b * p.lse_batch_stride + h * p.lse_head_stride + doc.q_start + w.tile * BM + r;
      cp_async4(sLse0 + stage * BM + r, p.lse_log2 + at, r < valid);
      cp_async4(sDelta0 + stage * BM + r, p.delta + at, r < valid);
    }
    cp_async_commit();
  };

  typename Tr::Acc dk = {}, dv = {};  // rows key0 + 16 m + lane/4 (+8), cols d0 + 8 n + 2 (lane % 4) (+1)
  BwdWork work{-1, 0, 0, 0, {}};
  advance(p, work, b, hk, n_blk, chunk);  // to the first pair, if any
  BwdWork next = work;
  advance(p, next, b, hk, n_blk, chunk);
  if (work.g < p.kv_group) load_query_tile(work, 0);
  for (int stage = 0; work.g < p.kv_group; stage ^= 1) {
    cp_async_wait<0>();
    __syncthreads();  // this stage has landed; every warp is done with the other stage and the scratch
    if (next.g < p.kv_group) load_query_tile(next, stage ^ 1);
    const BwdTile<T> tile{sQ0 + stage * BM * DP, sdO0 + stage * BM * DP, sLse0 + stage * BM, sDelta0 + stage * BM,
                          hk * p.kv_group + work.g, work.tile, work.t < work.vis.partial};
    if constexpr (Tr::kTwoLevel) {
      kv_grads_two_level<T, D, kGeneral>(p, blk, tile, dk, dv);
    } else {
      kv_grads_one_level<T, D, kGeneral>(p, blk, tile, dk, dv);
    }
    BwdWork after = next;
    advance(p, after, b, hk, n_blk, chunk);  // its tile index is read here, behind dQ, and needed an iteration later
    if (!p.deterministic) {
      if constexpr (Tr::kTwoLevel) {
        q_grads_two_level<T, D>(p, blk, tile);
      } else {
        q_grads_one_level<T, D>(p, blk, tile);
      }
    }
    work = next;
    next = after;
  }
  cp_async_wait<0>();

  store_dkv<T, KT, DW, D>(p, dk, dv, doc, b, hk, n_blk * BN + key0, d0, split);
}

// dK and dV of the split key tiles, from their float32 sums in dkv_split: one block per (row, document), a thread
// per pair of columns.
template <typename T, int D>
__global__ void split_dkv_kernel(const __grid_constant__ Params p) {
  const int j = blockIdx.x, b = blockIdx.y;
  const Document doc = document(p, b);
  if (j >= doc.lk) return;
  const int kv_heads = p.heads / p.kv_group;
  for (int e = threadIdx.x; e < kv_heads * D; e += blockDim.x) {  // (key head, dK or dV, column pair)
    const int hk = e / D, which = e / (D / 2) % 2, d = 2 * (e % (D / 2));
    const float* sum = row_ptr<float>(p.dkv_split, b, p.split_heads > 0 ? doc.k_start : 0, j, hk) + which * D + d;
    T* out = row_ptr<T>(which ? p.dv : p.dk, b, doc.k_start, j, hk) + d;
    *reinterpret_cast<uint32_t*>(out) = pack2<T>(sum[0], sum[1]);
  }
}

// dQ alone, for deterministic gradients: one thread block per (query tile, document, head), 8 warps of 16 rows,
// visiting the key tiles of the forward schedule in order. dS stays in registers and is the A operand of dS K.
template <typename T, int D>
struct DqTraits {
  static constexpr int kBlockM = FwdTraits<T, D>::kBlockM;  // the forward's tiles: dq_kernel walks its schedule
  static constexpr int kBlockN = FwdTraits<T, D>::kBlockN;
  static constexpr int kThreads = kBlockM / 16 * 32;         // warps of 16 rows
  static constexpr int kSmem = 2 * (kBlockM + kBlockN) * (D + 8) * sizeof(T);  // Q, dO; K, V
};

template <typename T, int D, bool kGeneral>
__global__ void __launch_bounds__(DqTraits<T, D>::kThreads, 1) dq_kernel(const __grid_constant__ Params p) {
  using Tr = DqTraits<T, D>;
  constexpr int BM = Tr::kBlockM, BN = Tr::kBlockN, DP = D + 8, NT = Tr::kThreads;
  extern __shared__ __align__(16) unsigned char smem[];
  T* sQ = reinterpret_cast<T*>(smem);  // (BM, DP)
  T* sdO = sQ + BM * DP;               // (BM, DP)
  T* sK = sdO + BM * DP;               // (BN, DP)
  T* sV = sK + BN * DP;                // (BN, DP)

  const int m_blk = gridDim.x - 1 - blockIdx.x;
  const int b = blockIdx.y, h = blockIdx.z, hk = h / p.kv_group;
  const Document doc = document(p, b);
  if (m_blk * BM >= doc.lq) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int r0 = warp * 16;
  const Visits vis = visits(p.schedule, b, h, m_blk);
  load_tile<T, BM, D, NT>(sQ, row_ptr<const T>(p.q, b, doc.q_start, m_blk * BM, h), p.q.row_stride,
                          doc.lq - m_blk * BM);
  load_tile<T, BM, D, NT>(sdO, row_ptr<const T>(p.o, b, doc.q_start, m_blk * BM, h), p.o.row_stride,
                          doc.lq - m_blk * BM);
  cp_async_commit();
  float lse[2], delta[2];  // the thread's two rows: log2-domain logsumexp (+inf: P = 0) and delta
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = m_blk * BM + r0 + lane / 4 + 8 * r;
    const int64_t at = b * p.lse_batch_stride + h * p.lse_head_stride + doc.q_start + i;
    lse[r] = i < doc.lq ? p.lse_log2[at] : INFINITY;
    delta[r] = i < doc.lq ? p.delta[at] : 0.f;
  }
  const T* k = row_ptr<const T>(p.k, b, doc.k_start, 0, hk);
  const T* v = row_ptr<const T>(p.v, b, doc.k_start, 0, hk);

  float dq[D / 8][4] = {};
  for (int t = 0; t < vis.count; ++t) {
    const int n = vis.tiles[t] * BN;
    __syncthreads();  // every warp is done with the previous K and V
    load_tile<T, BN, D, NT>(sK, k + n * p.k.row_stride, p.k.row_stride, doc.lk - n);
    load_tile<T, BN, D, NT>(sV, v + n * p.v.row_stride, p.v.row_stride, doc.lk - n);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();

    float s[BN / 8][4] = {}, dp[BN / 8][4] = {};  // S and dP: (16, BN) per warp
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t aq[4], ao[4];
      ldmatrix_x4(aq, sQ + (r0 + (lane & 15)) * DP + kk * 16 + (lane >> 4) * 8);
      ldmatrix_x4(ao, sdO + (r0 + (lane & 15)) * DP + kk * 16 + (lane >> 4) * 8);
#pragma unroll
      for (int nj = 0; nj < BN / 16; ++nj) {
        const int offset = (nj * 16 + (lane & 7) + (lane >> 4) * 8) * DP + kk * 16 + ((lane >> 3) & 1) * 8;
        uint32_t bk[4], bv[4];
        ldmatrix_x4(bk, sK + offset);
        ldmatrix_x4(bv, sV + offset);
        mma_16x16<T>(s[2 * nj], s[2 * nj + 1], aq, bk);
        mma_16x16<T>(dp[2 * nj], dp[2 * nj + 1], ao, bv);
      }
    }
#pragma unroll
    for (int nn = 0; nn < BN / 8; ++nn)
#pragma unroll
      for (int c = 0; c < 4; ++c) score_grads<kGeneral>(p, s[nn][c], dp[nn][c], lse[c >> 1], delta[c >> 1]);
    if (t < vis.partial) {
      mask_rows<kGeneral, BN>(p, m_blk * BM + r0, n, doc, b, h, [&](int nn, int c) { dp[nn][c] = 0.f; });
    }
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      const uint32_t a[4] = {pack2<T>(dp[2 * kk][0], dp[2 * kk][1]), pack2<T>(dp[2 * kk][2], dp[2 * kk][3]),
                             pack2<T>(dp[2 * kk + 1][0], dp[2 * kk + 1][1]),
                             pack2<T>(dp[2 * kk + 1][2], dp[2 * kk + 1][3])};
#pragma unroll
      for (int nd = 0; nd < D / 16; ++nd) {
        uint32_t bk[4];
        ldmatrix_x4_trans(bk, sK + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * DP + nd * 16 + (lane >> 4) * 8);
        mma_16x16<T>(dq[2 * nd], dq[2 * nd + 1], a, bk);
      }
    }
  }
  cp_async_wait<0>();
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = m_blk * BM + r0 + lane / 4 + 8 * r;
    if (i >= doc.lq) continue;
    float* out = row_ptr<float>(p.dq_accum, b, doc.q_start, i, h) + 2 * (lane % 4);
#pragma unroll
    for (int d = 0; d < D / 8; ++d) *reinterpret_cast<float2*>(out + 8 * d) = make_float2(dq[d][2 * r], dq[d][2 * r + 1]);
  }
}

// The backward's preprocessing: per (query row, head), delta = rowsum(dO * O) - dlse and the log2-domain
// logsumexp the kernels subtract (+inf where the row sees no key). `group` lanes per row and head (a power of two
// <= 32), float32 sums. With kVec = 8 each lane reads 16-byte chunks, kChunks of them (of O and of dO) issued before
// the first product, so that a row takes one round trip to memory and a lane has 64 bytes in flight (a loop of 2-byte
// reads made this pass latency-bound; one chunk per lane left it at 2.6 TB/s); kVec = 1 serves unaligned rows.
// Pairs are taken in tiles of kPrepRows rows by every head, head by head within a tile: neighbouring lanes write
// neighbouring words of logsumexp and delta (laid out head-major), and the blocks at work at once read a few
// contiguous megabytes of O and dO (whole rows of every head) instead of one head's 128 bytes of every row, a
// memory page each. The pass also zeroes dq_accum, which the backward adds into: its stores go out beside the reads,
// where a fill of its own was one more pass over memory (117 us of a 64k, d64 backward's 6.4 ms).
constexpr int kPrepRows = 32;
constexpr int kPrepThreads = 256;  // per block
constexpr int kPrepChunks = 2;     // chunks of 8 per lane where the rows are aligned
struct PrepArgs {
  Tensor4 out, dout;         // the forward's output and its gradient (unpadded head dim)
  const float* lse;          // (B, H, Sq) or (H, total_q)
  const float* dlse;         // like lse, or nullptr
  float* lse_log2;           // written, like lse
  float* delta;              // written, like lse
  int64_t lse_batch_stride, lse_head_stride;
  int seqlen_q;              // rows per batch row; 0 for a packed varlen axis
  int rows, heads, head_dim; // rows: B * Sq or total_q
  int group;                 // lanes per (row, head)
  float4* dq_accum;          // zeroed, in 16-byte chunks (the whole buffer, padded head dim included)
  int64_t dq_chunks;         // its size in chunks
};

template <typename T, int kVec, int kChunks>
__global__ void bwd_prep_kernel(const __grid_constant__ PrepArgs a) {
  const int64_t pair = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / a.group;
  const int member = threadIdx.x % a.group;
  const int64_t tile = pair / (kPrepRows * a.heads), in_tile = pair % (kPrepRows * a.heads);
  const int h = static_cast<int>(in_tile / kPrepRows);
  const int row = static_cast<int>(tile * kPrepRows + in_tile % kPrepRows);
  const bool valid = row < a.rows;  // a warp's lanes all reach the shuffles
  const int b = a.seqlen_q > 0 ? row / a.seqlen_q : 0, i = a.seqlen_q > 0 ? row % a.seqlen_q : row;
  const int64_t at = b * a.lse_batch_stride + h * a.lse_head_stride + i;
  // The row's logsumexp (and dlse) read before O and dO, so that both reads are in flight at once: read after the
  // sum, they were a second round trip through memory per block, which made this pass latency-bound.
  float lse = 0.f, dlse = 0.f;
  if (valid && member == 0) {
    lse = a.lse[at];
    if (a.dlse != nullptr) dlse = a.dlse[at];
  }
  float sum = 0.f;
  if (valid) {
    const T* o = row_ptr<const T>(a.out, b, 0, i, h);
    const T* d = row_ptr<const T>(a.dout, b, 0, i, h);
    constexpr int kStride = kChunks * kVec;  // elements a lane covers per pass, in units of the group
    for (int c0 = member * kVec; c0 < a.head_dim; c0 += a.group * kStride) {
      Chunk<T, kVec> x[kChunks], y[kChunks];
#pragma unroll
      for (int j = 0; j < kChunks; ++j) {
        if (const int c = c0 + j * a.group * kVec; c < a.head_dim) {
          x[j] = *reinterpret_cast<const Chunk<T, kVec>*>(o + c);
          y[j] = *reinterpret_cast<const Chunk<T, kVec>*>(d + c);
        }
      }
#pragma unroll
      for (int j = 0; j < kChunks; ++j) {
        if (c0 + j * a.group * kVec < a.head_dim) {
#pragma unroll
          for (int e = 0; e < kVec; ++e) sum += to_float(x[j].x[e]) * to_float(y[j].x[e]);
        }
      }
    }
  }
  for (int offset = a.group / 2; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffff, sum, offset);
  if (valid && member == 0) {
    a.lse_log2[at] = lse == -INFINITY ? INFINITY : lse * kLog2e;
    a.delta[at] = sum - dlse;
  }
  const int64_t threads = static_cast<int64_t>(gridDim.x) * blockDim.x;  // a grid stride: each warp's 512 bytes
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < a.dq_chunks; c += threads) {
    a.dq_accum[c] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
}

}  // namespace legalpt::fa2
