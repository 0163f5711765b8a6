"""A/B of the attention kernels at several commits in one run: the comparison that decides between close variants.

Each commit is checked out into its own git worktree (detached, under --work) and builds its kernels into its own
cache (LEGALPT_KERNEL_CACHE), all commits in parallel. Then this checkout's scripts/bench_attention.py runs once per
commit, one after another, with that commit's legalpt first on PYTHONPATH: the same shapes, the same seeded
inputs, and the baselines (FlexAttention, SDPA) measured again beside each. Printed last: per shape, mode and
implementation, each commit's ms and its ratio to the first commit's, then with --kernel-times each commit's
longest kernels. A commit may be given twice: the spread between its two runs is the noise of the comparison.
The records stay under --work/runs; the worktrees are removed at the end. Where the machine's git lacks a commit
(a GPU machine that holds only what landed), export it where it exists: --export .ab writes each commit's legalpt/
and csrc/ to .ab/<sha> (git-ignored), which travels with the working tree and is given to --commits as a folder.

    python scripts/ab_attention.py --commits main 3227418 -- --head-dims 128 --masks window-1024 \\
        --seqlens 65536 --impls fa3 flex --modes fwd+bwd --kernel-times 10
    python scripts/ab_attention.py --commits HEAD HEAD -- --device cpu --masks causal --head-dims 64 \\
        --impls reference --modes fwd                                   # a dry run on the CPU
    python scripts/ab_attention.py --commits main HEAD --export .ab     # then, elsewhere: --commits .ab/<sha> ...
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "scripts" / "bench_attention.py"
KEY = ("mask", "head_dim", "seqlen_q", "batch", "heads", "heads_k", "layers", "mode", "impl")  # a row across commits


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--commits", nargs="+", required=True, help="git revisions or exported folders (--export), the first the base"
    )
    parser.add_argument(
        "--work", type=Path, default=Path(tempfile.gettempdir()) / "legalpt-ab", help="worktrees, caches, records"
    )
    parser.add_argument(
        "--export", type=Path, metavar="FOLDER", help="only write each commit's legalpt/ and csrc/ to FOLDER/<sha>"
    )
    parser.epilog = "Everything after -- goes to bench_attention.py."
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    args.bench_args = argv[split + 1 :]
    if len(args.commits) < 2 and not args.export:
        parser.error(f"--commits needs two or more revisions to compare; got {args.commits}")
    if "--out" in args.bench_args:
        parser.error("bench_attention.py's --out is set per commit, under --work/runs")
    return args


def git(*args: str) -> str:
    done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip()


def checkout(sha: str, tree: Path) -> None:
    """A detached worktree of `sha` at `tree`, replacing one that an interrupted run left there."""
    if tree.exists():
        shutil.rmtree(tree)  # ours, under --work
    git("worktree", "prune")
    git("worktree", "add", "--detach", str(tree), sha)


def environment(tree: Path, work: Path, label: str, dims: tuple[int, ...]) -> dict[str, str]:
    """The tree's legalpt first on the path, its kernels JIT-built (LEGALPT_JIT, at the benchmark's head dims) into
    a cache of its own (by label: an export and a worktree of one commit share it), and the records' note that they
    measured this tree, not the checkout's commit."""
    path = os.pathsep.join(p for p in (str(tree), os.environ.get("PYTHONPATH", "")) if p)
    code = f"code of {label} (scripts/ab_attention.py)"
    return dict(
        os.environ, PYTHONPATH=path, LEGALPT_KERNEL_CACHE=str(work / "cache" / label), LEGALPT_BENCH_CODE=code,
        LEGALPT_JIT="1", LEGALPT_HEAD_DIMS=";".join(map(str, dims)),
    )  # fmt: skip


def head_dims(bench_args: list[str]) -> tuple[int, ...]:
    """The head dims the benchmark will run (its --head-dims, else both that it knows)."""
    if "--head-dims" not in bench_args:
        return (64, 128)
    after = bench_args[bench_args.index("--head-dims") + 1 :]
    return tuple(int(a) for a in after[: next((i for i, a in enumerate(after) if a.startswith("--")), len(after))])


def build_kernels(trees: dict[str, Path], work: Path, dims: tuple[int, ...]) -> None:
    """Every tree's kernels by its own loader (kernels.extension in JIT mode; trees from before the build at install
    have kernels.build_all), the trees in parallel processes."""
    code = (
        "from legalpt.attention import kernels\n"
        f"print('built', kernels.build_all({dims!r}) if hasattr(kernels, 'build_all') else kernels.extension())"
    )
    builds = {
        label: subprocess.Popen([sys.executable, "-c", code], env=environment(tree, work, label, dims), cwd=tree)
        for label, tree in trees.items()
    }
    if failed := [label for label, build in builds.items() if build.wait()]:
        raise SystemExit(f"the kernels of {', '.join(failed)} did not build (their errors are above)")


