"""How evenly the backward's blocks finish, modelled: list scheduling of its work items over the GPU's processors.

A backward item is one key tile (of 128 keys) of one document and key head; it visits every query tile (of 128 rows
at d64, 64 at d128) that sees the tile, for each query head of the key head's GQA group. The model dispatches items
in block order to the first free processor (one resident block each, as the fa3 backward's shared memory allows),
an item costing its visits plus a fixed overhead, and prints the pass's time over its ideal (the total work spread
evenly), for the order the kernels used before (a head's key tiles in turn) and the one they use (key tiles slowest:
csrc/common/backward.cuh, bwd_block_index). It is why the order changed; it ignores L2 locality, which the A/B
(scripts/ab_attention.py) measures.

    python scripts/backward_balance.py
"""

from __future__ import annotations

import argparse
import heapq

from benchmarking.attention import shapes

QUERY_ROWS = {64: 128, 128: 64}  # the fa3 backward's query tile per head dim (csrc/sm90/bwd.cuh, BwdTraits)
KEYS = 128


def items(
    doc_lens: list[int], kv_heads: int, group: int, causal: bool, head_dim: int
) -> list[tuple[int, int, int, int]]:
    """(key head, document, key tile, visits) of every backward item; a visit is one query tile of one head."""
    rows = QUERY_ROWS[head_dim]
    found = []
    for head in range(kv_heads):
        for doc, length in enumerate(doc_lens):
            query_tiles = -(-length // rows)
            for tile in range(-(-length // KEYS)):
                seen = query_tiles - (tile * KEYS) // rows if causal else query_tiles
                found.append((head, doc, tile, group * seen))
    return found


def makespan(costs: list[int], processors: int, overhead: int) -> float:
    """The time the last processor finishes when items start in order on the first free one."""
    free = [0.0] * processors
    for cost in costs:
        heapq.heappush(free, heapq.heappop(free) + cost + overhead)
    return max(free)


def balance(work: list[tuple[int, int, int, int]], processors: int, overhead: int) -> tuple[float, float]:
    """Time over ideal in head-major order and key tile first."""
    ideal = sum(visits + overhead for *_, visits in work) / processors
    head_major = [visits for *_, visits in sorted(work, key=lambda x: (x[0], x[1], x[2]))]
    tile_first = [visits for *_, visits in sorted(work, key=lambda x: (x[2], x[0], x[1]))]
    return makespan(head_major, processors, overhead) / ideal, makespan(tile_first, processors, overhead) / ideal


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processors", type=int, default=132, help="SMs (H100 and H200: 132)")
    parser.add_argument(
        "--overhead", type=int, default=4, help="an item's fixed cost, in visits of the head dim's query tiles"
    )
    args = parser.parse_args(argv)
    cases = [("1b training (batch 1)", "causal", 64, [8192], 32, 4)]
    for s in shapes.selected(shapes.plan(shapes.GPU_SCALE, False), ["causal", "varlen-causal"], [64, 128]):
        docs = list(s.doc_lens) if s.doc_lens else [s.seqlen] * s.batch
        cases.append((s.group, s.mask, s.head_dim, docs, s.heads, s.kv_heads))
    rows = []
    print(f"{'shape':<56} {'head-major':>10} {'tile first':>10}")
    for group, mask, head_dim, docs, heads, kv_heads in cases:
        work = items(docs, kv_heads, heads // kv_heads, causal=True, head_dim=head_dim)
        before, after = balance(work, args.processors, args.overhead)
        rows_of = f"{len(docs)} x {docs[0]}" if len(set(docs)) == 1 else "docs " + "/".join(map(str, docs))
        name = f"{group} {mask} d{head_dim} {rows_of}, heads {heads}/{kv_heads}"
        rows.append({"shape": name, "head_major": before, "tile_first": after})
        print(f"{name:<56} {before:>9.2f}x {after:>9.2f}x")
    return rows


if __name__ == "__main__":
    main()
