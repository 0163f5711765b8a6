"""The pretraining loop: `train(cfg)` runs one job end to end on whatever accelerate gives it (CPU, one GPU, DDP).

Data → packed rows (legalpt.data) → HF model (legalpt.model) → AdamW + warmup/cosine → held-out loss every
`eval_every` steps → resumable checkpoints → final HF export. The `@hydra.main` wrapper in cli.py only calls this.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.data_loader import prepare_data_loader, skip_first_batches
from accelerate.utils import set_seed
from omegaconf import DictConfig, OmegaConf
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from legalpt.config import Config, TrainConfig, to_config
from legalpt.data.manifest import write_manifest
from legalpt.data.pack import collate_packed
from legalpt.data.pipeline import PreparedData, format_stats, prepare
from legalpt.data.stream import StreamedData, format_stream_stats, prepare_stream, stream_batches
from legalpt.eval.perplexity import heldout_loss
from legalpt.model import build_model, count_parameters
from legalpt.runtime import agree_on_run_dir, export_dir, log_on_main_process_only
from legalpt.train.activations import apply_activation_checkpointing, chunk_mlps
from legalpt.train.checkpoint import (
    export_model,
    load_checkpoint,
    load_data_state,
    save_checkpoint,
    state_bytes,
)
from legalpt.train.compile import compile_decoder_layers, report_first_step
from legalpt.train.context import ContextParallel, data_shard
from legalpt.train.distributed import build_accelerator, in_lockstep, prepare_model_and_optimizer
from legalpt.train.interrupt import StopSignals
from legalpt.train.live_eval import LiveEval
from legalpt.train.lora import FrozenBase, add_adapters, export_adapters
from legalpt.train.loss import target_count, use_loss
from legalpt.train.metrics import ModelFlops, Throughput, device_peak
from legalpt.train.optim import build_optimizer, build_scheduler
from legalpt.train.profiling import StepProfiler
from legalpt.train.run_config import note_start
from legalpt.train.tracking import MetricsLog, logged, start_tracking, tracker_name

log = logging.getLogger(__name__)


@dataclass
class TrainResult:
    """Where a finished run put things, and its held-out losses as (step, loss)."""

    run_dir: Path
    export_dir: Path | None  # the HF export (None with train.export_hf=false)
    checkpoint: Path | None  # the newest resumable checkpoint (None if none was written or resumed from)
    wandb_dir: str | None
    eval_losses: list[tuple[int, float]] = field(default_factory=list)
    # the signal that stopped the run after its step (and that step's checkpoint, unless train.save_every=0); None: it
    # finished
    stopped_by: int | None = None


def make_loader(
    dataset,
    batch_size: int,
    accelerator: Accelerator,
    seed: int | None,
    even_batches: bool = True,
    context: ContextParallel | None = None,
) -> DataLoader:
    """Packed rows → flattened packed batches on this process's device; `seed` shuffles, None keeps order.

    `even_batches` pads the last round by repeating early rows so every rank steps together (training); evaluation
    turns it off so no row is counted twice. With `context` the rows are shared by the groups of context
    parallelism, each process taking its share of its group's batches."""
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    collate = collate_packed if context is None else context.collate
    # on CUDA, batches are collated into pinned memory and copied without blocking the host: a pageable copy would
    # make the host wait at every step's start, while the device idles until the step's first kernels are queued
    cuda = accelerator.device.type == "cuda"
    loader = DataLoader(
        dataset, batch_size=batch_size, shuffle=seed is not None, generator=generator, collate_fn=collate,
        pin_memory=cuda,
    )  # fmt: skip
    shard, shards = data_shard(accelerator, context)
    return prepare_data_loader(
        loader,
        device=accelerator.device,
        num_processes=shards,
        process_index=shard,
        put_on_device=True,
        even_batches=even_batches,
        non_blocking=cuda,
    )