def load_rows(out: Path) -> dict[tuple, dict]:
    [record] = out.glob("attention-*.json")
    rows = json.loads(record.read_text())["rows"]
    return {tuple(row[k] for k in KEY): row for row in rows}  # this checkout's bench_attention wrote every row


def compare(labels: list[str], runs: list[dict[tuple, dict]]) -> str:
    """Per row of the first run: each run's ms and its ratio to the first's, then each run's longest kernels."""
    lines = [f"{'impl':<10} {'mode':<7} {'mask':<20} {'d':>3} {'seqlen':>6} {'H/Hk':>5}  "
             + "  ".join(f"{x:>18}" for x in labels)]  # fmt: skip
    for key, base in runs[0].items():
        cells = []
        for run in runs:
            ms = run.get(key, {}).get("ms")
            ratio = f" ({base['ms'] / ms:.3f}x)" if ms and base.get("ms") else ""
            cells.append(f"{ms:.3f}{ratio}" if ms else "–")
        what = dict(zip(KEY, key, strict=True))
        row = f"{what['impl']:<10} {what['mode']:<7} {what['mask']:<20} {what['head_dim']:>3} {what['seqlen_q']:>6}"
        row += f" {what['heads']:>2}/{what['heads_k']:<2}"
        lines.append(row + "  " + "  ".join(f"{c:>18}" for c in cells))
        for label, run in zip(labels, runs, strict=True):
            longest = list(run.get(key, {}).get("kernels_us", {}).items())[:4]
            if longest:
                lines.append(
                    f"    {label}: " + " | ".join(f"{n.removeprefix('void ')[:36]} {us:.0f}" for n, us in longest)
                )
    return "\n".join(lines)


def export(commits: list[str], folder: Path) -> list[Path]:
    """Each commit's legalpt/ and csrc/ into folder/<sha>: trees to carry to a machine whose git lacks the commits."""
    trees = []
    for commit in commits:
        sha = git("rev-parse", "--short", f"{commit}^{{commit}}")
        tree = folder / sha
        if tree.exists():
            shutil.rmtree(tree)
        tree.mkdir(parents=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", sha, "legalpt", "csrc"], capture_output=True)
        if archive.returncode:
            raise SystemExit(f"git archive {sha}: {archive.stderr.decode().strip()}")
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            # the "data" filter where this Python has it (3.10.12, 3.11.4 and later); the archive is this git's own
            tar.extractall(tree, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
        trees.append(tree)
    return trees


def sources(specs: list[str], work: Path, made: list[Path]) -> list[tuple[str, Path]]:
    """Per spec its label and tree. A spec is a folder holding legalpt/ (an export) or a git revision, checked out
    into a worktree under --work (added to `made`, for removal) once every revision is known to exist."""
    folders = {spec: Path(spec).resolve() for spec in specs if (Path(spec) / "legalpt").is_dir()}
    shas = {spec: git("rev-parse", "--short", f"{spec}^{{commit}}") for spec in specs if spec not in folders}
    runs = []
    for spec in specs:
        if spec in folders:
            runs.append((folders[spec].name, folders[spec]))
            continue
        tree = work / "trees" / shas[spec]
        if tree not in made:
            checkout(shas[spec], tree)
            made.append(tree)
        runs.append((shas[spec], tree))
    return runs


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.export:
        for tree in export(args.commits, args.export):
            print(f"exported {tree}")
        return 0
    work = args.work.resolve()
    made: list[Path] = []
    try:
        trees = sources(args.commits, work, made)
        dims = head_dims(args.bench_args)
        if "--device" not in args.bench_args or args.bench_args[args.bench_args.index("--device") + 1] == "cuda":
            build_kernels(dict(trees), work, dims)
        runs = []
        for n, (label, tree) in enumerate(trees):
            out = work / "runs" / f"{n}-{label}"
            out.mkdir(parents=True, exist_ok=True)
            for old in out.glob("attention-*"):  # an earlier day's record would be read as this one's
                old.unlink()
            print(f"\n== {n}:{label} ({args.commits[n]})", flush=True)
            command = [sys.executable, str(BENCH), *args.bench_args, "--out", str(out)]
            if subprocess.run(command, env=environment(tree, work, label, dims)).returncode:
                raise SystemExit(f"the benchmark of {n}:{label} failed (its output is above)")
            runs.append(load_rows(out))
    finally:
        for tree in made:
            if tree.exists():
                git("worktree", "remove", "--force", str(tree))
    print(f"\nrecords under {work / 'runs'}; ratios: the first commit's ms over each one's\n")
    print(compare([f"{n}:{label}" for n, (label, _) in enumerate(trees)], runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
