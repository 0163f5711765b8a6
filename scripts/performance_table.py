"""Render docs/performance.md from the JSON records in bench/results/ (figures are never typed by hand).

python scripts/performance_table.py
"""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


def default_runs() -> list[str]:
    lines = [
        "## Default job (`legalpt-train`, then `legalpt-eval` on its checkpoint)",
        "",
        "Cold cache: corpus, tokenizer and packing are built inside the measured time.",
        "",
        "| device | torch | commit | train wall | eval loss first → final | ratio | train tok/s | eval wall | record |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for path in sorted(RESULTS.glob("default-run-*.json")):
        r = json.loads(path.read_text())
        eval_wall = f"{r['eval_wall_s'] / 60:.1f} min" if "eval_wall_s" in r else "–"
        lines.append(
            f"| {r['device']} ({r['cores']} cores) | {r['torch']} | {r['commit']} | {r['wall_s'] / 60:.1f} min | "
            f"{r['first_eval_loss']:.3f} → {r['final_eval_loss']:.3f} | {r['final_over_first']:.2f}× | "
            f"{r['median_train_tokens_per_s']:,.0f} | {eval_wall} | `{path.name}` |"
        )
    return lines


def generation() -> list[str]:
    lines = ["## Generation throughput (citation prompts, KV cache)", ""]
    for path in sorted(RESULTS.glob("generate-*.json")):
        record = json.loads(path.read_text())
        h = record["header"]
        lines += [
            f"{h['gpu']}, torch {h['torch']}, transformers {h['transformers']}, commit {h['commit']}, "
            f"{h['date'][:10]}: "
            f"preset `{h['preset']}` ({h['parameters'] / 1e9:.2f}B parameters, vocab {h['vocab_size']:,}), "
            f"{h['dtype']}, {h['prompt_tokens']}-token prompts, {h['max_new_tokens']} new tokens each; "
            f"legalpt backend `{h['legalpt_backend']}`. Command: `{h['command']}` (`{path.name}`).",
            "",
            "| attention | batch | prompts/s | new tokens/s | ours / sdpa |",
            "|---|---|---|---|---|",
        ]
        for row in record["rows"]:
            ratio = f"{row['ratio_vs_sdpa']:.2f}×" if row.get("ratio_vs_sdpa") is not None else ""
            lines.append(
                f"| {row['attention']} | {row['batch_size']} | {row['prompts_per_s']:.2f} | "
                f"{row['new_tokens_per_s']:,.1f} | {ratio} |"
            )
        lines.append("")
    return lines


def data_preparation() -> list[str]:
    lines = ["## Data preparation throughput (`scripts/bench_data.py`, same input and tokenizer)", ""]
    for path in sorted(RESULTS.glob("data-*.json")):
        record = json.loads(path.read_text())
        h = record["header"]
        corpus = h["corpus"]
        lines += [
            f"{h['machine']['cpu_count']} CPU cores, datasets {h['datasets']}, tokenizers {h['tokenizers']}, "
            f"commit {h['commit']}, {h['date'][:10]}: {corpus['documents']} {corpus['source']} documents, "
            f"{corpus['raw_bytes'] / 1e6:.1f} MB, seq_len {h['settings']['seq_len']}, num_proc "
            f"{h['settings']['num_proc']}; median of {h['settings']['repeats']}. Command: `{h['command']}` "
            f"(`{path.name}`).",
            "",
            "| variant | median s | MB/s | time / baseline | target |",
            "|---|---|---|---|---|",
        ]
        for row in record["rows"]:
            target = f"≤ {row['target_over_baseline']}×" if row.get("target_over_baseline") else ""
            lines.append(
                f"| {row['variant']} | {row['median_s']:.2f} | {row['mb_per_s']:.2f} | "
                f"{row['over_baseline']:.2f}× | {target} |"
            )
        lines.append("")
        if "streaming_memory" in record:
            lines += _streaming_memory(record["streaming_memory"], path.name)
    return lines


def _streaming_memory(part: dict, name: str) -> list[str]:
    """Peak memory of streaming prepare as the input grows (the `streaming_memory` part of a data record)."""
    h = part["header"]
    lines = [
        f"Streaming prepare, peak memory (a fresh process per size): commit {h['commit']}, {h['date'][:10]}, "
        f"seq_len {h['settings']['seq_len']}. Command: `{h['command']}` (`{name}`). Largest over smallest peak: "
        f"{part['peak_ratio']:.3f}× (target ≤ {part['target_ratio']}×).",
        "",
        "| input MB | documents | rows | seconds | MB/s | peak RSS MiB | RSS after imports MiB |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in part["rows"]:
        lines.append(
            f"| {row['mb']:,.0f} | {row['documents']:,} | {row['rows']:,} | {row['seconds']:.0f} | "
            f"{row['mb_per_s']:.2f} | {row['peak_rss_mib']:.1f} | {row['rss_after_imports_mib']:.1f} |"
        )
    return [*lines, ""]


def attention() -> list[str]:
    """Every GPU record of scripts/bench_attention.py, newest first: its ratio table and plot."""
    records = [json.loads(path.read_text()) | {"path": path} for path in RESULTS.glob("attention-*.json")]
    records = sorted((r for r in records if r["header"]["device"] == "cuda"), key=lambda r: r["header"]["date"])
    if not records:
        return []
    lines = ["## Attention kernels (`scripts/bench_attention.py`)", ""]
    for record in reversed(records):
        lines += _attention_record(record)
    return lines


def _attention_record(record: dict) -> list[str]:
    h, path, table = record["header"], record["path"], record["ratios"]
    code = h.get("code", f"commit {h['commit']}")  # a note where the measured code differs from the commit
    if h.get("complete") is False:  # written after each shape: a run cut off by a time limit keeps what it measured
        code += " (cut off before its last shape)"
    ours = table[0]["ours"] if table else "fa2"
    theirs = ("sdpa-flash", "sdpa-cudnn", "flex")
    lines = [
        f"### `{path.name}`",
        "",
        f"{h['gpu']}, torch {h['torch']}, CUDA {h['cuda']}, cuDNN {h['cudnn']}, {code}, "
        f"{h['date'][:16].replace('T', ' ')} UTC, {h['dtype']}; {h['timing']}. Ratios are times faster than the "
        f"other implementation (its ms / ours); memory is our fwd+bwd peak over sdpa-flash's. "
        f"Command: `{'` + `'.join(h.get('parts', [h['command']]))}`.",
        "",
        f"| mask | head dim | seqlen | batch × heads | mode | {ours} ms | "
        + " | ".join(f"{ours} / {t}" for t in theirs)
        + " | peak memory / sdpa-flash |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for e in table:
        cells = " | ".join(_times(e[f"vs_{t}"]) for t in theirs)
        lines.append(
            f"| {e['mask']} | {e['head_dim']} | {e['seqlen_q']:,} | {e['batch']} × {e['heads']} | {e['mode']} | "
            f"{e['ours_ms']:.3f} | {cells} | {_times(e['peak_vs_sdpa-flash'])} |"
        )
    if not table:
        lines.append(f"| no measured row of {ours} in this record |  |  |  |  |  |  |  |  |  |")
    plot = path.with_suffix(".png")
    if plot.exists():
        lines += ["", f"![TFLOP/s against seqlen, one line per implementation](../bench/results/{plot.name})"]
    return [*lines, ""]


def _times(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}×"


def main() -> None:
    text = [
        "# Performance",
        "",
        "Generated by `scripts/performance_table.py` from `bench/results/`; each record holds its command, versions",
        "and commit. Since commit 09ab86d, legalpt attention's `auto` backend runs our FA2 CUDA kernels on sm80+ GPUs",
        "(bf16/fp16; since 10212ec, our FA3 kernels on Hopper) and the pure-PyTorch reference elsewhere; GPU records",
        "of earlier commits ran the reference.",
        "",
        *default_runs(),
        "",
        *generation(),
        *data_preparation(),
        *attention(),
    ]
    out = ROOT / "docs" / "performance.md"
    out.parent.mkdir(exist_ok=True)
    out.write_text("\n".join(text).rstrip() + "\n")
    print(out.read_text())


if __name__ == "__main__":
    main()