def micro_batches(
    dataset, cfg: TrainConfig, accelerator: Accelerator, skip: int, context: ContextParallel | None = None
) -> Iterator[dict]:
    """Endless micro-batches, reshuffled each epoch with seed + epoch; the first `skip` are passed over on resume,
    so a resumed run sees exactly the batches an uninterrupted run would have seen next."""
    epoch = 0
    while True:
        loader = make_loader(dataset, cfg.batch_size, accelerator, seed=cfg.seed + epoch, context=context)
        if skip >= len(loader):
            skip -= len(loader)
        else:
            yield from skip_first_batches(loader, skip) if skip else loader
            skip = 0
        epoch += 1


def train_step(model, optimizer, batches: Iterator[dict], cfg: TrainConfig, accelerator: Accelerator):
    """One optimizer step over `grad_accum` micro-batches; returns (loss, grad norm, tokens) without host syncs.

    The loss is the mean over every predicted token of the step, on all ranks: each micro-batch's summed loss is
    divided by the step's global target count (HF's `num_items_in_batch`), so micro-batches weigh by their tokens
    and one with no targets (a row of padding) adds nothing instead of a NaN mean. DDP averages gradients over
    ranks, hence the factor num_processes."""
    micro_batches = [next(batches) for _ in range(cfg.grad_accum)]
    targets = sum(target_count(batch) for batch in micro_batches)
    targets = accelerator.reduce(targets, "sum").clamp(min=1)
    loss_sum = torch.zeros((), device=accelerator.device)
    tokens = 0
    for micro, batch in enumerate(micro_batches):
        tokens += batch["input_ids"].numel()
        # Gradients are all-reduced once, on the last micro-batch.
        with nullcontext() if micro == cfg.grad_accum - 1 else accelerator.no_sync(model):
            loss = model(**batch, num_items_in_batch=targets).loss * accelerator.num_processes
            accelerator.backward(loss)
        loss_sum += loss.detach()
    max_norm = cfg.grad_clip if cfg.grad_clip > 0 else float("inf")
    grad_norm = accelerator.clip_grad_norm_(model.parameters(), max_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss_sum, grad_norm, tokens * accelerator.num_processes


@contextmanager
def file_log(path: Path, enabled: bool) -> Iterator[None]:
    """Write this run's log to `path` too, unless a handler already does (the Hydra CLI writes train.log itself)."""
    root = logging.getLogger()
    if not enabled or any(getattr(h, "baseFilename", None) == str(path) for h in root.handlers):
        yield
        return
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"))
    package = logging.getLogger("legalpt")
    previous_level = package.level
    package.setLevel(min(previous_level or logging.INFO, logging.INFO))
    package.addHandler(handler)
    try:
        yield
    finally:
        package.removeHandler(handler)
        package.setLevel(previous_level)
        handler.close()


CUBLAS_WORKSPACE = "CUBLAS_WORKSPACE_CONFIG"  # cuBLAS's deterministic mode needs a fixed workspace


@contextmanager
def deterministic_algorithms(on: bool) -> Iterator[None]:
    """For the run when `on` (train.deterministic), restored after it: torch's deterministic algorithms, Inductor's
    deterministic mode (no kernel chosen by timing it, as max-autotune would), and cuBLAS's workspace setting unless
    one is set (it counts if set before the process's first cuBLAS call, as at the start of a run)."""
    if not on:
        yield
        return
    from torch._inductor import config as inductor_config  # here: importing Inductor takes a second

    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    workspace = os.environ.get(CUBLAS_WORKSPACE)
    # Inductor's switch, where this torch has one (recent releases; the older time kernels in max-autotune only)
    inductor = inductor_config.patch(deterministic=True) if hasattr(inductor_config, "deterministic") else nullcontext()
    try:
        os.environ[CUBLAS_WORKSPACE] = workspace or ":4096:8"
        torch.use_deterministic_algorithms(True)
        with inductor:
            yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        if workspace is None:
            os.environ.pop(CUBLAS_WORKSPACE, None)


def train(cfg: DictConfig | Config) -> TrainResult:
    """Run the pretraining job described by `cfg` and return where its outputs are."""
    cfg = to_config(cfg)  # checks every value, the loop's ranges included, before anything is built
    # DDP or FSDP2 by train.distributed; stops here, before the run folder, if the launch split into separate jobs
    accelerator = build_accelerator(cfg.train, tracker_name(cfg.logger))
    log_on_main_process_only(accelerator)
    run_dir = agree_on_run_dir(accelerator, cfg.train.output_dir)
    log_file = file_log(run_dir / "train.log", accelerator.is_main_process)
    with log_file, deterministic_algorithms(cfg.train.deterministic):
        # the run's config.yaml at its start; a resume is checked and noted
        resume_from = note_start(accelerator, run_dir, cfg)
        return run(cfg, accelerator, run_dir, resume_from)


def run(cfg: Config, accelerator: Accelerator, run_dir: Path, resume_from: Path | None) -> TrainResult:
    """The body of `train`, once the accelerator and the run folder exist; `resume_from` is the checkpoint that
    train.resume names (None: a fresh start)."""
    set_seed(cfg.train.seed)
    context = ContextParallel.start(cfg.train.context_parallel, accelerator)  # None unless train.context_parallel > 1
    data = prepare_data(cfg, accelerator, run_dir, context)
    training = build_training(cfg, accelerator, run_dir, data, context)
    step, tokens = training.resume(resume_from)
    wandb_dir = start_tracking(
        accelerator, cfg.logger, cfg.project, run_dir, OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)
    )
    metrics = MetricsLog(accelerator, run_dir, start_step=step)
    result = TrainResult(run_dir, export_dir(run_dir) if cfg.train.export_hf else None, resume_from, wandb_dir)
    evals = Evaluations(training, metrics, result)
    batches = training.batches(step)
    if step == 0:
        evals.loss(step)
        if evals.live is not None:
            evals.documents(step)
    train_loop(training, evals, batches, step, tokens)
    if not result.stopped_by and cfg.train.export_hf:  # a stopped run is not finished: its resume exports
        result.export_dir = training.export()
    accelerator.end_training()
    report_locations(result, saves=cfg.train.save_every > 0)
    return result


