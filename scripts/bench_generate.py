"""Generation throughput: legalpt attention against transformers' sdpa, same weights, same prompts, one process.

A model preset is built from its config with random weights (conf/model/<preset>.yaml), with a byte-level BPE trained
on the demo corpus. The prompts are citation-style: the text of the demo opinions just before their citations (so a
prompt ends with the case name, "..., Marlowe Logistics Corp. v. Quarry Networks L.P., "), cut to its last
--prompt-tokens tokens. eos is held back, so every prompt generates exactly --max-new-tokens tokens whatever the random
weights predict. For each batch size, `legalpt.eval.generate` runs once to warm up per attn_implementation
("legalpt", "sdpa"), then --repeats timed runs of each, interleaved (legalpt, sdpa, sdpa, legalpt, ...: a drift of
the machine over the run weighs on both alike); a row keeps the fastest. The rows (prompts/s, new tokens/s,
ours/sdpa) go to <out>/generate-<gpu>-<yyyymmdd>.json (scripts/benchmarking/record.py names and heads it),
replacing the GPU's earlier record. With --profile, one more batch of each row runs under torch.profiler: the row's
`profile` says where that generate() call's time goes (wall against device-busy milliseconds, kernel time by kind:
legalpt.train.profiling), and the operators that took the most host time are printed, so that a host-bound row
shows what to cut.

    python scripts/bench_generate.py                                            # 1b preset, bf16, cuda
    python scripts/bench_generate.py --preset tiny --device cpu --prompts 8     # smoke test
    python scripts/bench_generate.py --batch-sizes 16 --profile                 # where the time goes
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
from benchmarking import record
from omegaconf import OmegaConf
from torch.profiler import ProfilerActivity, profile

from legalpt.attention import BACKEND_ENV, BACKENDS, get_backend
from legalpt.config import CONF_DIR, GenerationConfig, ModelConfig
from legalpt.data.demo import generate_documents
from legalpt.data.tokenizer import train_bpe
from legalpt.eval.generate import generate_with_stats
from legalpt.model import build_model, count_parameters
from legalpt.train.profiling import describe, summarize

ATTENTIONS = ("legalpt", "sdpa")  # ours first, then the baseline on the same weights


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="1b", help="model preset in conf/model/")
    parser.add_argument("--device", default="cuda", help="cuda | cpu")
    parser.add_argument("--dtype", default="auto", help="auto (bfloat16 on cuda, float32 on cpu) | bfloat16 | float32")
    parser.add_argument("--backend", default="auto", choices=BACKENDS, help="backend behind legalpt attention")
    parser.add_argument("--prompts", type=int, default=256, help="number of prompts")
    parser.add_argument("--prompt-tokens", type=int, default=256, help="tokens of text before each citation")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="tokens generated per prompt (eos held back)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[16, 64], help="prompts per generate() call")
    parser.add_argument("--documents", type=int, default=64, help="demo documents (prompts and tokenizer corpus)")
    parser.add_argument("--vocab-size", type=int, default=32000, help="BPE size (fewer if the corpus runs out)")
    parser.add_argument("--repeats", type=int, default=2, help="timed runs per row, interleaved; the fastest is kept")
    parser.add_argument("--profile", action="store_true", help="profile one more batch of each row (host and device)")
    parser.add_argument("--out", type=Path, default=record.RESULTS, help="folder of the JSON record")
    args = parser.parse_args(argv)
    for name in ("prompts", "prompt_tokens", "max_new_tokens", "documents", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1; got {getattr(args, name)}")
    if min(args.batch_sizes) < 1:
        parser.error(f"--batch-sizes must all be >= 1; got {args.batch_sizes}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: no CUDA GPU here (use --device cpu for a smoke test)")
    return args


def citation_prompts(documents: list[dict], tokenizer, count: int, prompt_tokens: int) -> list[str]:
    """`count` prompts spread evenly over every place where an opinion cites a case (full or short form): the
    `prompt_tokens` tokens before the citation's volume number."""
    places = []  # (text, offset of the volume number), in document order
    for document in documents:
        text, starts = document["text"], []
        for citation in document["meta"].get("citations", []):
            needle = f"{citation['volume']} {citation['reporter']} "
            start = text.find(needle)
            while start >= 0:
                starts.append(start)
                start = text.find(needle, start + 1)
        places += [(text, start) for start in sorted(starts)]
    if len(places) < count:
        raise ValueError(f"--prompts: the corpus has {len(places)} citations, fewer than {count}; raise --documents")
    prompts = []
    for i in range(count):
        text, start = places[i * len(places) // count]
        before = text[max(0, start - 16 * prompt_tokens) : start]  # more characters than tokens needed
        ids = tokenizer(before, add_special_tokens=False)["input_ids"][-prompt_tokens:]
        prompts.append(tokenizer.decode(ids))
    return prompts


def model_config(preset: str, dtype: str, backend: str) -> ModelConfig:
    path = CONF_DIR / "model" / f"{preset}.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"--preset: no {path}")
    overrides = {"dtype": dtype, "attn_implementation": "legalpt", "attention_backend": backend}
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), OmegaConf.load(path), overrides))


