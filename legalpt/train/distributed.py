"""How one run spreads over processes: the accelerator for `train.distributed` (ddp | fsdp2) and `train.precision`,
the check that every launched process joined the job, and what sharding asks of the loop around it.

- `ddp`: accelerate's default, a full replica per process and gradients all-reduced.
- `fsdp2`: accelerate's FSDP2 plugin (`fully_shard`), one unit per decoder layer (the classes the HF model names in
  `_no_split_modules`), one for the input embedding and one for the final norm and LM head; parameters, gradients and
  AdamW state live sharded across processes. Checkpoints are sharded too (SHARDED_STATE_DICT through
  torch.distributed.checkpoint, so no rank ever holds the whole model to save); the HF export gathers a full state
  dict (`legalpt.train.checkpoint.export_model`).

Precision: `autocast` keeps float32 parameters and autocasts compute to `train.mixed_precision` (with FSDP2: float32
gathers and reductions, the model's forward under torch.autocast as accelerate does for DDP); `bf16-fsdp` gives FSDP2
a MixedPrecisionPolicy: bfloat16 copies of the float32 master weights compute, AdamW steps the float32 shards, and
gradients are reduce-scattered in float32.

legalpt builds the plugin from `train.*` (the one record of a run, validated before any work) rather than from an
accelerate config file: a launcher configured for FSDP (ACCELERATE_USE_FSDP) is refused under `train.distributed=ddp`
instead of silently switching to accelerate's FSDP1 defaults.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sized
from itertools import islice

import torch
from accelerate import Accelerator, PartialState
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin, parse_flag_from_env
from torch.distributed.fsdp import MixedPrecisionPolicy

from legalpt.config import ConfigError, TrainConfig
from legalpt.data.pack import IGNORE_INDEX, collate_packed
from legalpt.runtime import mixed_precision

log = logging.getLogger(__name__)

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}  # accelerate's mixed_precision → autocast dtype


def build_accelerator(tc: TrainConfig, log_with: str | None) -> Accelerator:
    """The accelerator of a run: DDP or FSDP2 by `tc.distributed`, precision by `tc.precision`; checked to hold
    every launched process (`check_world_size`) before anything is written."""
    if tc.distributed == "ddp" and os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true":
        raise ConfigError(
            "train.distributed: expected fsdp2 when the launcher asks for FSDP (ACCELERATE_USE_FSDP=true, from "
            "`accelerate launch --use_fsdp` or a config with distributed_type: FSDP), got 'ddp'; legalpt shards from "
            "train.distributed=fsdp2, so launch with a plain multi-process config (scripts/launch/)"
        )
    plugin = fsdp_plugin(tc)
    accelerator = Accelerator(mixed_precision=accelerate_precision(tc), log_with=log_with, fsdp_plugin=plugin)
    if plugin is not None and accelerator.distributed_type == DistributedType.MULTI_CPU:
        _shard_on_cpu(accelerator, plugin)
    check_world_size(accelerator)
    if plugin is not None and not accelerator.is_fsdp2:
        if tc.precision == "bf16-fsdp":  # accelerate would autocast float32 parameters instead: not what was asked
            raise ConfigError(
                "train.precision: bf16-fsdp needs FSDP2 over a process group, and accelerate joined this process "
                "into none; on one GPU, launch a one-rank job: torchrun --standalone --nproc-per-node 1 --no-python "
                "legalpt-train ... (without GPUs, with ACCELERATE_USE_CPU=true), or use train.precision=autocast"
            )
        log.warning("train.distributed=fsdp2 with one process: nothing to shard, the model trains unsharded")
    return accelerator


def check_world_size(accelerator: Accelerator | PartialState) -> None:
    """Stop when the launcher started a different number of processes (WORLD_SIZE) than accelerate joined into this
    job: `--multi_gpu` or torchrun on a host without GPUs starts independent single-process jobs, each of which would
    train alone and write the same run folder."""
    launched = os.environ.get("WORLD_SIZE")
    if launched is not None and int(launched) != accelerator.num_processes:
        raise RuntimeError(
            f"WORLD_SIZE={launched} processes were launched, but accelerate joined {accelerator.num_processes} into "
            "this job (each process would train alone and write the same run folder). Without GPUs, launch with "
            "torchrun and ACCELERATE_USE_CPU=true; with GPUs, check that every process sees one (CUDA_VISIBLE_DEVICES)."
        )


def check_launch() -> None:
    """`check_world_size` before the run folder exists (legalpt-train runs it before Hydra makes it): joins this
    process to the others as the Accelerator made later will, through the PartialState they share."""
    if "WORLD_SIZE" in os.environ:
        check_world_size(PartialState(cpu=parse_flag_from_env("ACCELERATE_USE_CPU")))


def accelerate_precision(tc: TrainConfig) -> str:
    """accelerate's `mixed_precision` for `tc`. Under bf16-fsdp it is bf16: accelerate then upcasts any lower-precision
    parameters to float32 master weights before sharding, and its FSDP2 path adds no autocast of its own."""
    return "bf16" if tc.precision == "bf16-fsdp" else mixed_precision(tc.mixed_precision)


def precision_policy(precision: str) -> MixedPrecisionPolicy:
    """FSDP2's casting for `train.precision`: bf16-fsdp gathers bfloat16 parameters for compute and reduce-scatters
    float32 gradients; autocast leaves every FSDP2 tensor float32 (torch.autocast does the casting)."""
    if precision == "bf16-fsdp":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def fsdp_plugin(tc: TrainConfig) -> FullyShardedDataParallelPlugin | None:
    """accelerate's FSDP2 plugin for `tc` (None for ddp). Every field is set here, so FSDP_* variables a launcher
    exports cannot change a run behind its config; the layer classes come from the model
    (`prepare_model_and_optimizer`)."""
    if tc.distributed != "fsdp2":
        return None
    return FullyShardedDataParallelPlugin(
        fsdp_version=2,
        reshard_after_forward=tc.reshard_after_forward,
        auto_wrap_policy="transformer_based_wrap",
        transformer_cls_names_to_wrap=[],  # set from the model before prepare
        state_dict_type="SHARDED_STATE_DICT",
        mixed_precision_policy=precision_policy(tc.precision),
        cpu_offload=False,
        activation_checkpointing=False,  # legalpt.train.activations recomputes, the same under DDP and FSDP2
        activation_checkpointing_offload=False,
        cpu_ram_efficient_loading=False,
        ignored_modules=[],
    )


def _shard_on_cpu(accelerator: Accelerator, plugin: FullyShardedDataParallelPlugin) -> None:
    """Make a multi-process CPU job shard as a multi-GPU one would. accelerate turns a plugin into FSDP only for
    accelerator devices (AcceleratorState), but torch's fully_shard runs on CPU over gloo, so this takes the same
    switch on the shared states (PartialState's too, which AcceleratorState copies whenever it is constructed): the
    CPU recipe and the tests then run the very path GPUs run."""
    PartialState().distributed_type = DistributedType.FSDP
    accelerator.state.distributed_type = DistributedType.FSDP
    accelerator.state.fsdp_plugin = plugin


def decoder_layer_classes(model: torch.nn.Module) -> list[str]:
    """The HF model's decoder layer classes (its `_no_split_modules` that it instantiates): FSDP2's wrapping units."""
    present = {type(module).__name__ for module in model.modules()}
    names = sorted(name for name in getattr(model, "_no_split_modules", None) or () if name in present)
    if not names:
        raise ValueError(
            f"train.distributed=fsdp2: {type(model).__name__} names no decoder layer class (_no_split_modules) to shard"
        )
    return names


def prepare_model_and_optimizer(
    accelerator: Accelerator, model: torch.nn.Module, optimizer: torch.optim.Optimizer, tc: TrainConfig
):
    """accelerate.prepare for `model` and `optimizer` (built on the plain model; FSDP2 swaps in the sharded
    parameters); returns both. Under FSDP2 each decoder layer is its own unit, and autocast precision wraps the
    forward as accelerate's DDP path does (its FSDP2 path leaves compute precision to the policy)."""
    if accelerator.is_fsdp2:
        accelerator.state.fsdp_plugin.transformer_cls_names_to_wrap = decoder_layer_classes(model)
    model, optimizer = accelerator.prepare(model, optimizer)
    dtype = AUTOCAST_DTYPES.get(accelerator.mixed_precision)
    if accelerator.is_fsdp2 and tc.precision == "autocast" and dtype is not None:
        model.forward = torch.autocast(accelerator.device.type, dtype=dtype)(model.forward)
    return model, optimizer


def in_lockstep(loader: Sized, dataset, accelerator: Accelerator, max_batches: int) -> Iterator[dict]:
    """Held-out batches of this rank (at most `max_batches`, 0 = all), then target-free ones until it has run as many
    forwards as the busiest rank. Under FSDP2 every forward gathers parameters from all ranks, so a rank that stopped
    early would leave the others waiting; a batch whose labels are all IGNORE_INDEX adds nothing to the loss sums."""
    own = min(len(loader), max_batches) if max_batches else len(loader)
    most = int(accelerator.gather(torch.tensor([own], device=accelerator.device)).max())
    yield from islice(loader, own)
    if own < most:
        idle = collate_packed([dataset[0]])
        idle["labels"] = torch.full_like(idle["labels"], IGNORE_INDEX)
        idle = {k: v.to(accelerator.device) if isinstance(v, torch.Tensor) else v for k, v in idle.items()}
        for _ in range(most - own):
            yield idle