def prepare_data(
    cfg: Config, accelerator: Accelerator, run_dir: Path, context: ContextParallel | None
) -> PreparedData | StreamedData:
    """Both splits as packed rows (data.streaming: this rank's training stream, or its context-parallel group's, and
    the held-out rows), logged; the main process writes the run's data manifest."""
    streaming = cfg.data.streaming
    with accelerator.main_process_first():
        if streaming:
            rank, world = data_shard(accelerator, context)
            data = prepare_stream(cfg.data, cfg.model.pretrained, rank, world)
        else:
            data = prepare(cfg.data, cfg.model.pretrained)
    log.info("data\n%s", format_stream_stats(data.stats) if streaming else format_stats(data.stats))
    if accelerator.is_main_process:  # what legalpt-eval keeps out of what it scores
        write_manifest(run_dir, cfg.data, None if streaming else data.train_documents)
    return data


def build_train_model(cfg: Config, data: PreparedData | StreamedData, accelerator: Accelerator) -> torch.nn.Module:
    """The HF model as it trains, before accelerate wraps it: with train's activation checkpointing, loss,
    compilation and LoRA adapters, in that order."""
    tc = cfg.train
    # On the device before the optimizer exists, so AdamW can choose its fused kernel; train mode, since
    # from_pretrained returns a model in eval mode. A checkpoint whose tokenizer data.extend_tokenizer extended gets
    # embedding rows for the added tokens (streaming does not extend).
    base_tokenizer = None if cfg.data.streaming else data.base_tokenizer
    model = build_model(cfg.model, data.tokenizer, base_tokenizer, accelerator.device).to(accelerator.device).train()
    log.info("model: %s, %.1fM parameters", cfg.model.pretrained or cfg.model.arch, count_parameters(model) / 1e6)
    # On the plain HF model, so that DDP's and FSDP's wrappers see the recomputing layers and the chunked loss.
    apply_activation_checkpointing(
        model, tc.activation_checkpointing, tc.checkpoint_every, tc.offload_activations, tc.save_attention
    )
    if tc.mlp_chunk_tokens:
        chunk_mlps(model, tc.mlp_chunk_tokens)
    if tc.loss_impl != "plain":
        use_loss(model, tc.loss_impl, tc.loss_chunk_tokens)
    if tc.compile:  # after checkpointing, which runs inside the compiled layers; before DDP's or FSDP's wrappers
        compile_decoder_layers(model, tc.compile_mode)
    if tc.lora.enabled:  # over the patched HF model, whose forward peft calls; the optimizer sees the adapters alone
        model = add_adapters(model, tc.lora)
    return model


