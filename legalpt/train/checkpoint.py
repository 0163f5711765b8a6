"""Resumable checkpoints inside a run folder, and the final Hugging Face export.

Layout of a run folder:
    checkpoints/step_000100/   accelerate `save_state` (model, optimizer, scheduler, RNG) + trainer_state.json
                               (+ data_state_rank<r>.json: each rank's position in a data stream, when streaming);
                               under FSDP2 the model and optimizer are sharded torch.distributed.checkpoint folders
                               (pytorch_model_fsdp_0/, optimizer_0/), each rank writing and reading its own shards
    hf/                        `save_pretrained` model + tokenizer: a standard HF folder anyone can load
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from accelerate import Accelerator

from legalpt.runtime import export_dir

STATE_FILE = "trainer_state.json"  # step and token count next to accelerate's files


def checkpoint_root(run_dir: Path) -> Path:
    return run_dir / "checkpoints"


def latest_checkpoint(run_dir: Path) -> Path | None:
    """Newest complete checkpoint (one whose trainer state was written last) in a run folder, if any."""
    done = sorted(checkpoint_root(run_dir).glob(f"step_*/{STATE_FILE}"))
    return done[-1].parent if done else None


def resolve_resume(resume: str, run_dir: Path) -> Path | None:
    """The checkpoint `train.resume` asks for: auto → newest in the run folder (or none), none, or a path."""
    if resume == "none":
        return None
    if resume == "auto":
        return latest_checkpoint(run_dir)
    path = Path(resume).expanduser()
    if not (path / STATE_FILE).is_file():
        raise FileNotFoundError(f"train.resume={resume!r}: no checkpoint there (expected {path / STATE_FILE})")
    return path


def save_checkpoint(
    accelerator: Accelerator, run_dir: Path, step: int, tokens: int, keep: int, data_state: dict | None = None
) -> Path:
    """Save a resumable state for `step` (with this rank's `data_state`, a stream's `state_dict()`, if given), then
    drop all but the newest `keep` (>= 1) checkpoints."""
    path = checkpoint_root(run_dir) / f"step_{step:06d}"
    accelerator.save_state(str(path))
    if data_state is not None:
        data_state_file(path, accelerator.process_index).write_text(json.dumps(data_state))
    accelerator.wait_for_everyone()  # every rank's files are on disk before the checkpoint is marked complete
    if accelerator.is_main_process:
        # Written last: a checkpoint without this file was interrupted and is never resumed from.
        (path / STATE_FILE).write_text(json.dumps({"step": step, "tokens": tokens}))
        for old in sorted(checkpoint_root(run_dir).glob("step_*"))[:-keep]:
            shutil.rmtree(old)
    accelerator.wait_for_everyone()
    return path


def load_checkpoint(accelerator: Accelerator, path: Path) -> tuple[int, int]:
    """Restore model, optimizer, scheduler and RNG; return (step, tokens) to continue from."""
    accelerator.load_state(str(path))
    state = json.loads((path / STATE_FILE).read_text())
    return state["step"], state["tokens"]


def data_state_file(path: Path, rank: int) -> Path:
    return path / f"data_state_rank{rank}.json"


def load_data_state(path: Path, rank: int) -> dict:
    """The data-stream position rank `rank` saved in the checkpoint at `path`."""
    file = data_state_file(path, rank)
    if not file.is_file():
        raise FileNotFoundError(f"train.resume: {path} holds no data stream position for rank {rank} (expected {file})")
    return json.loads(file.read_text())


def export_model(accelerator: Accelerator, model, tokenizer, run_dir: Path) -> Path:
    """Write the final model and tokenizer as a plain HF folder (loadable without legalpt).

    Every rank takes part in gathering the state dict (under FSDP2 each holds a shard; rank 0 receives the full,
    unsharded tensors in CPU memory), and rank 0 alone writes it."""
    path = export_dir(run_dir)
    state_dict = accelerator.get_state_dict(model)
    if accelerator.is_main_process:
        unwrapped = accelerator.unwrap_model(model)
        # A gathered state dict holds one copy per name: tie the copies of tied weights again, so that save_pretrained
        # drops the tied names as it does for the model's own, shared tensors.
        for tied, source in unwrapped.all_tied_weights_keys.items():
            if tied in state_dict and source in state_dict:
                state_dict[tied] = state_dict[source]
        unwrapped.save_pretrained(str(path), state_dict=state_dict, save_function=accelerator.save)
        tokenizer.save_pretrained(str(path))
    accelerator.wait_for_everyone()
    return path
