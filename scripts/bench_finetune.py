"""Supervised fine-tuning on the legal instruction set: held-out response loss before and after, full fine-tuning
and LoRA side by side, with their training time and (on a GPU) peak memory.

Each step goes through legalpt's own entry points, in this process:

    1. the instruction set: scripts/build_legal_instructions.py on --data → <work>/instructions/{train,heldout}.jsonl
       (held out by whole document: no contract or opinion gives examples to both)
    2. the base model: --base (a checkpoint), else legalpt-train of --model on the demo corpus for --pretrain-steps
    3. per --methods (full, lora): legalpt-train of the base with data.format=sft on train.jsonl for --steps
    4. legalpt-eval with data.format=sft on heldout.jsonl (eval.documents=all, task response_loss), the base as
       checkpoint 1 and the tuned model as checkpoint 2: loss over response tokens only, prompts masked

The record goes to <out>/finetune-<gpu>-<yyyymmdd>.json (scripts/benchmarking/record.py names and heads it): the
instruction set's counts, the base, and per method the held-out response loss and perplexity before and after,
trainable parameters, seconds, last train loss, tokens/s and peak GPU memory (from the run's metrics.jsonl). It
says whether every method lowered the held-out response loss.

    python scripts/bench_finetune.py                                   # CPU: tiny preset, full and LoRA
    python scripts/bench_finetune.py --device cuda --model 125m --pretrain-steps 200 --steps 500 --batch-size 16
    python scripts/bench_finetune.py --device cuda --model 1b --seq-len 4096 --batch-size 1 \
        --override train.activation_checkpointing=full                 # both methods with checkpointing
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import build_legal_instructions as instructions
from benchmarking import record

from legalpt.config import compose

METHODS = {"full": [], "lora": ["train.lora.enabled=true"]}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=instructions.DATA, help="folder with contracts/ and opinions/")
    parser.add_argument("--model", default="tiny", help="model preset in conf/model/ of the base")
    parser.add_argument("--base", help="checkpoint to fine-tune (default: pretrain --model on the demo corpus)")
    parser.add_argument("--pretrain-steps", type=int, default=300, help="optimizer steps of the base's pretraining")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS), help="how to fine-tune")
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps of each fine-tuning")
    parser.add_argument("--batch-size", type=int, default=8, help="packed rows per step")
    parser.add_argument("--seq-len", type=int, default=512, help="data.seq_len of pretraining and fine-tuning rows")
    parser.add_argument("--lr", type=float, default=1e-3, help="peak learning rate of full fine-tuning")
    parser.add_argument("--lora-lr", type=float, default=3e-3, help="peak learning rate of LoRA")
    parser.add_argument("--vocab-size", type=int, default=8192, help="BPE trained on the demo corpus for the base")
    parser.add_argument("--heldout-fraction", type=float, default=0.2, help="share of documents held out")
    parser.add_argument("--seed", type=int, default=0, help="seed of the document split and of training")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="where to train and evaluate")
    parser.add_argument("--work", type=Path, help="folder of the runs (default: a temporary one, removed after)")
    parser.add_argument("--out", type=Path, default=record.RESULTS, help="folder of the JSON record")
    parser.add_argument("--override", nargs="+", action="extend", default=[],
                        help="Hydra overrides of every fine-tuning job, the same for each method "
                        "(e.g. train.activation_checkpointing=full)")  # fmt: skip
    args = parser.parse_args(argv)
    for name in ("pretrain_steps", "steps", "batch_size", "seq_len", "vocab_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1; got {getattr(args, name)}")
    for name in ("lr", "lora_lr"):
        if not getattr(args, name) > 0:
            parser.error(f"--{name.replace('_', '-')} must be > 0; got {getattr(args, name)}")
    if not 0 < args.heldout_fraction < 1:
        parser.error(f"--heldout-fraction must be in (0, 1); got {args.heldout_fraction}")
    return args


def common(args: argparse.Namespace, work: Path) -> list[str]:
    """Overrides of every train and eval job: the model preset, rows, cache, no tracker."""
    return [f"model={args.model}", f"data.seq_len={args.seq_len}", f"data.cache_dir={work / 'cache'}", "logger=none"]


def schedule(args: argparse.Namespace, steps: int, lr: float, run: Path) -> list[str]:
    """A run of `steps` steps at peak `lr` in `run` that evaluates and saves only at its end."""
    return [f"train.steps={steps}", f"train.batch_size={args.batch_size}", f"train.lr={lr}",
            f"train.warmup_steps={max(1, steps // 20)}", f"train.eval_every={steps}", f"train.save_every={steps}",
            "train.eval_batches=4", f"train.log_every={max(1, steps // 10)}", f"train.seed={args.seed}",
            f"train.output_dir={run}"]  # fmt: skip


def train_run(args: argparse.Namespace, work: Path, overrides: list[str]) -> dict:
    """legalpt-train with `overrides`: its export, seconds, and what its metrics.jsonl logged."""
    from legalpt.train.trainer import train

    gc.collect()  # the previous run's model and optimizer, before this run's memory peak is taken
    clock = time.perf_counter()
    result = train(compose("train", [*common(args, work), *overrides]))
    seconds = time.perf_counter() - clock
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    logged = [row for row in rows if "train/loss" in row]
    return {
        "export": str(result.export_dir),
        "seconds": round(seconds, 1),
        "train_loss_first": logged[0]["train/loss"],
        "train_loss_last": logged[-1]["train/loss"],
        # the median window past the first (allocation, autotuning): one window alone swings with a row's fill
        "tokens_per_s": statistics.median(row["train/tokens_per_s"] for row in logged[1:] or logged),
        "peak_gib": max((row["train/peak_gib"] for row in logged if "train/peak_gib" in row), default=None),
    }


def parameters(run: dict, lora: bool) -> dict:
    """Parameters of the exported model, and how many fine-tuning trained: all of them, or the adapters'."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from legalpt.model import count_parameters

    total = count_parameters(AutoModelForCausalLM.from_pretrained(run["export"]))
    if not lora:
        return {"parameters": total, "trained": total}
    adapters = load_file(Path(run["export"]).parent / "adapter" / "adapter_model.safetensors")
    return {"parameters": total, "trained": sum(tensor.numel() for tensor in adapters.values())}


