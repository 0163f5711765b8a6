"""The one place that heads, names and writes a benchmark record.

A record is a JSON file `<benchmark>-<gpu>-<yyyymmdd>.json` in bench/results (or a script's --out). Its header says
what the figures belong to: the GPU (or "cpu<cores>" for a CPU measurement) and how many there are, the versions
of torch, CUDA, transformers and legalpt, the commit ("-dirty" when the code differs from it), the UTC date and the
command, then the benchmark's own settings. There is one current record per benchmark and GPU: writing one removes
the others of that benchmark and GPU, with the files beside them that share their name (a plot).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch

import legalpt
from legalpt.provenance import commit

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"


def machine(device: torch.device | str) -> str:
    """The name a measurement on `device` is filed under: the GPU's for a CUDA device, else "cpu<cores>"."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu{os.cpu_count()}"


def command(script: str | Path, argv: list[str] | None) -> str:
    """The command that ran `script` with `argv` (the process's arguments where None), from the repository root."""
    path = Path(script).resolve()
    shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    args = sys.argv[1:] if argv is None else argv
    return shlex.join([Path(sys.executable).name, str(shown), *args])


def header(
    benchmark: str, device: torch.device | str, script: str | Path, argv: list[str] | None, /, **settings
) -> dict:
    """A record's header: what every benchmark states (see the module's docstring), then its own `settings` (which
    may hold a key named like a parameter, such as the attention benchmark's `device`)."""
    cuda = torch.device(device).type == "cuda"
    return {
        "benchmark": benchmark,
        "gpu": machine(device),
        "gpu_count": torch.cuda.device_count() if cuda else 0,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": _version("transformers"),
        "legalpt": legalpt.__version__,  # of the legalpt imported, which an A/B takes from another tree
        "commit": commit(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": command(script, argv),
        **settings,
    }


def parts(before: dict, head: dict) -> dict:
    """The header fields of a record merged from several runs: every run's command (`parts`) and, beside each, the
    commit and date it ran at (`part_provenance`), for the rows an earlier run measured. A record merged before
    provenance was kept names only its last part's ("" for the parts before it: unknown)."""
    earlier = before.get("parts", [before["command"]])
    known = before.get("part_provenance") or [*[""] * (len(earlier) - 1), _provenance(before)]
    return {"parts": [*earlier, head["command"]], "part_provenance": [*known, _provenance(head)]}


def _provenance(head: dict) -> str:
    """ "commit <sha>, <yyyy-mm-dd>", of what a header names (every record's does; a test's may not)."""
    named = [f"commit {head['commit']}" if head.get("commit") else "", head.get("date", "")[:10]]
    return ", ".join(filter(None, named))


def _version(package: str) -> str | None:
    try:
        return version(package)  # from the installed metadata: importing transformers takes seconds
    except PackageNotFoundError:
        return None


def path_of(out: Path, head: dict) -> Path:
    """Where the record with header `head` goes in the folder `out`."""
    return out / f"{_stem(head['benchmark'], head['gpu'])}-{head['date'][:10].replace('-', '')}.json"


def current(out: Path, benchmark: str, gpu: str) -> Path | None:
    """The record of `benchmark` on `gpu` in `out` (the newest, should there be several), or None."""
    return max(_records(out, benchmark, gpu), default=None)


def write(out: Path, record: dict, head: dict | None = None) -> Path:
    """Write `record` to `out` under the name its header (`head`, else record["header"]) gives it, and remove the
    other records of the same benchmark and GPU. Returns the record's path."""
    head = head or record["header"]
    path = path_of(out, head)
    out.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(record, indent=2) + "\n")
    partial.replace(path)  # a run killed while writing leaves the previous record whole
    for old in _records(out, head["benchmark"], head["gpu"]):
        if old != path:
            for companion in out.glob(f"{old.stem}.*"):
                companion.unlink()
    return path


def _stem(benchmark: str, gpu: str) -> str:
    return f"{benchmark}-{re.sub(r'[^A-Za-z0-9._-]+', '-', gpu)}"


def _records(out: Path, benchmark: str, gpu: str) -> list[Path]:
    """The records of `benchmark` on `gpu` in `out`, oldest first: names that are exactly <stem>-<8 digits>.json."""
    name = re.compile(re.escape(_stem(benchmark, gpu)) + r"-\d{8}\.json")
    return sorted(path for path in out.glob("*.json") if name.fullmatch(path.name))
