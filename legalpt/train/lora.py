"""Low-rank adapters (`train.lora`): peft's LoRA over the loaded checkpoint, and the exports of what was trained.

`add_adapters` wraps the HF model in peft's `PeftModelForCausalLM`: the checkpoint's weights are frozen and each
target linear layer gets a trainable rank-r update B·A scaled by alpha / r (B starts at zero, so training starts from
the checkpoint exactly). The optimizer is built afterwards from the parameters that require grad: the adapters alone.

It is applied to the HF model after activation checkpointing, the chunked loss and torch.compile have patched its
forwards (legalpt.train.activations, .loss, .compile): peft calls the HF model's own forward, and its `lora.Linear`
layers sit inside the decoder layers, which patched and compiled forwards look up at call time. Checkpointing is
non-reentrant, so no input has to require grad (peft's `enable_input_require_grads` serves reentrant checkpoints).
DDP all-reduces the parameters that require grad; FSDP2 shards every parameter on its own, so a decoder layer's unit
holds frozen and trainable ones side by side (FSDP1 needed `use_orig_params` for that).

Training checkpoints leave the frozen base out (`FrozenBase`): accelerate's `save_state` and `load_state` see a model
state dict of the adapters alone (optimizer, scheduler and RNG states as ever), and a resume loads the base from
`model.pretrained` again, after checking that it is the checkpoint the run started from (`base_identity`).

`export_adapters` writes, by `train.lora.export`, the adapters merged into a plain HF folder (`hf/`, as any run's
export: transformers alone loads it, legalpt-eval reads it) and/or peft's adapter folder (`adapter/`: adapter
weights and `adapter_config.json` naming `model.pretrained` as the base, for `PeftModel.from_pretrained`).
"""

from __future__ import annotations

import copy
import hashlib
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import peft
import torch
from accelerate import Accelerator, init_empty_weights
from transformers import AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import CONFIG_NAME, cached_file

from legalpt.config import LORA_EXPORTS, LoraConfig
from legalpt.runtime import export_dir

log = logging.getLogger(__name__)

ADAPTER_DIR = "adapter"  # the run folder's peft adapter folder (train.lora.export=adapter or both)
WEIGHT_FILES = (".safetensors", ".bin", ".index.json")  # how a checkpoint's weight files and shard indexes end


def adapter_dir(run_dir: Path) -> Path:
    """Where a run folder keeps its peft adapter folder."""
    return run_dir / ADAPTER_DIR


def peft_config(cfg: LoraConfig) -> peft.LoraConfig:
    """peft's LoRA settings for `cfg`."""
    return peft.LoraConfig(
        task_type=peft.TaskType.CAUSAL_LM,
        r=cfg.r,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=list(cfg.target_modules),
    )


def add_adapters(model: PreTrainedModel, cfg: LoraConfig) -> peft.PeftModel:
    """`model` with LoRA adapters on `cfg.target_modules` and every other weight frozen; logs the trainable share."""
    _check_targets(model, cfg.target_modules)
    wrapped = peft.get_peft_model(model, peft_config(cfg))
    trainable, total = wrapped.get_nb_trainable_parameters()
    log.info("LoRA: training %s of %s parameters (%.2f%%): rank %d adapters on %s", f"{trainable:,}", f"{total:,}",
             100 * trainable / total, cfg.r, ", ".join(cfg.target_modules))  # fmt: skip
    return wrapped


def _check_targets(model: torch.nn.Module, targets: list[str]) -> None:
    """Each target names at least one linear layer, as peft matches names: the whole path or its last parts."""
    linear = [name for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)]
    for target in targets:
        if not any(name == target or name.endswith(f".{target}") for name in linear):
            names = sorted({name.rsplit(".", 1)[-1] for name in linear})
            raise ValueError(f"train.lora.target_modules: expected linear layers of {type(model).__name__} "
                             f"({', '.join(names)}), got {target!r}, which names none")  # fmt: skip


def export_adapters(
    accelerator: Accelerator, model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, run_dir: Path, export: str
) -> Path:
    """Write the trained adapters as `export` says (merged | adapter | both), each folder with the tokenizer; return
    the merged folder, or the adapter folder when that is all that was written.

    Every rank takes part in gathering the state dict (under FSDP2 rank 0 receives full tensors in CPU memory); rank
    0 loads it into a CPU copy of the wrapped model, which is saved and merged, so that the exports are the same
    under DDP and FSDP2 and the training model is left as it was."""
    if export not in LORA_EXPORTS:
        raise ValueError(f"train.lora.export: expected one of {', '.join(LORA_EXPORTS)}, got {export!r}")
    state_dict = accelerator.get_state_dict(model)
    folders = {"adapter": adapter_dir(run_dir), "merged": export_dir(run_dir)}
    if export != "both":
        folders = {export: folders[export]}
    if accelerator.is_main_process:
        trained = _copy_on_cpu(accelerator.unwrap_model(model), state_dict)
        if "adapter" in folders:
            trained.save_pretrained(str(folders["adapter"]))
            tokenizer.save_pretrained(str(folders["adapter"]))
        if "merged" in folders:
            # safe_merge: a merged weight that is no longer finite stops the export instead of being saved
            trained.merge_and_unload(safe_merge=True).save_pretrained(str(folders["merged"]))
            tokenizer.save_pretrained(str(folders["merged"]))
        log.info("LoRA export: %s", ", ".join(f"{kind} {path}" for kind, path in folders.items()))
    accelerator.wait_for_everyone()
    return folders.get("merged", folders.get("adapter"))


