"""The search for the longest seq_len a setting trains at batch 1: doubling from a start until a job runs out of
memory (or the limit is reached), then bisection between the longest that trained and the shortest that did not,
until the gap is at most 1/PRECISION of the longest (midpoints on multiples of STEP).

The search is a function of what is known, so it resumes: every batch-1 job of the setting counts, the throughput
rows' and an earlier (merged) part's too, and a run cut off by a time limit continues where it stopped. Memory is
assumed to grow with seq_len; a job that failed for another reason than memory ends the search (its error is in the
record), since it says nothing about memory.
"""

from __future__ import annotations

STEP = 256  # searched seq_lens are multiples of this (whole 128-token tiles in the kernels)
PRECISION = 16  # bisection stops when the gap is at most 1/PRECISION of the longest seq_len that trained


def outcome(row: dict) -> str:
    """ok | oom | error: how a job ended, as the search reads it."""
    if row["oom"]:
        return "oom"
    return "error" if row["error"] else "ok"


def bounds(known: dict[int, str], limit: int) -> tuple[int | None, int | None]:
    """(longest seq_len that trained, shortest above it that ran out of memory), among `known` up to `limit`."""
    known = {s: o for s, o in known.items() if s <= limit}
    longest = max((s for s, o in known.items() if o == "ok"), default=None)
    oom = min((s for s, o in known.items() if o == "oom" and (longest is None or s > longest)), default=None)
    return longest, oom


def next_seq_len(known: dict[int, str], start: int, limit: int) -> int | None:
    """The next seq_len to try, given the outcomes `known` (seq_len → ok | oom | error); None when the search is
    done: the limit trained, the gap is small enough, nothing trains at `start`, or a job failed otherwise."""
    if "error" in known.values():
        return None
    longest, oom = bounds(known, limit)
    if longest is None:
        return None if oom is not None and oom <= start else start
    if oom is None:
        return None if longest >= limit else min(2 * longest, limit)
    middle = (longest + oom) // 2 // STEP * STEP
    return middle if oom - longest > longest / PRECISION and middle > longest else None