def build_training(
    cfg: Config,
    accelerator: Accelerator,
    run_dir: Path,
    data: PreparedData | StreamedData,
    context: ContextParallel | None,
) -> Training:
    """The model to train, AdamW over its trainable parameters and the warmup/cosine schedule, prepared by accelerate
    (DDP or FSDP2), the schedule registered for checkpointing."""
    tc = cfg.train
    model = build_train_model(cfg, data, accelerator)
    optimizer = build_optimizer(model, tc)
    scheduler = build_scheduler(optimizer, tc)
    model, optimizer = prepare_model_and_optimizer(accelerator, model, optimizer, tc)
    accelerator.register_for_checkpointing(scheduler)
    # a LoRA run's checkpoints leave its frozen base out: a resume loads it from model.pretrained, checked unchanged
    frozen = FrozenBase.of(accelerator.unwrap_model(model), cfg.model.pretrained) if tc.lora.enabled else None
    return Training(cfg, accelerator, run_dir, data, model, optimizer, scheduler, frozen, context)


@dataclass
class Training:
    """What the steps work on, save and export: the prepared model and optimizer, the schedule, a LoRA run's frozen
    base (None otherwise) and the training data, with the run's config, accelerator and folder."""

    cfg: Config
    accelerator: Accelerator
    run_dir: Path
    data: PreparedData | StreamedData
    model: torch.nn.Module  # accelerate's wrapper (DDP, FSDP2) around the HF model, or peft's around it
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    frozen: FrozenBase | None
    context: ContextParallel | None  # train.context_parallel's group of this process (None: off)

    @property
    def streaming(self) -> bool:
        """Whether the data is this rank's stream (data.streaming) rather than packed rows in memory."""
        return self.cfg.data.streaming

    def resume(self, checkpoint: Path | None) -> tuple[int, int]:
        """(step, tokens) to start from: `checkpoint`'s, with the model, optimizer, schedule, RNG and (streaming) the
        stream restored from it; (0, 0) without one."""
        if checkpoint is None:
            return 0, 0
        step, tokens = load_checkpoint(self.accelerator, checkpoint, self.frozen)
        if self.streaming:  # the stream continues after the last batch of that step
            self.data.train.load_state_dict(load_data_state(checkpoint, self.accelerator.process_index))
        log.info("resumed from %s at step %d", checkpoint, step)
        return step, tokens

    def batches(self, step: int) -> Iterator[dict]:
        """The micro-batches from `step` on: the stream's next ones, or the shuffled rows past the steps done."""
        tc = self.cfg.train
        if self.streaming:
            collate = collate_packed if self.context is None else self.context.collate
            return stream_batches(self.data.train, tc.batch_size, self.accelerator.device, collate)
        return micro_batches(self.data.train, tc, self.accelerator, skip=step * tc.grad_accum, context=self.context)

    def save(self, step: int, tokens: int) -> Path:
        """A resumable checkpoint after `step`, (streaming) the stream's position with it; returns its folder."""
        data_state = self.data.train.state_dict() if self.streaming else None
        size = state_bytes(self.model, self.optimizer)  # what a first checkpoint will take
        keep = self.cfg.train.keep_checkpoints
        return save_checkpoint(self.accelerator, self.run_dir, step, tokens, keep, data_state, size, self.frozen)

    def export(self) -> Path:
        """The trained model as HF folders (a LoRA run: its adapters, as train.lora.export says); returns where."""
        tokenizer, lora = self.data.tokenizer, self.cfg.train.lora
        if lora.enabled:
            return export_adapters(self.accelerator, self.model, tokenizer, self.run_dir, lora.export)
        return export_model(self.accelerator, self.model, tokenizer, self.run_dir)


