"""Render docs/performance.md from the current records in bench/results/ (figures are never typed by hand).

There is one record per benchmark and GPU (scripts/benchmarking/record.py writes them); each header names the GPU,
versions, commit, date and command, and every table here says which record it comes from.

    python scripts/performance_table.py
"""

from __future__ import annotations

import json
from pathlib import Path

from benchmarking.train.record import cell, options  # scripts/ is on the path of a script run

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
OUT = ROOT / "docs" / "performance.md"
SDPA = ("sdpa-flash", "sdpa-cudnn")  # the attention baselines that run dense and causal masks natively
# the headline's shapes against FlexAttention: (mask, seqlen)
FLEX_HEADLINE = (
    ("window-1024", 65536),
    ("global64+window-1024", 65536),
    ("window-4096", 65536),
    ("varlen-causal", 16384),
)


def records(benchmark: str) -> list[tuple[Path, dict]]:
    """The records of `benchmark` (one per GPU), by file name."""
    return [(path, json.loads(path.read_text())) for path in sorted(RESULTS.glob(f"{benchmark}-*.json"))]


def provenance(head: dict, path: Path) -> str:
    """What a record's figures belong to: GPU, versions, commit, date, the record's file, a note if it has one."""
    names = {"torch": "torch", "cuda": "CUDA", "transformers": "transformers", "legalpt": "legalpt"}
    versions = ", ".join(f"{name} {head[key]}" for key, name in names.items() if head.get(key))
    note = f" {head['note'][0].upper()}{head['note'][1:]}." if head.get("note") else ""
    return f"{head['gpu']}; {versions}; commit {head['commit']}, {head['date'][:10]} (`{path.name}`).{note}"


def commands(head: dict) -> list[str]:
    """The command lines that measured a record (several where a run was split over processes or merged from runs
    at other commits: each then with its commit and date)."""
    lines = head.get("parts", [head["command"]])
    if head.get("part_provenance"):
        provenance = head["part_provenance"]
        lines = [f"{line}  # {where or 'commit unknown'}" for line, where in zip(lines, provenance, strict=True)]
    return ["```bash", *lines, "```", ""]


def corpora(head: dict) -> str:
    """The corpora a training record's rows ran on, with their data overrides."""
    named = []
    if head.get("data") and head.get("parts"):  # each run sized its own; the merge keeps the last run's overrides
        named.append("the long-document demo corpus (data=demo_long, each run's documents at least its --doc-tokens "
                     "long, else its longest seq_len)")  # fmt: skip
    elif head.get("data"):
        named.append(f"the long-document demo corpus ({' '.join(head['data'])})")
    if head.get("data_packed"):
        named.append(f"the demo corpus as generated for the rows of packed documents ({' '.join(head['data_packed'])})")
    return " and ".join(named)


def steps(head: dict) -> str:
    """Which steps a training record's medians cover: a record merged from several runs (`parts`) sized each its own
    corpus and steps, as its command says."""
    if head.get("parts"):
        return "each job's warm-up (each run's --steps and --warmup below, else 10 and 3; its corpus sized to its rows)"
    return f"the first {head['warmup']} of {head['steps']}"


