// The backward's pieces shared by both paths' backward kernels: P and dS from a recomputed score, the element rule
// on transposed (key-major) and row-major tiles, the walk over a key tile's (query head, query tile) pairs, and the
// stores of dK and dV (or their split parts).
#pragma once

#include "softmax.cuh"

namespace legalpt {

// P = exp2(logit - lse) of a score s = q.k without softcap, and dS = P (dP - delta) d(logit)/d(q.k) from it:
// score_grads's two halves, apart for the fa3 backward, which takes P while dP is still being computed.
__device__ __forceinline__ float plain_prob(const Params& p, float s, float lse) {
  return exp2f(s * p.scale_log2 - lse);
}
__device__ __forceinline__ float plain_grad(const Params& p, float prob, float dp, float delta) {
  return prob * (dp - delta) * p.ds_scale;
}

// P and dS of one score s = q.k (raw), in place: s <- p = exp2(logit - lse), dp <- dS = p (dp - delta) dlogit/d(q.k).
// A row without keys has lse = +inf, so p = 0 there. Masked scores are zeroed by the caller afterwards.
template <bool kGeneral>
__device__ __forceinline__ void score_grads(const Params& p, float& s, float& dp, float lse, float delta) {
  if (kGeneral && p.softcap > 0.f) {
    const float th = tanh_accurate(s * p.softcap_inv_scale);
    s = exp2f(p.softcap * kLog2e * th - lse);
    dp = s * (dp - delta) * (p.ds_scale * (1.f - th * th));
  } else {
    s = plain_prob(p, s, lse);
    dp = plain_grad(p, s, dp, delta);
  }
}

// The backward block i of a 1-D grid over key blocks (split parts first) x documents x key heads: its key tile (or
// split tile's part), document and key head. Where a block visits its key head's whole GQA group (split_heads = 0:
// wherever cuda._split does not split the group's heads), key tiles vary slowest, so blocks start in decreasing
// order of work under causal masks and packed documents (a document's first key tiles are seen by the most query
// tiles, the split global keys' by all): such items are few and long, and in a head-major order the last heads'
// longest tiles started after the other heads' short ones and ended the pass late. Without GQA, and for the parts of
// a split group (split_heads > 0, each a few heads), items are many and short, and a head's key tiles go in turn
// instead, so that the blocks at work at once share its Q and dO in L2 (key tile first measured 0.71x on packed
// documents at d128 16/16, 16k).
struct BwdBlockIndex {
  int n_blk, chunk, b, hk;  // chunk: the split tile's part, -1 for a whole tile
  bool split;
};
__device__ __forceinline__ BwdBlockIndex bwd_block_index(const Params& p, int i, int key_blocks, int documents) {
  const int per_tile = documents * (p.heads / p.kv_group);
  const bool tile_first = p.kv_group > 1 && p.split_heads == 0;
  const int x = tile_first ? i / per_tile : i % key_blocks, rest = tile_first ? i % per_tile : i / key_blocks;
  const int split_blocks = p.split_tiles * p.split_chunks;
  BwdBlockIndex index{x - split_blocks + p.split_tiles, -1, rest % documents, rest / documents, x < split_blocks};
  if (index.split) {  // a part of the group's heads takes the key tiles in turn; a global tile's parts go together
    index.n_blk = p.split_heads > 0 ? x % p.split_tiles : x / p.split_chunks;
    index.chunk = p.split_heads > 0 ? x / p.split_tiles : x % p.split_chunks;
  }
  return index;
}

// The (query head, query tile) pairs a block visits, in order: every head of the group, each head's schedule row of
// the key tile; of a split tile the block's chunk of each row, or its split_heads heads.
struct BwdWork {
  int g, t, end;  // group member, position in its visit list and the end of this block's part; g == kv_group: done
  int tile;       // the query tile, vis.tiles[t]: read when advancing, an iteration before the copy that needs it
  Visits vis;
};

// The next pair after w; start from {-1, 0, 0}. chunk: this block's part of a split key tile, -1 for a whole one.
__device__ __forceinline__ void advance(const Params& p, BwdWork& w, int b, int hk, int n_blk, int chunk) {
  const bool heads = chunk >= 0 && p.split_heads > 0, rows = chunk >= 0 && p.split_heads == 0;
  const int last = heads ? (chunk + 1) * p.split_heads : p.kv_group;  // past the block's heads
  if (heads && w.g < 0) w.g = chunk * p.split_heads - 1;
  ++w.t;
  while (w.t >= w.end && ++w.g < last) {
    w.vis = visits(p.schedule, b, hk * p.kv_group + w.g, n_blk);
    w.t = rows ? w.vis.count * chunk / p.split_chunks : 0;
    w.end = rows ? w.vis.count * (chunk + 1) / p.split_chunks : w.vis.count;
  }
  if (w.g < last) {
    w.tile = w.vis.tiles[w.t];
  } else {
    w.g = p.kv_group;  // done, for every caller's loop
  }
}

// The element rule on a warp's partial S^T / dP^T tile in one-level (16 keys from `key0` x BM queries from `q0`):
// `zero(n, c)` is called for each score [n][c] that the mask removes. One row mask per query column serves the
// thread's two keys.
template <bool kGeneral, int BM, typename Zero>
__device__ __forceinline__ void mask_transposed(const Params& p, int q0, int key0, const Document& doc, int b, int h,
                                                Zero zero) {
  const int lane = threadIdx.x % 32, j0 = key0 + lane / 4;  // the thread's keys: j0 and j0 + 8
  if constexpr (!kGeneral) {  // the plain rule: one bit per score
    static_assert(BM / 8 <= 32, "a thread's queries of a tile fit seen_queries' 32 bits");
#pragma unroll
    for (int ck = 0; ck < 2; ++ck)
#pragma unroll
      for (int cq = 0; cq < 2; ++cq) {
        const int pos0 = q0 + 2 * (lane % 4) + cq + (doc.lk - doc.lq);  // the thread's first query, on the key axis
        const uint32_t seen = seen_queries(p.mask, j0 + 8 * ck, pos0, doc.lk);
#pragma unroll
        for (int n = 0; n < BM / 8; ++n)
          if ((seen >> n & 1u) == 0) zero(n, 2 * ck + cq);
      }
    return;
  }
#pragma unroll
  for (int n = 0; n < BM / 8; ++n)
#pragma unroll
    for (int cq = 0; cq < 2; ++cq) {
      const int i = q0 + n * 8 + 2 * (lane % 4) + cq;
      const RowMask rm = row_mask(p.mask, i, doc.lq, doc.lk);
#pragma unroll
      for (int ck = 0; ck < 2; ++ck)
        if (!allowed<kGeneral>(p.mask, rm, i, j0 + 8 * ck, b, h)) zero(n, 2 * ck + cq);
    }
}

// The same for a warp's (16 query rows from `i0`, N keys from `j0`) tile of scores in row layout: `zero(n, c)` is
// called for each score [n][c] that the mask removes.
template <bool kGeneral, int N, typename Zero>
__device__ __forceinline__ void mask_rows(const Params& p, int i0, int j0, const Document& doc, int b, int h,
                                          Zero zero) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = i0 + lane / 4 + 8 * r;
    const RowMask rm = row_mask(p.mask, i, doc.lq, doc.lk);
#pragma unroll
    for (int n = 0; n < N / 8; ++n)
#pragma unroll
      for (int c = 0; c < 2; ++c)
        if (!allowed<kGeneral>(p.mask, rm, i, j0 + 2 * (lane % 4) + 8 * n + c, b, h)) zero(n, 2 * r + c);
  }
}