def response_loss(args: argparse.Namespace, work: Path, heldout: Path, base: str, tuned: str, name: str) -> dict:
    """legalpt-eval's response_loss of `base` (before) and `tuned` (after) on the held-out examples."""
    from legalpt.eval.run import evaluate

    data = ["data.format=sft", f"data.paths=[{heldout}]", "eval.documents=all", "eval.tasks=[response_loss]"]
    overrides = [*data, f"eval.checkpoint={base}", f"eval.compare={tuned}", f"eval.output_dir={work / 'eval' / name}"]
    report = evaluate(compose("eval", [*common(args, work), *overrides]))
    before, after = (result["response_loss"] for result in report["checkpoints"].values())
    keys = ("loss", "perplexity", "tokens", "examples", "skipped")
    return {"before": {k: before[k] for k in keys}, "after": {k: after[k] for k in keys}}


def measure(args: argparse.Namespace, work: Path, argv: list[str] | None) -> dict:
    """Build the instruction set, get the base, fine-tune it each way and score every model; the record."""
    examples, built = instructions.build(args.data, args.heldout_fraction, args.seed)
    paths = instructions.write(examples, built, work / "instructions")
    train_file, heldout_file = paths[0], paths[1]
    base = {"checkpoint": args.base}
    if not args.base:
        pretrain = [f"data.vocab_size={args.vocab_size}", *schedule(args, args.pretrain_steps, 3e-3, work / "base")]
        base = {"pretrain_steps": args.pretrain_steps, **train_run(args, work, pretrain)}
    checkpoint = args.base or base["export"]
    methods = {}
    for method in args.methods:
        lora = method == "lora"
        run = schedule(args, args.steps, args.lora_lr if lora else args.lr, work / method)
        sft = ["data.format=sft", f"data.paths=[{train_file}]", f"model.pretrained={checkpoint}", *METHODS[method]]
        tuned = train_run(args, work, [*sft, *run, *(["train.lora.export=both"] if lora else []), *args.override])
        scored = response_loss(args, work, heldout_file, checkpoint, tuned["export"], method)
        methods[method] = {**scored, **tuned, **parameters(tuned, lora), "lr": args.lora_lr if lora else args.lr}
        methods[method].pop("export")
    head = record.header("finetune", args.device, __file__, argv, model=args.model, steps=args.steps,
                         batch_size=args.batch_size, seq_len=args.seq_len, seed=args.seed,
                         overrides=args.override)  # fmt: skip
    lowered = all(m["after"]["loss"] < m["before"]["loss"] for m in methods.values())
    base.pop("export", None)
    return {"header": head, "instructions": built, "base": base, "methods": methods, "heldout_loss_lowered": lowered}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device == "cpu":  # before anything touches CUDA: accelerate takes a GPU whenever it sees one
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    os.environ.setdefault("WANDB_MODE", "disabled")
    logging.getLogger("eyecite").setLevel(logging.ERROR)  # it warns of every overlap it resolves
    with tempfile.TemporaryDirectory(prefix="legalpt-finetune-") as scratch:
        work = args.work or Path(scratch)
        result = measure(args, work, argv)
    path = record.write(args.out, result)
    print(f"wrote {path}")
    for method, m in result["methods"].items():
        print(f"{method:5} held-out response loss {m['before']['loss']:.4f} → {m['after']['loss']:.4f} "
              f"({m['after']['tokens']:,} tokens of {m['after']['examples']} examples), {m['trained']:,} of "
              f"{m['parameters']:,} parameters trained, {m['seconds']:.0f} s")  # fmt: skip
    print(f"held-out response loss lowered by every method: {result['heldout_loss_lowered']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