def training() -> list[str]:
    """Each GPU's training record: legalpt against sdpa through the same trainer, and the longest seq_len that trains
    (a CPU dry run is no figure and is left out)."""
    lines = []
    for path, record in records("train"):
        h = record["header"]
        if not h["gpu_count"]:
            continue
        peak = h.get("mfu_peak")
        against = f"MFU against {peak['name']}, {peak['tflops']:.1f} TFLOP/s per GPU" if peak else "no MFU logged"
        lines += [
            f"## Training on the {h['gpu']} (`scripts/bench_train.py`)",
            "",
            f"`legalpt-train` in a fresh process per job on {corpora(h)}; tokens/s and MFU are medians over the steps "
            f"after {steps(h)}; {against}. {provenance(h, path)}",
            "",
            *commands(h),
            "| model | attention | seq_len | batch × GPUs | checkpointing / loss / compile | tokens/s | MFU | peak GiB "
            "| / sdpa |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in record["rows"]:
            lines.append(
                f"| {r['model']} | {r['attention']} | {r['seq_len']:,} | {r['batch_size']} × {r['gpus']} | "
                f"{options(r)} | {cell(r, 'tokens_per_s', '{:,.0f}')} | {cell(r, 'mfu', '{:.1%}')} | "
                f"{cell(r, 'peak_gib', '{:.1f}')} | {cell(r, 'vs_sdpa', '{:.2f}×')} |"
            )
        lines.append("")
        if record.get("longest"):
            lines += [
                f"Longest seq_len that trains at batch 1 ({h['search']['steps']} steps a job; doubling from "
                f"{h['search']['start']:,}, then bisection to within 1/16):",
                "",
                "| model | attention | GPUs | checkpointing / loss / compile | longest | out of memory at |",
                "|---|---|---|---|---|---|",
            ]
            for e in record["longest"]:
                longest = "–" if e["longest_seq_len"] is None else f"{e['longest_seq_len']:,}"
                if e["first_oom"] is None:
                    oom = f"none up to {e['search_max']:,}" if e["complete"] and e["longest_seq_len"] else "–"
                else:
                    oom = f"{e['first_oom']:,}"
                note = f" (failed: {e['error']})" if e["error"] else "" if e["complete"] else " (search not finished)"
                lines.append(f"| {e['model']} | {e['attention']} | {e['gpus']} | {options(e)} | {longest}{note} "
                             f"| {oom} |")  # fmt: skip
            lines.append("")
    return lines


def default_runs() -> list[str]:
    lines = [
        "## Default job (`legalpt-train`, then `legalpt-eval` on its checkpoint)",
        "",
        "Cold data cache: corpus, tokenizer and packing are built inside the measured time.",
        "",
        "| device | train wall | eval loss first → final | ratio | train tok/s | eval wall | bits per byte |",
        "|---|---|---|---|---|---|---|",
    ]
    found = records("default-run")
    for _, r in found:
        lines.append(
            f"| {r['header']['gpu']} ({r['cores']} cores) | {r['wall_s'] / 60:.1f} min | "
            f"{r['first_eval_loss']:.3f} → {r['final_eval_loss']:.3f} | {r['final_over_first']:.2f}× | "
            f"{r['median_train_tokens_per_s']:,.0f} | {r['eval_wall_s'] / 60:.1f} min | {r['eval_bits_per_byte']:.3f} |"
        )
    for path, r in found:
        lines += ["", f"{provenance(r['header'], path)}", "", *commands(r["header"])[:-1]]
    return [*lines, ""]


def generation() -> list[str]:
    lines = ["## Generation throughput (citation prompts, KV cache)", ""]
    for path, record in records("generate"):
        h = record["header"]
        lines += [
            f"Preset `{h['preset']}` ({h['parameters'] / 1e9:.2f}B parameters, vocab {h['vocab_size']:,}), "
            f"{h['dtype']}, {h['prompt_tokens']}-token prompts, {h['max_new_tokens']} new tokens each; legalpt "
            f"backend `{h['legalpt_backend']}`. {provenance(h, path)}",
            "",
            *commands(h),
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
    for path, record in records("data"):
        h = record["header"]
        corpus, settings = h["corpus"], h["settings"]
        lines += [
            f"{corpus['documents']} {corpus['source']} documents, {corpus['raw_bytes'] / 1e6:.1f} MB, seq_len "
            f"{settings['seq_len']}, num_proc {settings['num_proc']}; median of {settings['repeats']}; datasets "
            f"{h['datasets']}, tokenizers {h['tokenizers']}. {provenance(h, path)}",
            "",
            *commands(h),
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
            lines += streaming_memory(record["streaming_memory"])
    return lines


def fp8_accuracy() -> list[str]:
    """FP8 attention's output error against float64, beside bf16's (`scripts/fp8_accuracy.py`)."""
    lines = ["## FP8 attention accuracy (`scripts/fp8_accuracy.py`)", ""]
    for path, record in records("fp8-accuracy"):
        h = record["header"]
        rmse = {row["method"]: row["rmse"] for row in record["rows"]}
        baseline = rmse["fp8 per-tensor"]
        lines += [
            f"Root-mean-square error of the output against float64 attention: {h['batch']} x {h['seqlen']} tokens, "
            f"{h['heads']} heads of {h['head_dim']}, {'causal' if h['causal'] else 'dense'}, inputs N(0, 1) plus "
            f"N(0, {h['outlier_std']:g}²) on {h['outlier_rate']:.1%} of the entries, {h['seeds']} seeds. "
            f"{provenance(h, path)}",
            "",
            *commands(h),
            "| method | RMSE | FP8 per-tensor's error / this one's |",
            "|---|---|---|",
            *(f"| {name} | {value:.2e} | {baseline / value:.2f}× |" for name, value in rmse.items()),
            "",
        ]
    return lines


def cleaning() -> list[str]:
    """Page-furniture precision and recall on the labelled set, and citations kept (`scripts/bench_cleaning.py`)."""
    lines = ["## Cleaning on a labelled set (`scripts/bench_cleaning.py`)", ""]
    for path, record in records("cleaning"):
        h, citations = record["header"], record["citations"]
        lines += [
            f"Real documents from `{h['data']}` and synthetic paginated ones, every line labelled furniture or text. "
            f"{provenance(h, path)}",
            "",
            *commands(h),
            "| set | documents | lines | furniture precision | furniture recall | text lines dropped |",
            "|---|---|---|---|---|---|",
        ]
        for name, part in record["furniture"].items():
            lines.append(
                f"| {name} | {part['documents']} | {part['lines']:,} | {part['precision']:.2%} | "
                f"{part['recall']:.2%} | {part['text_dropped']} |"
            )
        kept = ", ".join(f"{name} {c['kept']}/{c['before']}" for name, c in citations.items())
        added = sum(len(c["added"]) for c in citations.values())
        lines += ["", f"Citations kept through cleaning: {kept}; citations added: {added}.", ""]
    return lines


def finetuning() -> list[str]:
    """Held-out response loss before and after SFT, full and LoRA (`scripts/bench_finetune.py`)."""
    lines = ["## Supervised fine-tuning on the legal instruction set (`scripts/bench_finetune.py`)", ""]
    for path, record in records("finetune"):
        h = record["header"]
        lines += [
            f"Preset `{h['model']}`, {h['steps']} steps of batch {h['batch_size']} at seq_len {h['seq_len']}. "
            f"{provenance(h, path)}",
            "",
            *commands(h),
            "| method | trained / all parameters | held-out response loss before → after | tokens/s | peak GiB |",
            "|---|---|---|---|---|",
        ]
        for name, m in record["methods"].items():
            peak = f"{m['peak_gib']:.1f}" if m["peak_gib"] is not None else ""
            lines.append(
                f"| {name} | {m['trained']:,} / {m['parameters']:,} | {m['before']['loss']:.4f} → "
                f"{m['after']['loss']:.4f} | {m['tokens_per_s']:,.0f} | {peak} |"
            )
        lines.append("")
    return lines


def streaming_memory(part: dict) -> list[str]:
    """Peak memory of streaming prepare as the input grows (the `streaming_memory` part of a data record)."""
    h = part["header"]
    lines = [
        f"Streaming prepare, peak memory (a fresh process per size), seq_len {h['settings']['seq_len']}; commit "
        f"{h['commit']}, {h['date'][:10]}. Largest over smallest peak: {part['peak_ratio']:.3f}× (target ≤ "
        f"{part['target_ratio']}×).",
        "",
        *commands(h),
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
    """Each GPU's attention record: the headline ranges, then every shape against SDPA and against FlexAttention."""
    lines = []
    for path, record in records("attention"):
        h, table = record["header"], record["ratios"]
        if h.get("device") != "cuda" or not table:
            continue
        tflops = {_key(r): r["tflops"] for r in record["rows"] if r["impl"] == table[0]["ours"] and r["ms"]}
        lines += [
            f"## Attention kernels on the {h['gpu']} (`scripts/bench_attention.py`)",
            "",
            f"{h['dtype']}, {h['timing']}. {provenance(h, path)}",
            "",
            *commands(h),
            "Ratios are times faster than the other implementation (its ms over ours), on the same inputs in the same "
            "process; peak memory is our forward+backward peak over SDPA flash's.",
            "",
            *headline(table),
            *against_sdpa(table, tflops),
            *against_flex(table, tflops),
            *fp8_forward(record["rows"]),
            *layer_stacks(record["rows"]),
        ]
        plot = path.with_suffix(".png")
        if plot.exists():
            lines += [f"![TFLOP/s against seqlen, one line per implementation](../bench/results/{plot.name})", ""]
    return lines


def headline(table: list[dict]) -> list[str]:
    """Per comparison and head dim, the range of ratios over the shapes measured: the summary the README quotes."""
    ours = table[0]["ours"]
    head_dims = sorted({e["head_dim"] for e in table}, reverse=True)
    modes = ("fwd", "fwd+bwd")
    lines = [
        "### Headline",
        "",
        f"| {ours} against | shapes | head dim | {' | '.join(modes)} |",
        "|---|---|---|---|---|",
    ]
    for theirs in SDPA:
        for d in head_dims:
            sweep = [e for e in table if e["group"] == "sweep" and e["head_dim"] == d]
            cells = [_range(e[f"vs_{theirs}"] for e in sweep if e["mode"] == m) for m in modes]
            if any(cell != "–" for cell in cells):  # the comparisons the record measured
                lines.append(f"| {theirs} | dense and causal, {_tokens(sweep)} | {d} | {' | '.join(cells)} |")
    for mask, seqlen in FLEX_HEADLINE:
        for d in head_dims:
            rows = [e for e in table if (e["mask"], e["seqlen_q"], e["head_dim"]) == (mask, seqlen, d)]
            cells = [_range(e["vs_flex"] for e in rows if e["mode"] == m) for m in modes]
            if any(cell != "–" for cell in cells):
                lines.append(f"| flex | {mask}, {seqlen // 1024}k tokens | {d} | {' | '.join(cells)} |")
    return [*lines, ""]


def _tokens(rows: list[dict]) -> str:
    """The sequence lengths a sweep measured, as a range: "1k–16k tokens"."""
    lengths = sorted({e["seqlen_q"] // 1024 for e in rows})
    return f"{lengths[0]}k tokens" if len(lengths) == 1 else f"{lengths[0]}k–{lengths[-1]}k tokens"


def against_sdpa(table: list[dict], tflops: dict) -> list[str]:
    ours = table[0]["ours"]
    lines = [
        "### Dense and causal, against SDPA's flash and cuDNN backends",
        "",
        f"| mask | head dim | seqlen | batch × heads (/ key heads) | mode | {ours} ms | {ours} TFLOP/s | "
        + " | ".join(f"/ {t}" for t in SDPA)
        + " | peak memory / sdpa-flash |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for e in table:
        if any(e[f"vs_{t}"] is not None for t in SDPA):
            cells = " | ".join(_times(e[f"vs_{t}"]) for t in SDPA)
            lines.append(f"{_shape(e, tflops)} {cells} | {_times(e['peak_vs_sdpa-flash'])} |")
    return [*lines, ""]


def against_flex(table: list[dict], tflops: dict) -> list[str]:
    ours = table[0]["ours"]
    lines = [
        "### Sliding windows, global tokens and packed documents, against FlexAttention",
        "",
        f"| mask | head dim | seqlen | batch × heads (/ key heads) | mode | {ours} ms | {ours} TFLOP/s | / flex |",
        "|---|---|---|---|---|---|---|---|",
    ]
    rows = [f"{_shape(e, tflops)} {_times(e['vs_flex'])} |" for e in table if e["vs_flex"] is not None]
    return [*lines, *rows, ""] if rows else []  # a record without Flex rows has no such section


def layer_stacks(rows: list[dict]) -> list[str]:
    """The rows measured as a model's layers call the attention (--layers, --kernel-times): the share of the wall
    time the GPU spends in kernels, and of one profiled trace's timeline (gpu_busy): what host overhead leaves."""
    stacks = [r for r in rows if r.get("kernel_share") is not None]
    if not stacks:
        return []
    lines = [
        "Layer stacks (`--layers`: every layer's forward, then one backward through all; the kernels' share is their "
        "summed time over the wall time, from separate runs; GPU busy, from one profiled trace, is their share of the "
        "span from its first kernel to its last: the rest is where the GPU waited for the host, slowed by the "
        "profiler):",
        "",
        "| implementation | mask | head dim | seqlen | batch × heads | mode | layers | ms | kernels' share "
        "| GPU busy |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in stacks:
        busy = f"{r['gpu_busy']:.3f}" if r.get("gpu_busy") is not None else "–"
        lines.append(
            f"| {r['impl']} | {r['mask']} | {r['head_dim']} | {r['seqlen_q']:,} | {r['batch']} × {_heads(r)} | "
            f"{r['mode']} | {r['layers']} | {r['ms']:.1f} | {r['kernel_share']:.3f} | {busy} |"
        )
    return [*lines, ""]


def fp8_forward(rows: list[dict]) -> list[str]:
    """The FP8 forward against our bf16/fp16 forward (fa3) per shape: the kernel alone (fa3-fp8-kernel) and with its
    quantization (fa3-fp8, `flash_attn_fp8_func`)."""
    by_impl = {
        impl: {_key(r): r for r in rows if r["impl"] == impl and r["ms"]}
        for impl in ("fa3", "fa3-fp8", "fa3-fp8-kernel")
    }
    ours = by_impl["fa3"]
    keys = [key for key in {**by_impl["fa3-fp8"], **by_impl["fa3-fp8-kernel"]} if key in ours]
    if not keys:
        return []
    lines = [
        "FP8 forward against ours in the record's dtype (kernel: inputs quantized beforehand; with quantization: "
        "`flash_attn_fp8_func`):",
        "",
        "| mask | head dim | seqlen | batch × heads | ours ms | FP8 kernel ms | TFLOP/s | speedup "
        "| with quantization ms | speedup |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key in keys:
        base, kernel, whole = ours[key], by_impl["fa3-fp8-kernel"].get(key), by_impl["fa3-fp8"].get(key)
        cells = [f"{base['mask']} | {base['head_dim']} | {base['seqlen_q']:,} | {base['batch']} × {_heads(base)}",
                 f"{base['ms']:.3f}"]  # fmt: skip
        for row, with_rate in ((kernel, True), (whole, False)):
            if row is None:
                cells += ["–", "–", "–"] if with_rate else ["–", "–"]
                continue
            cells += [
                f"{row['ms']:.3f}",
                *([f"{row['tflops']:.0f}"] if with_rate else []),
                f"{base['ms'] / row['ms']:.2f}×",
            ]
        lines.append("| " + " | ".join(cells) + " |")
    return [*lines, ""]


def _shape(e: dict, tflops: dict) -> str:
    """A ratio table's leading cells: the shape, the mode, our time and throughput."""
    rate = tflops.get(_key(e))
    return (
        f"| {e['mask']} | {e['head_dim']} | {e['seqlen_q']:,} | {e['batch']} × {_heads(e)} | {e['mode']} | "
        f"{e['ours_ms']:.3f} | {'–' if rate is None else f'{rate:.0f}'} |"
    )


def _key(e: dict) -> tuple:
    return (e["group"], e["mask"], e["head_dim"], e["seqlen_q"], e["batch"], e["heads"], _kv_heads(e),
            e.get("layers", 1), e["mode"])  # fmt: skip


def _kv_heads(e: dict) -> int:
    return e.get("heads_k", e["heads"])  # records from before GQA shapes: as many as query heads


def _heads(e: dict) -> str:
    """Query heads, and key/value heads where fewer (GQA): "32" or "32 / 4"."""
    return str(e["heads"]) if _kv_heads(e) == e["heads"] else f"{e['heads']} / {_kv_heads(e)}"


def _range(values) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "–"
    low, high = min(values), max(values)
    return f"{low:.2f}×" if f"{low:.2f}" == f"{high:.2f}" else f"{low:.2f}–{high:.2f}×"


def _times(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}×"


def main() -> None:
    text = [
        "# Performance",
        "",
        "The current figures, generated by `scripts/performance_table.py` from the records in `bench/results/` (one",
        "per benchmark and GPU; each names its GPU, versions, commit, date and command). Earlier records are in git.",
        "",
        *attention(),
        *training(),
        *default_runs(),
        *generation(),
        *fp8_accuracy(),
        *data_preparation(),
        *cleaning(),
        *finetuning(),
    ]
    OUT.write_text("\n".join(text).rstrip() + "\n")
    print(f"wrote {OUT} ({OUT.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
