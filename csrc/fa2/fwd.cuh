// FA2 forward: one thread block per (query tile, document, head); 8 warps, 16 query rows each.
//
// Per visited key tile: S = Q K^T on the tensor cores (ldmatrix + mma.sync m16n8k16), the element rule on
// partial tiles only, online softmax in the log2 domain (running max and sum per row, the output rescaled only
// by the change of the max), O += P V with P straight from registers. K and V have one shared buffer each and
// their copies overlap compute: V(t) loads during S(t), K(t+1) during softmax and P V(t). O and the logsumexp
// are written once at the end.
#pragma once

#include "tile.cuh"

namespace legalpt::fa2 {

template <typename T, int D>
struct FwdTraits {
  static constexpr int kBlockM = 128;  // query rows per block: 8 warps x 16 (one m16 mma tile per warp)
  static constexpr int kBlockN = 64;   // keys per tile: S is 16 x 64 per warp, 32 float registers
  static constexpr int kWarps = 8;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kSmem = (kBlockM + 2 * kBlockN) * (D + 8) * sizeof(T);
};

#ifndef LEGALPT_FWD_MIN_BLOCKS
#define LEGALPT_FWD_MIN_BLOCKS 1
#endif
#ifndef LEGALPT_FWD_Q_IN_REGS
#define LEGALPT_FWD_Q_IN_REGS 0
#endif

template <typename T, int D>
__global__ void __launch_bounds__(FwdTraits<T, D>::kThreads, LEGALPT_FWD_MIN_BLOCKS)
    fwd_kernel(const __grid_constant__ Params p) {
  using Tr = FwdTraits<T, D>;
  constexpr int BM = Tr::kBlockM, BN = Tr::kBlockN, DP = D + 8, NT = Tr::kThreads;
  extern __shared__ __align__(16) unsigned char smem[];
  T* sQ = reinterpret_cast<T*>(smem);  // (BM, DP)
  T* sK = sQ + BM * DP;                // (BN, DP)
  T* sV = sK + BN * DP;                // (BN, DP)

  const int m_blk = gridDim.x - 1 - blockIdx.x;  // the last query tiles see the most keys under causal: start them first
  const int b = blockIdx.y, h = blockIdx.z, hk = h / p.kv_group;
  const Document doc = document(p, b);
  if (m_blk * BM >= doc.lq) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int r0 = warp * 16;  // the warp's first row in the tile
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

  float acc[D / 8][4] = {};  // O: rows r0 + lane/4 (+8 for [2], [3]), columns 8 * n + 2 * (lane % 4) (+1)
  float row_max[2] = {-INFINITY, -INFINITY};  // log2 domain
  float row_sum[2] = {0.f, 0.f};              // this thread's part; the quad's sum is taken at the end
#if LEGALPT_FWD_Q_IN_REGS
  uint32_t qf[D / 16][4];
#endif

  for (int t = 0; t < vis.count; ++t) {
    const int n_blk = vis.tiles[t];
    cp_async_wait<0>();
    __syncthreads();  // K(t) has landed, and every warp is done with V(t-1)
    load_tile<T, BN, D, NT>(sV, v + n_blk * BN * p.v.row_stride, p.v.row_stride, doc.lk - n_blk * BN);
    cp_async_commit();

    float s[BN / 8][4] = {};  // (16, BN) per warp
#if LEGALPT_FWD_Q_IN_REGS
    if (t == 0) {
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) ldmatrix_x4(qf[kk], sQ + (r0 + (lane & 15)) * DP + kk * 16 + (lane >> 4) * 8);
    }
#endif
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
#if LEGALPT_FWD_Q_IN_REGS
      const uint32_t(&a)[4] = qf[kk];
#else
      uint32_t a[4];
      ldmatrix_x4(a, sQ + (r0 + (lane & 15)) * DP + kk * 16 + (lane >> 4) * 8);
#endif
#pragma unroll
      for (int nj = 0; nj < BN / 16; ++nj) {
        uint32_t bk[4];
        ldmatrix_x4(bk, sK + (nj * 16 + (lane & 7) + (lane >> 4) * 8) * DP + kk * 16 + ((lane >> 3) & 1) * 8);
        mma_16816<T>(s[2 * nj], a, bk[0], bk[1]);
        mma_16816<T>(s[2 * nj + 1], a, bk[2], bk[3]);
      }
    }
#pragma unroll
    for (int n = 0; n < BN / 8; ++n)
#pragma unroll
      for (int c = 0; c < 4; ++c) s[n][c] = logit_log2(p, s[n][c]);
    if (t < vis.partial) {
      const int i0 = m_blk * BM + r0 + lane / 4, j0 = n_blk * BN + 2 * (lane % 4);
#pragma unroll
      for (int n = 0; n < BN / 8; ++n)
#pragma unroll
        for (int c = 0; c < 4; ++c)
          if (!visible(p.mask, i0 + (c >> 1) * 8, j0 + n * 8 + (c & 1), doc.lq, doc.lk, b, h)) s[n][c] = -INFINITY;
    }

