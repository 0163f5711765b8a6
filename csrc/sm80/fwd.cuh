// FA2 forward: one thread block per (query tile, document, head); each warp owns 16 * kRowTiles query rows.
//
// Per visited key tile: S = Q K^T on the tensor cores (ldmatrix + mma.sync m16n8k16; each K fragment read from
// shared memory serves all of the warp's row tiles), the element rule on partial tiles only (a per-row key range,
// RowMask), online softmax in the log2 domain (running max and sum per row; O is rescaled only when a row's max
// moves, under a warp vote), O += P V with P straight from registers. K and V have one shared buffer each and
// their copies overlap compute: V(t) loads during S(t), K(t+1) during softmax and P V(t); a second resident block
// per SM covers the barriers. O and the logsumexp are written once at the end.
#pragma once

#include "../common/softmax.cuh"

namespace legalpt::fa2 {

template <typename T, int D>
struct FwdTraits {
  // m16 row tiles per warp. Two halve the shared-memory reads of K and V per FLOP (the limit at one); their O
  // accumulators (D floats per thread) fit the register file up to D = 128.
  static constexpr int kRowTiles = D <= 128 ? 2 : 1;
  static constexpr int kBlockM = 128;  // query rows per block
  // Keys per tile: 64 (FA2's). At D = 128 the S accumulators beside O fit since the scale is folded into the exp2's
  // FFMA and O's rescale sits behind a warp vote (plain: 254 registers, no spill; kGeneral spills 20 bytes). On the
  // H200, with FA4's slack in the max, the d128 forward ran at 1.01-1.07x SDPA flash with 64 keys,
  // 0.98-0.99x with 32; without the slack it is not timed yet.
  static constexpr int kBlockN = 64;
  static constexpr int kWarps = kBlockM / (16 * kRowTiles);
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kMinBlocks = kRowTiles == 2 ? 2 : 1;  // two resident blocks hide each other's barriers
  static constexpr int kSmem = (kBlockM + 2 * kBlockN) * (D + 8) * sizeof(T);
};

// kGeneral: the instantiation for softcap, dilation or a block layout (`general`); the other one, for everything
// else, leaves their code out, which keeps it within the register file.
template <typename T, int D, bool kGeneral>
__global__ void __launch_bounds__(FwdTraits<T, D>::kThreads, FwdTraits<T, D>::kMinBlocks)
    fwd_kernel(const __grid_constant__ Params p) {
  using Tr = FwdTraits<T, D>;
  constexpr int BM = Tr::kBlockM, BN = Tr::kBlockN, DP = D + 8, NT = Tr::kThreads, R = Tr::kRowTiles;
  extern __shared__ __align__(16) unsigned char smem[];
  T* sQ = reinterpret_cast<T*>(smem);  // (BM, DP)
  T* sK = sQ + BM * DP;                // (BN, DP)
  T* sV = sK + BN * DP;                // (BN, DP)

  const int m_blk = gridDim.x - 1 - blockIdx.x;  // the last query tiles see the most keys under causal: start them first
  const int b = blockIdx.y, h = blockIdx.z, hk = h / p.kv_group;
  const Document doc = document(p, b);
  if (m_blk * BM >= doc.lq) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int r0 = warp * 16 * R;  // the warp's first row in the tile
  const Visits vis = visits(p.schedule, b, h, m_blk);

  const T* k = row_ptr<const T>(p.k, b, doc.k_start, 0, hk);
  const T* v = row_ptr<const T>(p.v, b, doc.k_start, 0, hk);
  load_tile<T, BM, D, NT>(sQ, row_ptr<const T>(p.q, b, doc.q_start, m_blk * BM, h), p.q.row_stride,
                          doc.lq - m_blk * BM);
  if (vis.count > 0) {
    const int n0 = vis.tiles[0] * BN;
    load_tile<T, BN, D, NT>(sK, k + n0 * p.k.row_stride, p.k.row_stride, doc.lk - n0);
  }
  cp_async_commit();

  // O: rows r0 + 16 r + lane/4 (+8 for [2], [3]), columns 8 d + 2 (lane % 4) (+1)
  float acc[R][D / 8][4] = {};
  float row_max[R][2], row_sum[R][2];  // log2 domain; row_sum is this thread's part, the quad's sum comes at the end
#pragma unroll
  for (int r = 0; r < R; ++r) row_max[r][0] = row_max[r][1] = -INFINITY, row_sum[r][0] = row_sum[r][1] = 0.f;

  for (int t = 0; t < vis.count; ++t) {
    const int n_blk = vis.tiles[t];
    cp_async_wait<0>();
    __syncthreads();  // K(t) has landed, and every warp is done with V(t-1)
    load_tile<T, BN, D, NT>(sV, v + n_blk * BN * p.v.row_stride, p.v.row_stride, doc.lk - n_blk * BN);
    cp_async_commit();

    float s[R][BN / 8][4] = {};  // (16 R, BN) per warp
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t a[R][4];
#pragma unroll
      for (int r = 0; r < R; ++r) ldmatrix_x4(a[r], sQ + (r0 + 16 * r + (lane & 15)) * DP + kk * 16 + (lane >> 4) * 8);
#pragma unroll
      for (int nj = 0; nj < BN / 16; ++nj) {
        uint32_t bk[4];
        ldmatrix_x4(bk, sK + (nj * 16 + (lane & 7) + (lane >> 4) * 8) * DP + kk * 16 + ((lane >> 3) & 1) * 8);
#pragma unroll
        for (int r = 0; r < R; ++r) {
          mma_16x16<T>(s[r][2 * nj], s[r][2 * nj + 1], a[r], bk);
        }
      }
    }
    logits<kGeneral, R, BN>(p, s, t < vis.partial, m_blk * BM + r0 + lane / 4, n_blk * BN + 2 * (lane % 4), doc, b, h);

    cp_async_wait<0>();
    __syncthreads();  // V(t) has landed, and every warp is done with K(t)
    if (t + 1 < vis.count) {
      const int n1 = vis.tiles[t + 1] * BN;
      load_tile<T, BN, D, NT>(sK, k + n1 * p.k.row_stride, p.k.row_stride, doc.lk - n1);
    }
    cp_async_commit();

    // O and the row sums are rescaled only when a row's max moved, under a warp vote (a uniform branch; with random
    // scores some row of a warp still moves at about 2 tiles in 5 at 4k keys, more often early). No slack: FA4 moves
    // the max only past 8 (log2), which skips more rescales (d128 fwd 1.05-1.08x SDPA flash on the H200), but P's
    // largest values then leave the top of their bf16 binade and the exact 1 of the max: 1.7x the output's error
    // before rounding (scripts/rescale_precision.py), past 2x FlexAttention's in test_flex_attention_agrees.
    float tile_max[R][2];
    bool move = false;
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        tile_max[r][half] = tile_row_max<kGeneral, BN>(p, s[r], half);
        move |= tile_max[r][half] > row_max[r][half];
      }
    if (__any_sync(0xffffffffu, move)) {
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const float m = fmaxf(row_max[r][half], tile_max[r][half]);
          const float correction = exp2f(row_max[r][half] - (m == -INFINITY ? 0.f : m));
          row_max[r][half] = m;
          row_sum[r][half] *= correction;
#pragma unroll
          for (int d = 0; d < D / 8; ++d) {
            acc[r][d][2 * half] *= correction;
            acc[r][d][2 * half + 1] *= correction;
          }
        }
    }
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int half = 0; half < 2; ++half) row_sum[r][half] += exp_row<kGeneral, BN>(p, s[r], half, row_max[r][half]);

#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      uint32_t a[R][4];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        a[r][0] = pack2<T>(s[r][2 * kk][0], s[r][2 * kk][1]);
        a[r][1] = pack2<T>(s[r][2 * kk][2], s[r][2 * kk][3]);
        a[r][2] = pack2<T>(s[r][2 * kk + 1][0], s[r][2 * kk + 1][1]);
        a[r][3] = pack2<T>(s[r][2 * kk + 1][2], s[r][2 * kk + 1][3]);
      }
#pragma unroll
      for (int nd = 0; nd < D / 16; ++nd) {
        uint32_t bv[4];
        ldmatrix_x4_trans(bv, sV + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * DP + nd * 16 + (lane >> 4) * 8);
#pragma unroll
        for (int r = 0; r < R; ++r) {
          mma_16x16<T>(acc[r][2 * nd], acc[r][2 * nd + 1], a[r], bv);
        }
      }
    }
  }
  cp_async_wait<0>();
#pragma unroll
  for (int r = 0; r < R; ++r)
    write_rows<T, D>(p, acc[r], row_max[r], row_sum[r], m_blk * BM + r0 + 16 * r + lane / 4, doc, b, h);
}

}  // namespace legalpt::fa2