def _copy_on_cpu(model: peft.PeftModel, state_dict: dict[str, torch.Tensor]) -> peft.PeftModel:
    """A PeftModel shaped like `model` that holds a CPU copy of `state_dict` (the wrapped model's, gathered)."""
    with init_empty_weights():  # meta parameters: the state dict's tensors are assigned, nothing is initialized
        base = AutoModelForCausalLM.from_config(model.config)
    name = model.active_adapter
    config = model.peft_config[name]
    clone = peft.get_peft_model(base, copy.deepcopy(config), adapter_name=name)
    clone.peft_config[name].base_model_name_or_path = config.base_model_name_or_path  # the checkpoint, not `base`
    for key in list(state_dict):  # copies: merging adds to the base weights, and DDP's state dict holds the live ones
        state_dict[key] = state_dict[key].detach().to("cpu", copy=True)
    clone.load_state_dict(state_dict, assign=True)
    clone.get_base_model().tie_weights()  # a gathered state dict holds a copy per tied name
    return clone


def base_identity(pretrained: str) -> dict:
    """What identifies the checkpoint `pretrained` (a folder, or a hub name resolved to its cached snapshot): its
    folder, a hash of its config.json, and the size and modification time of each weight file. Hashing the weights
    themselves would read gigabytes at every save and resume; rewriting a file changes its time."""
    config = Path(cached_file(pretrained, CONFIG_NAME))
    weights = sorted(path for path in config.parent.iterdir() if path.name.endswith(WEIGHT_FILES))
    return {
        "folder": str(config.parent.resolve()),
        "config_sha256": hashlib.sha256(config.read_bytes()).hexdigest(),
        "weights": {path.name: [path.stat().st_size, path.stat().st_mtime_ns] for path in weights},
    }


@dataclass
class FrozenBase:
    """The frozen base of a LoRA run, which its training checkpoints leave out: they hold the adapters and the base's
    identity, and a resume takes the base from `model.pretrained` again."""

    model: peft.PeftModel  # unwrapped: accelerate saves DDP's inner model, and FSDP2's is the PeftModel itself
    pretrained: str
    identity: dict  # `base_identity(pretrained)` when the run loaded it

    @classmethod
    def of(cls, model: peft.PeftModel, pretrained: str) -> FrozenBase:
        return cls(model, pretrained, base_identity(pretrained))

    def changes(self, recorded: dict) -> list[str]:
        """How the base differs from the one `recorded` (an `identity` of the run's start), in words; [] if not."""
        keys = sorted(recorded.keys() | self.identity.keys())
        return [f"{key} {recorded.get(key)} → {self.identity.get(key)}" for key in keys
                if recorded.get(key) != self.identity.get(key)]  # fmt: skip

    @contextmanager
    def left_out(self) -> Iterator[None]:
        """While open, the model's state dict holds its trainable parameters alone, and loading one lacking the frozen
        entries is not an error: accelerate's save_state and load_state then write and read the adapters alone, as
        a plain or DDP state dict in model.safetensors or, under FSDP2, sharded through torch.distributed.checkpoint
        (whose state dicts start from the model's own)."""
        # Tied copies of a weight, which named_parameters lists once, are frozen base weights.
        trainable = {name for name, p in self.model.named_parameters() if p.requires_grad}
        prefixes = []  # the model's place in the state dict being loaded: '' or, inside a wrapper, its name + '.'

        def is_frozen(key: str, prefix: str) -> bool:
            return key.startswith(prefix) and key[len(prefix) :] not in trainable

        def keep_trainable(module, state_dict, prefix, local_metadata) -> None:
            for key in [key for key in state_dict if is_frozen(key, prefix)]:
                del state_dict[key]

        def note_prefix(module, state_dict, prefix, *args) -> None:
            prefixes.append(prefix)

        def forgive_frozen(module, incompatible) -> None:
            prefix = prefixes.pop()
            # in place: load_state_dict and safetensors' load_model (strict) read these very lists afterwards
            incompatible.missing_keys[:] = [key for key in incompatible.missing_keys if not is_frozen(key, prefix)]

        hooks = [
            self.model.register_state_dict_post_hook(keep_trainable),
            self.model.register_load_state_dict_pre_hook(note_prefix),
            self.model.register_load_state_dict_post_hook(forgive_frozen),
        ]
        try:
            yield
        finally:
            for hook in hooks:
                hook.remove()