    cp_async_wait<0>();
    __syncthreads();  // V(t) has landed, and every warp is done with K(t)
    if (t + 1 < vis.count) {
      const int n1 = vis.tiles[t + 1] * BN;
      load_tile<T, BN, D, NT>(sK, k + n1 * p.k.row_stride, p.k.row_stride, doc.lk - n1);
    }
    cp_async_commit();

#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float m = row_max[r];
#pragma unroll
      for (int n = 0; n < BN / 8; ++n) m = fmaxf(m, fmaxf(s[n][2 * r], s[n][2 * r + 1]));
      m = quad_max(m);
      const float m_safe = m == -INFINITY ? 0.f : m;  // a row that has seen nothing yet keeps p = exp2(-inf) = 0
      const float correction = exp2f(row_max[r] - m_safe);
      row_max[r] = m;
      float sum = 0.f;
#pragma unroll
      for (int n = 0; n < BN / 8; ++n) {
        s[n][2 * r] = exp2f(s[n][2 * r] - m_safe);
        s[n][2 * r + 1] = exp2f(s[n][2 * r + 1] - m_safe);
        sum += s[n][2 * r] + s[n][2 * r + 1];
      }
      row_sum[r] = row_sum[r] * correction + sum;
#pragma unroll
      for (int d = 0; d < D / 8; ++d) {
        acc[d][2 * r] *= correction;
        acc[d][2 * r + 1] *= correction;
      }
    }

#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      const uint32_t a[4] = {pack2<T>(s[2 * kk][0], s[2 * kk][1]), pack2<T>(s[2 * kk][2], s[2 * kk][3]),
                             pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                             pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int nd = 0; nd < D / 16; ++nd) {
        uint32_t bv[4];
        ldmatrix_x4_trans(bv, sV + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * DP + nd * 16 + (lane >> 4) * 8);
        mma_16816<T>(acc[2 * nd], a, bv[0], bv[1]);
        mma_16816<T>(acc[2 * nd + 1], a, bv[2], bv[3]);
      }
    }
  }
  cp_async_wait<0>();

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float l = quad_sum(row_sum[r]);
    const float inv = l > 0.f ? 1.f / l : 0.f;  // a row that sees no key: output 0
    const int i = m_blk * BM + r0 + lane / 4 + 8 * r;
    if (i >= doc.lq) continue;
    T* o = row_ptr<T>(p.o, b, doc.q_start, i, h) + 2 * (lane % 4);
#pragma unroll
    for (int d = 0; d < D / 8; ++d)
      *reinterpret_cast<uint32_t*>(o + 8 * d) = pack2<T>(acc[d][2 * r] * inv, acc[d][2 * r + 1] * inv);
    if (lane % 4 == 0)
      p.lse[b * p.lse_batch_stride + h * p.lse_head_stride + doc.q_start + i] =
          l > 0.f ? (row_max[r] + log2f(l)) * kLn2 : -INFINITY;
  }
}

}  // namespace legalpt::fa2