class Evaluations:
    """The held-out loss and the live evaluation of the model being trained, each logged to the run's metrics; the
    held-out losses also go to its result."""

    def __init__(self, training: Training, metrics: MetricsLog, result: TrainResult):
        self.tc, self.accelerator, self.model = training.cfg.train, training.accelerator, training.model
        self.heldout, self.metrics, self.result = training.data.heldout, metrics, result
        if self.heldout.num_rows == 0:
            log.warning("the held-out split is empty (too few documents): training runs without evaluation")
        # citation completion and bits per byte on held-out documents (train.eval_citations, train.eval_documents)
        self.live = LiveEval.start(training.cfg, training.data.tokenizer, training.accelerator, training.run_dir)

    def loss(self, step: int) -> None:
        """Held-out loss and perplexity at `step` over up to train.eval_batches batches; none without held-out rows
        or with train.eval_every=0."""
        if self.heldout.num_rows == 0 or self.tc.eval_every == 0:
            return
        tc, accelerator = self.tc, self.accelerator
        loader = make_loader(self.heldout, tc.batch_size, accelerator, seed=None, even_batches=False)
        if accelerator.is_fsdp2:  # a sharded forward needs every rank: those with fewer batches run target-free ones
            loader = in_lockstep(loader, self.heldout, accelerator, tc.eval_batches)
        # Unwrapped: under DDP ranks may see different numbers of batches, and its forward would wait on the others.
        unwrapped = accelerator.unwrap_model(self.model)
        report = heldout_loss(unwrapped, loader, tc.eval_batches, lambda t: accelerator.reduce(t, "sum"))
        self.metrics.log(step, {"eval/loss": report["loss"], "eval/perplexity": report["perplexity"]})
        self.result.eval_losses.append((step, report["loss"]))
        log.info("step %d: eval loss %.4f, perplexity %.2f", step, report["loss"], report["perplexity"])

    def documents(self, step: int) -> None:
        """The live evaluation's metrics at `step` (only when self.live is not None)."""
        self.metrics.log(step, self.live.evaluate(self.accelerator.unwrap_model(self.model), self.accelerator))


def train_loop(training: Training, evals: Evaluations, batches: Iterator[dict], step: int, tokens: int) -> None:
    """Steps from `step` (`tokens` row slots consumed so far) to train.steps, logging, evaluating and saving on the
    way; a stop signal ends it once the step it came in is done and saved, unless train.save_every=0
    (evals.result.stopped_by says which)."""
    tc, accelerator, model, scheduler = training.cfg.train, training.accelerator, training.model, training.scheduler
    bar = tqdm(total=tc.steps, initial=step, desc="train", disable=not accelerator.is_local_main_process)
    peak = device_peak(accelerator.device, tc.peak_tflops)
    meter = Throughput(ModelFlops.of(accelerator.unwrap_model(model)), peak, accelerator)
    batches = meter.counted(batches)  # real tokens and attention pairs, counted on the device
    first_step = step  # with train.compile this process's first step compiles: it gets a window of its own
    profiler = StepProfiler(training.run_dir / "profile", tc.profile_start, tc.profile_steps, accelerator.process_index)
    # SIGINT, SIGTERM: finish the step, save (unless train.save_every=0) and stop (legalpt.train.interrupt)
    with StopSignals(accelerator, saves=tc.save_every > 0) as stop:
        while step < tc.steps:
            started = time.perf_counter()
            profiler.before_step(step)
            loss, grad_norm, step_tokens = train_step(model, training.optimizer, batches, tc, accelerator)
            lr = scheduler.get_last_lr()[0]  # the rate this step applied; scheduler.step() sets the next step's
            if not accelerator.optimizer_step_was_skipped:  # fp16 overflow: the schedule waits with the weights
                scheduler.step()
            step += 1
            tokens += step_tokens
            profiler.after_step(step)
            bar.update()
            compiled = tc.compile and step == first_step + 1
            if compiled or step % tc.log_every == 0 or step == tc.steps:
                values = step_values(meter, accelerator, loss, lr, grad_norm, tokens)
                if compiled:  # the window of this step alone, so that the next ones measure the compiled steady state
                    values["train/compile_s"] = time.perf_counter() - started  # after meter.read()'s host sync
                    report_first_step(step, values["train/compile_s"])
                evals.metrics.log(step, values)
                bar.set_postfix(loss=f"{values['train/loss']:.3f}", tok_s=f"{values['train/tokens_per_s']:.0f}")
            evals.result.stopped_by = stop.requested()  # every rank asks after every step: all stop after the same one
            evaluate_and_save(training, evals, meter, step, tokens)
            if evals.result.stopped_by:
                break
    profiler.close()
    bar.close()