def warm_up(model, tokenizer, prompts: list[str], cfg: GenerationConfig, desc: str) -> None:
    generate_with_stats(
        model, tokenizer, prompts[: cfg.batch_size], cfg, desc=f"{desc} warm-up", min_new_tokens=cfg.max_new_tokens
    )


def timed(model, tokenizer, prompts: list[str], cfg: GenerationConfig, device: str, desc: str) -> dict:
    """Every prompt timed; the clock reads after the device has finished."""
    synchronize(device)
    start = time.perf_counter()
    result = generate_with_stats(model, tokenizer, prompts, cfg, desc=desc, min_new_tokens=cfg.max_new_tokens)
    synchronize(device)
    seconds = time.perf_counter() - start
    return {
        "prompts": len(prompts),
        "prompt_tokens": sum(result.prompt_tokens),
        "new_tokens": sum(result.new_tokens),
        "seconds": seconds,
        "prompts_per_s": len(prompts) / seconds,
        "new_tokens_per_s": sum(result.new_tokens) / seconds,
    }


def profiled(model, tokenizer, prompts: list[str], cfg: GenerationConfig, device: str, desc: str) -> dict:
    """One batch's generate() call under torch.profiler: the summary of where its time went (steps = 1 call); the
    operators with the most host time printed."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    batch = prompts[: cfg.batch_size]
    synchronize(device)
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        generate_with_stats(model, tokenizer, batch, cfg, desc=f"{desc} profiled", min_new_tokens=cfg.max_new_tokens)
        synchronize(device)
        wall_s = time.perf_counter() - start
    summary = summarize(prof, wall_s, steps=1)
    print(f"\n{desc}: one generate() call of {len(batch)} prompts\n{describe(summary, unit='call')}")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=60))
    return summary


def label(attention: str, batch_size: int) -> str:
    return f"{attention} bs={batch_size}"


def interleaved(repeats: int) -> list[str]:
    """The attention implementations' timed runs in order: ATTENTIONS, then reversed, and so on, `repeats` each."""
    return [name for r in range(repeats) for name in (ATTENTIONS if r % 2 == 0 else ATTENTIONS[::-1])]


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def header(args: argparse.Namespace, argv: list[str] | None, model, tokenizer, dtype: str) -> dict:
    return record.header(
        "generate", args.device, __file__, argv,
        preset=args.preset,
        parameters=count_parameters(model),
        vocab_size=len(tokenizer),
        dtype=dtype,
        legalpt_backend=os.environ.get(BACKEND_ENV) or get_backend(),
        max_new_tokens=args.max_new_tokens,
        prompt_tokens=args.prompt_tokens,
        repeats=args.repeats,  # timed runs per row, interleaved; a row holds the fastest
    )  # fmt: skip


def table(rows: list[dict]) -> str:
    lines = [f"{'attention':<10} {'batch':>5} {'prompts/s':>10} {'new tokens/s':>13} {'ours/sdpa':>10}"]
    for row in rows:
        ratio = f"{row['ratio_vs_sdpa']:.2f}" if "ratio_vs_sdpa" in row else ""
        lines.append(
            f"{row['attention']:<10} {row['batch_size']:>5} {row['prompts_per_s']:>10.2f} "
            f"{row['new_tokens_per_s']:>13.1f} {ratio:>10}"
        )
    return "\n".join(lines)


def measure(model, tokenizer, prompts: list[str], args: argparse.Namespace, batch_size: int) -> list[dict]:
    """The rows of one batch size, ours then sdpa's: the fastest of each one's interleaved timed runs."""
    generation = GenerationConfig(max_new_tokens=args.max_new_tokens, batch_size=batch_size)
    runs = {attention: [] for attention in ATTENTIONS}
    for attention in interleaved(args.repeats):
        model.set_attn_implementation(attention)
        desc = label(attention, batch_size)
        if not runs[attention]:
            warm_up(model, tokenizer, prompts, generation, desc)
        runs[attention].append(timed(model, tokenizer, prompts, generation, args.device, desc))
    rows = []
    for attention, measured in runs.items():
        best = min(measured, key=lambda run: run["seconds"])
        row = {"attention": attention, "batch_size": batch_size, **best, "repeats_s": [r["seconds"] for r in measured]}
        if args.profile:
            model.set_attn_implementation(attention)
            row["profile"] = profiled(model, tokenizer, prompts, generation, args.device, label(attention, batch_size))
        rows.append(row)
    rows[0]["ratio_vs_sdpa"] = rows[0]["new_tokens_per_s"] / rows[1]["new_tokens_per_s"]
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    dtype = args.dtype if args.dtype != "auto" else ("bfloat16" if args.device.startswith("cuda") else "float32")
    cfg = model_config(args.preset, dtype, args.backend)
    documents = generate_documents(args.documents)
    tokenizer = train_bpe([document["text"] for document in documents], args.vocab_size)
    prompts = citation_prompts(documents, tokenizer, args.prompts, args.prompt_tokens)
    torch.manual_seed(0)
    with torch.device(args.device):  # initialise on the device: a 1b model is slow to initialise on the host
        model = build_model(cfg, tokenizer)
    rows = [row for batch_size in args.batch_sizes for row in measure(model, tokenizer, prompts, args, batch_size)]
    path = record.write(args.out, {"header": header(args, argv, model, tokenizer, dtype), "rows": rows})
    print(f"wrote {path}")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
