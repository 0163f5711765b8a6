"""The attention benchmark's record: its rows, the ratio table over them, and the merge of a run split over several
processes into one record (a full run on a fresh machine takes longer than one process may run).

A record is {"header", "rows", "ratios"}; scripts/performance_table.py renders the ratio table. Ratios are of our
implementation, the first of OURS that has measured rows, against each of THEIRS on the same shape and mode.
"""

from __future__ import annotations

from pathlib import Path

from .. import record

OURS = ("fa3", "fa2", "reference")  # the implementation the ratios are of: the first of these that runs
THEIRS = ("sdpa-flash", "sdpa-cudnn", "flex")  # what the ratios compare it with
_KEY_FIELDS = ("group", "mask", "head_dim", "seqlen_q", "batch", "heads", "heads_k", "layers", "mode")  # shape, mode
_DEFAULTS = {"heads_k": lambda row: row["heads"], "layers": lambda row: 1}  # fields older records lack


def ratios(rows: list[dict]) -> list[dict]:
    """Per shape and mode: our time and how many times faster ours is than each other implementation
    (their ms / our ms); for fwd+bwd also our peak memory over sdpa-flash's."""
    measured = {(*_key(r), r["impl"]): r for r in rows if r["ms"] is not None}
    ours = next((impl for impl in OURS if any(key[-1] == impl for key in measured)), None)
    table = []
    for key in dict.fromkeys(_key(r) for r in rows):
        mine = measured.get((*key, ours))
        if mine is None:
            continue
        entry = {"ours": ours, "ours_ms": mine["ms"], **dict(zip(_KEY_FIELDS, key, strict=True))}
        for impl in THEIRS:
            theirs = measured.get((*key, impl))
            entry[f"vs_{impl}"] = theirs["ms"] / mine["ms"] if theirs else None
        sdpa = measured.get((*key, "sdpa-flash"))
        usable = sdpa and mine["peak_mib"] and sdpa["peak_mib"]
        entry["peak_vs_sdpa-flash"] = mine["peak_mib"] / sdpa["peak_mib"] if usable else None
        table.append(entry)
    return table


def _key(row: dict) -> tuple:
    return tuple(row[f] if f in row else _DEFAULTS[f](row) for f in _KEY_FIELDS)


def format_ratios(table: list[dict]) -> str:
    """The ratio table as the run prints it last."""
    if not table:
        return "no ratios: the implementation of ours (fa3, fa2, or reference on the CPU) has no measured row"
    ours = table[0]["ours"]
    lines = [
        f"{'mask':<20} {'d':>3} {'seqlen':>6} {'BxH/Hk':>9} {'mode':<7} {ours + ' ms':>10} "
        + " ".join(f"{ours + '/' + t:>16}" for t in THEIRS)
        + f" {'mem/sdpa-flash':>14}"
    ]
    for e in table:
        cells = " ".join(f"{_times(e[f'vs_{t}']):>16}" for t in THEIRS)
        lines.append(
            f"{e['mask']:<20} {e['head_dim']:>3} {e['seqlen_q']:>6} {e['batch']:>2}x{e['heads']:>2}/{e['heads_k']:<3} "
            f"{e['mode']:<7} "
            f"{e['ours_ms']:>10.3f} {cells} {_times(e['peak_vs_sdpa-flash']):>14}"
        )
    return "\n".join(lines)


def _times(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}x"


def merged(old: dict, rows: list[dict], head: dict) -> tuple[list[dict], dict]:
    """A record assembled from runs split over several processes: the old record's rows that this run did not
    re-measure, then this run's; every part's command, commit and date in the header. Each comparison of
    implementations on one shape still comes from one process."""
    new = {(*_key(r), r["impl"]) for r in rows}
    kept = [r for r in old["rows"] if (*_key(r), r["impl"]) not in new]
    return kept + rows, {**head, **record.parts(old["header"], head)}


def write_record(out: Path, old: dict | None, rows: list[dict], head: dict) -> tuple[Path, list[dict], list[dict]]:
    """Write the record of `rows` (merged into `old`, the record --merge adds to, if any) to the folder `out`;
    returns its path, rows and ratio table. head["complete"] is False while shapes of the run are still to come."""
    if old is not None:
        rows, head = merged(old, rows, head)
    table = ratios(rows)
    return record.write(out, {"header": head, "rows": rows, "ratios": table}), rows, table