def step_values(
    meter: Throughput, accelerator: Accelerator, loss: torch.Tensor, lr: float, grad_norm: torch.Tensor, tokens: int
) -> dict[str, float]:
    """What a logged step reports: the throughput window since the last report, and the step's loss (mean over the
    ranks), learning rate and gradient norm."""
    return {
        **meter.read(),  # first: its host sync closes the timed window after the device's queued work
        "train/loss": accelerator.reduce(loss, "mean").item(),
        "train/lr": lr,
        "train/grad_norm": float(grad_norm),
        "train/tokens": tokens,  # row slots consumed, padding included: the data position
    }


def evaluate_and_save(training: Training, evals: Evaluations, meter: Throughput, step: int, tokens: int) -> None:
    """After `step`: the evaluations due, unless a stop signal came; a checkpoint when one is due or one did."""
    tc, result = training.cfg.train, evals.result
    # tokens/s and MFU measure training, not evaluation and saving
    if not result.stopped_by and tc.eval_every and (step % tc.eval_every == 0 or step == tc.steps):
        with meter.paused():
            evals.loss(step)
    if not result.stopped_by and evals.live is not None and evals.live.due(step):
        with meter.paused():
            evals.documents(step)
    if tc.save_every and (result.stopped_by or step % tc.save_every == 0 or step == tc.steps):
        with meter.paused():
            result.checkpoint = training.save(step, tokens)


def report_locations(result: TrainResult, saves: bool) -> None:
    """Tell the user where everything went; `saves`: whether the run writes checkpoints (train.save_every > 0), else
    result.checkpoint is the one it resumed from, if any."""
    resumes = f"the same command resumes from {result.checkpoint}" if result.checkpoint else "the run cannot resume"
    if result.stopped_by:
        name = signal.Signals(result.stopped_by).name
        if saves:
            log.warning("stopped by %s: checkpoint %s; the same command resumes from it", name, result.checkpoint)
        else:
            log.warning("stopped by %s without a checkpoint (train.save_every=0): %s", name, resumes)
        return
    checkpoint = result.checkpoint if saves else f"none saved (train.save_every=0): {resumes}"
    lines = [
        f"checkpoint: {checkpoint}",
        f"HF export:  {result.export_dir or 'none (train.export_hf=false)'}",
        f"wandb run:  {result.wandb_dir or 'off'}",
        f"log:        {result.run_dir / 'train.log'}",
        f"metrics:    {result.run_dir / 'metrics.jsonl'}",
    ]
    if history := logged(result.run_dir, "eval/loss"):  # the run's, from before this process resumed it too
        first, last = history[0][1], history[-1][1]
        lines.append(f"eval loss:  {first:.4f} → {last:.4f} ({last / first:.2f}× the first)")
    log.info("done\n  %s", "\n  ".join(lines))
