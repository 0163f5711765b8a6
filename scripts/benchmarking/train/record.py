"""The training benchmark's record, {"header", "rows", "search", "longest"}, the merge of a run split over several
processes, and the tables the script prints last (scripts/performance_table.py renders the record).

rows: the throughput jobs, each with `vs_sdpa`, its tokens/s over the sdpa job's of the same setting, seq_len and
batch size (null for sdpa itself and where either is missing); search: the jobs of the longest-seq_len search;
longest: per searched setting, the longest seq_len that trained and the shortest above it that ran out of memory.
"""

from __future__ import annotations

from .. import record

SETTING_FIELDS = ("model", "attention", "activation_checkpointing", "save_attention", "offload_activations",
                  "mlp_chunk_tokens", "precision", "loss_impl", "compile", "grad_accum", "gpus",
                  "documents")  # fmt: skip
ROW_KEY = (*SETTING_FIELDS, "seq_len", "batch_size")
BASELINE = "sdpa"  # the attention the ratios are against (transformers' sdpa, documents kept apart)


# what a field means in records from before it: rows merge with their redone jobs
ABSENT = {"save_attention": False, "offload_activations": False, "mlp_chunk_tokens": 0, "precision": "autocast",
          "grad_accum": 1, "documents": "long"}  # fmt: skip


def key(row: dict, fields: tuple[str, ...] = ROW_KEY) -> tuple:
    return tuple(ABSENT.get(f) if row.get(f) is None else row.get(f) for f in fields)


def with_ratios(rows: list[dict]) -> list[dict]:
    """`rows`, each with vs_sdpa (see the module's docstring)."""
    speed = {key(r): r["tokens_per_s"] for r in rows}
    at = ROW_KEY.index("attention")
    out = []
    for row in rows:
        mine, theirs = row["tokens_per_s"], speed.get((*key(row)[:at], BASELINE, *key(row)[at + 1 :]))
        ratio = mine / theirs if row["attention"] != BASELINE and mine and theirs else None
        out.append({**row, "vs_sdpa": ratio})
    return out


def build(head: dict, rows: list[dict], tries: list[dict], longest: list[dict], old: dict | None) -> dict:
    """The record of this run's jobs, added to `old` (the record --merge adds to) when given: the old entries that
    this run did not redo are kept, every part's command, commit and date are in the header, and so are the
    corpora of every part."""
    if old is not None:
        rows = _union(old["rows"], rows, ROW_KEY)
        tries = _union(old.get("search", []), tries, ROW_KEY)
        longest = _union(old.get("longest", []), longest, SETTING_FIELDS)
        before = old["header"]
        head = {
            **head,
            **record.parts(before, head),
            "documents": sorted({*before.get("documents", ["long"]), *head.get("documents", ["long"])}),
            **{corpus: head.get(corpus) or before.get(corpus) for corpus in ("data", "data_packed")},
        }
    return {"header": head, "rows": with_ratios(rows), "search": tries, "longest": longest}


def _union(old: list[dict], new: list[dict], fields: tuple[str, ...]) -> list[dict]:
    redone = {key(entry, fields) for entry in new}
    return [entry for entry in old if key(entry, fields) not in redone] + new


def options(row: dict) -> str:
    """A row's trainer options in one cell: activation checkpointing (+ saved attention, offloading, MLP chunks, bf16
    parameters, micro-batches a step) / loss / compile."""
    compiled = {True: "compiled", False: "eager", None: "–"}[row["compile"]]
    extras = [  # records from before these options lack them
        "saved attention" if row.get("save_attention") else "",
        "offloaded" if row.get("offload_activations") else "",
        f"MLP in {row['mlp_chunk_tokens']}-token chunks" if row.get("mlp_chunk_tokens") else "",
        "bf16 parameters" if row.get("precision") == "bf16-fsdp" else "",
        f"{row['grad_accum']} micro-batches a step" if (row.get("grad_accum") or 1) > 1 else "",
        "packed documents" if row.get("documents") == "packed" else "",
    ]
    ckpt = " + ".join([row["activation_checkpointing"] or "–", *filter(None, extras)])
    return f"{ckpt} / {row['loss_impl'] or '–'} / {compiled}"


def format_rows(rows: list[dict]) -> str:
    """The throughput rows as the run prints them."""
    lines = [
        f"{'attention':<10} {'model':<6} {'seq_len':>8} {'batch':>5} {'gpus':>4} {'ckpt/loss/compile':<48} "
        f"{'tokens/s':>10} {'MFU':>6} {'peak GiB':>8} {'vs sdpa':>8}"
    ]
    for r in rows:
        lines.append(
            f"{r['attention']:<10} {r['model']:<6} {r['seq_len']:>8} {r['batch_size']:>5} {r['gpus']:>4} "
            f"{options(r):<48} {cell(r, 'tokens_per_s', '{:,.0f}'):>10} {cell(r, 'mfu', '{:.1%}'):>6} "
            f"{cell(r, 'peak_gib', '{:.1f}'):>8} {cell(r, 'vs_sdpa', '{:.2f}x'):>8}"
        )
    return "\n".join(lines)


def format_profiles(rows: list[dict]) -> str:
    """Per profiled row: wall and GPU-busy milliseconds per step, and kernel milliseconds by kind."""
    lines = []
    for r in rows:
        if not (profile := r.get("profile")):
            continue
        kinds = ", ".join(f"{kind} {ms:.1f}" for kind, ms in profile["kernel_ms"].items())
        lines.append(
            f"{r['attention']:<10} {r['model']:<6} {r['seq_len']:>8} {options(r):<48} wall {profile['wall_ms']:.1f}, "
            f"busy {profile['device_busy_ms']:.1f} | {kinds}"
        )
    return "\n".join(lines) or "no job left a profile"


def format_longest(longest: list[dict]) -> str:
    """The search's results as the run prints them."""
    lines = [f"{'attention':<10} {'model':<6} {'gpus':>4} {'ckpt/loss/compile':<48} {'longest':>9} {'OOM at':>9}"]
    for e in longest:
        found = "–" if e["longest_seq_len"] is None else f"{e['longest_seq_len']:,}"
        oom = "–" if e["first_oom"] is None else f"{e['first_oom']:,}"
        note = "" if e["complete"] else "  (search not finished)"
        note += f"  error: {e['error']}" if e["error"] else ""
        lines.append(f"{e['attention']:<10} {e['model']:<6} {e['gpus']:>4} {options(e):<48} {found:>9} {oom:>9}{note}")
    return "\n".join(lines)


def cell(row: dict, name: str, form: str) -> str:
    """A measured value; OOM or "failed" where the job did not finish, – where the trainer does not log it."""
    if row["oom"]:
        return "OOM"
    if row["error"]:
        return "failed"
    return "–" if row.get(name) is None else form.format(row[name])