// A warp's dK and dV (KT m16 tiles of keys from key j0 of the document, DW columns from d0) to dk and dv, or, for a
// split key tile, added in float32 into dkv_split (converted by split_dkv_kernel).
template <typename T, int KT, int DW, int D>
__device__ __forceinline__ void store_dkv(const Params& p, const float (&dk)[KT][DW / 8][4],
                                          const float (&dv)[KT][DW / 8][4], const Document& doc, int b, int hk,
                                          int j0, int d0, bool split) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int m = 0; m < KT; ++m)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int j = j0 + 16 * m + lane / 4 + 8 * r;
      if (j >= doc.lk) continue;
      if (split) {
        float* row = row_ptr<float>(p.dkv_split, b, p.split_heads > 0 ? doc.k_start : 0, j, hk) + d0 + 2 * (lane % 4);
#pragma unroll
        for (int n = 0; n < DW / 8; ++n) {
          atomic_add2(row + 8 * n, dk[m][n][2 * r], dk[m][n][2 * r + 1]);
          atomic_add2(row + D + 8 * n, dv[m][n][2 * r], dv[m][n][2 * r + 1]);
        }
        continue;
      }
      T* dk_row = row_ptr<T>(p.dk, b, doc.k_start, j, hk) + d0 + 2 * (lane % 4);
      T* dv_row = row_ptr<T>(p.dv, b, doc.k_start, j, hk) + d0 + 2 * (lane % 4);
#pragma unroll
      for (int n = 0; n < DW / 8; ++n) {
        *reinterpret_cast<uint32_t*>(dk_row + 8 * n) = pack2<T>(dk[m][n][2 * r], dk[m][n][2 * r + 1]);
        *reinterpret_cast<uint32_t*>(dv_row + 8 * n) = pack2<T>(dv[m][n][2 * r], dv[m][n][2 * r + 1]);
      }
    }
}

}  // namespace legalpt
