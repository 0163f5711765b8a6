// One attention call as the host code of both paths sees it: the kernels' Params plus what only the host reads (the
// tensors' shapes for the sm90 path's TMA maps, the grid's extents). Filled once by csrc/api.h; free of torch, so
// that the instantiation files compile without its headers.
#pragma once

#include <cstdint>

#include "params.h"

namespace legalpt {

// The element types of the tensors the kernels copy (bf16, fp16; e4m3 in the FP8 forward) and reduce into (float32).
enum class Element { kBf16, kF16, kF32, kE4m3 };
inline int element_bytes(Element e) { return e == Element::kF32 ? 4 : e == Element::kE4m3 ? 1 : 2; }

// A tensor as a TMA map sees it: dims {D, heads, rows, batches}, strides in elements between heads, rows, batches.
struct TensorDesc {
  const void* ptr;
  Element element;
  int64_t dims[4];
  int64_t strides[3];
};

struct Problem {
  Params p;                     // what the kernels read
  TensorDesc q, k, v, o;        // o: the output in the forward, dO in the backward
  TensorDesc dq_accum, dk, dv;  // backward only
  int documents;                // batch rows, or documents of a varlen batch: the grids' y
  int kv_heads;
  bool varlen;
  Schedule dq_schedule;         // backward with p.deterministic: the dQ pass's (the forward's tiles)
  int tile_rows;                // forward: query rows per tile of p.schedule, checked against the kernel's
};

}  // namespace legalpt
