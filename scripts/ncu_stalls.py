"""Where a kernel's warps stall, per SASS instruction and per stretch of code, from Nsight Compute's PC sampling.

Reads the table `ncu -i REPORT --page source --csv --print-source sass` writes for a report taken with
`--section SourceCounters`, e.g. of the fa3 backward at head dim 64 and a 1024-token window (on a GPU;
bench_attention's --ncu-runs runs each step a few times, untimed, for ncu to wrap):

    ncu --clock-control none -k bwd_kernel --launch-skip 2 --launch-count 1 --section SourceCounters -o bwd \
        python scripts/bench_attention.py --head-dims 64 --masks window-1024 --seqlens 65536 --impls fa3 \
        --modes fwd+bwd --ncu-runs 3
    ncu -i bwd.ncu-rep --page source --csv --print-source sass > bwd-sass.csv

Prints the kernel's stall reasons over all its samples, the instructions with the most samples, and the code cut into
stretches that end at each MMA, wait, barrier or branch, with their share of the samples and how often they ran
(`Instructions Executed`, per warp). The stretches show which phase of a loop the time goes to, since a stall is
sampled on the instruction that waits, not on the one it waits for.

    python scripts/ncu_stalls.py bwd-sass.csv --top 30
    python scripts/ncu_stalls.py bwd-sass.csv --stretches --min-share 0.2
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"
# Where a stretch of code ends: the MMAs, their waits, barriers, mbarrier waits, branches
LANDMARK = re.compile(r"HGMMA|WARPGROUP|DEPBAR|BAR\.|SYNCS|BRA|EXIT|VOTE")


@dataclass
class Instruction:
    """One SASS instruction of the kernel, in program order, with its PC samples."""

    index: int
    sass: str
    samples: int
    executed: int
    reasons: Counter = field(default_factory=Counter)  # stall reason -> samples


def _count(text: str) -> int:
    return int(text) if text.strip().isdigit() else 0


def read(path: Path) -> tuple[str, list[Instruction]]:
    """The kernel's name and its instructions, in program order."""
    if not path.is_file():
        raise SystemExit(f"{path}: no such file (the CSV of ncu's source page; see --help)")
    rows = list(csv.reader(path.open()))
    if len(rows) < 3 or SAMPLES not in rows[1]:
        raise SystemExit(f"{path}: not ncu's source page as CSV (no {SAMPLES!r} column); see --help")
    kernel, header = rows[0][1], rows[1]
    at_samples, at_executed = header.index(SAMPLES), header.index(EXECUTED)
    # One column per reason, then the same reasons again for the samples in which no instruction issued
    reasons = [
        (i, name[len("stall_") :]) for i, name in enumerate(header) if name.startswith("stall_") and "(" not in name
    ]
    instructions = []
    for k, row in enumerate(rows[2:]):
        counts = Counter({name: _count(row[i]) for i, name in reasons if _count(row[i])})
        instructions.append(Instruction(k, row[1].strip(), _count(row[at_samples]), _count(row[at_executed]), counts))
    return kernel, instructions


def _share(part: int, total: int) -> str:
    return f"{100 * part / max(total, 1):5.2f}%"


def _top_reasons(reasons: Counter, total: int, n: int = 3) -> str:
    return " ".join(f"{name} {100 * c / max(total, 1):.2f}" for name, c in reasons.most_common(n))


def summary(instructions: list[Instruction], top: int) -> list[str]:
    """The totals, the stall reasons over all samples, then the `top` instructions with the most samples."""
    total = sum(i.samples for i in instructions)
    reasons = sum((i.reasons for i in instructions), Counter())
    lines = [f"{len(instructions)} instructions, {total} samples", "by reason: " + _top_reasons(reasons, total, 10)]
    for i in sorted(instructions, key=lambda i: -i.samples)[:top]:
        lines.append(f"#{i.index:<5} {_share(i.samples, total)}  {i.sass[:60]:60s} {_top_reasons(i.reasons, total)}")
    return lines


def stretches(instructions: list[Instruction], min_share: float) -> list[str]:
    """The code cut after each landmark; stretches under min_share percent of the samples are left out."""
    total, lines, start = sum(i.samples for i in instructions), [], 0
    for k, i in enumerate(instructions):
        if not LANDMARK.search(i.sass) and k + 1 < len(instructions):
            continue
        part = instructions[start : k + 1]
        samples = sum(p.samples for p in part)
        if 100 * samples >= min_share * total:
            reasons = sum((p.reasons for p in part), Counter())
            lines.append(
                f"{start:5d}-{k:<5d} {_share(samples, total)} ran {i.executed:>9}  {i.sass[:56]:56s} "
                + _top_reasons(reasons, total)
            )
        start = k + 1
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("csv", type=Path, help="ncu --page source --csv --print-source sass output")
    parser.add_argument("--top", type=int, default=30, help="instructions with the most samples to list")
    parser.add_argument("--stretches", action="store_true", help="also the samples per stretch of code")
    parser.add_argument("--min-share", type=float, default=0.2, help="smallest stretch to list, percent of samples")
    args = parser.parse_args(argv)
    kernel, instructions = read(args.csv)
    print(f"## {kernel}")
    print("\n".join(summary(instructions, args.top)))
    if args.stretches:
        print("stretches (first-last instruction, share, times run, the landmark that ends it, top reasons):")
        print("\n".join(stretches(instructions, args.min_share)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
