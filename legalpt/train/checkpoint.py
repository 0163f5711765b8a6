"""Resumable checkpoints inside a run folder, their durability and completeness, and the final Hugging Face export.

Layout of a run folder:
    checkpoints/step_000100/   accelerate `save_state` (model, optimizer, scheduler, RNG) + trainer_state.json
                               (+ data_state_rank<r>.json: each rank's position in a data stream, when streaming)
                               + COMPLETE, written last; under FSDP2 the model and optimizer are sharded
                               torch.distributed.checkpoint folders (pytorch_model_fsdp_0/, optimizer_0/), each rank
                               writing and reading its own shards; a LoRA run's model state is its adapters alone,
                               with lora_base.json, the identity of the frozen base (legalpt.train.lora.FrozenBase)
    hf/                        `save_pretrained` model + tokenizer: a standard HF folder anyone can load

A save writes `step_000100.partial/`, flushes every file to the disk, writes the COMPLETE marker and only then renames
the folder, so a crash, a full disk or a kill mid-save never damages the checkpoints that were already there. Before
writing, the free space is checked against the previous checkpoint's size (the trainable parameter and optimizer state
bytes for the first); a full disk or an unwritable folder stops the run with one line (`CheckpointError`) naming the
folder, the space needed and free. Resuming skips, with a warning, folders that are not complete checkpoints: leftover
`.partial` folders, folders without the marker, and unreadable trainer states.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import broadcast_object_list, gather_object

from legalpt.runtime import export_dir
from legalpt.train.lora import FrozenBase

log = logging.getLogger(__name__)

STATE_FILE = "trainer_state.json"  # step and token count next to accelerate's files
BASE_FILE = "lora_base.json"  # a LoRA checkpoint's record of the frozen base its adapters were trained over
MARKER = "COMPLETE"  # written last, once every file of the checkpoint is on the disk
PARTIAL = ".partial"  # suffix of a checkpoint folder while it is being written
STEP_FOLDER = re.compile(r"step_(\d+)((?:\.partial)?)")
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
NOT_WRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM)
NEARLY_FULL = 1 << 20  # free bytes below which a disk counts as full whatever was still to be written


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be saved or resumed from; the message is one line naming the folder and the cause."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """`train.resume` names a folder that holds no complete checkpoint."""


def checkpoint_root(run_dir: Path) -> Path:
    return run_dir / "checkpoints"


def step_folders(run_dir: Path) -> list[Path]:
    """The run folder's checkpoint folders, complete or not, newest step first (a finished one before its .partial)."""
    root = checkpoint_root(run_dir)
    found = [path for path in root.iterdir() if STEP_FOLDER.fullmatch(path.name)] if root.is_dir() else []
    return sorted(found, key=_step_order, reverse=True)


def _step_order(path: Path) -> tuple[int, bool]:
    step, partial = STEP_FOLDER.fullmatch(path.name).groups()
    return int(step), not partial


def read_state(path: Path) -> tuple[int, int]:
    """(step, tokens) from a checkpoint's trainer state; CheckpointError if it is missing or damaged."""
    file = path / STATE_FILE
    try:
        state = json.loads(file.read_text())
        return int(state["step"]), int(state["tokens"])
    except (OSError, ValueError, KeyError, TypeError) as error:  # TypeError: valid JSON, but not an object
        raise CheckpointError(f"{file}: unreadable trainer state, truncated or edited ({error})") from None


def checkpoint_problem(path: Path) -> str | None:
    """Why `path` is not a complete checkpoint to resume from, or None when it is one."""
    if path.name.endswith(PARTIAL):
        return "the temporary folder of a save that did not finish"
    if not (path / MARKER).is_file():
        # legalpt 0.1.0 wrote the trainer state last, and no marker
        hint = f" (if legalpt 0.1.0 saved it: `touch {path / MARKER}`)" if (path / STATE_FILE).is_file() else ""
        return f"no {MARKER} marker, its save did not finish{hint}"
    try:
        read_state(path)
    except CheckpointError as error:
        return str(error)
    return None


def latest_checkpoint(run_dir: Path, warn: bool = True) -> Path | None:
    """Newest complete checkpoint in a run folder, if any; newer folders that are not complete ones are skipped (with
    a warning when `warn`)."""
    for path in step_folders(run_dir):
        problem = checkpoint_problem(path)
        if problem is None:
            return path
        if warn:
            log.warning("resume: skipping %s: %s", path, problem)
    return None


def resolve_resume(resume: str, run_dir: Path) -> Path | None:
    """The checkpoint `train.resume` asks for: auto → newest complete one in the run folder (or none), none, or a
    path, which must hold a complete checkpoint."""
    if resume == "none":
        return None
    if resume == "auto":
        return latest_checkpoint(run_dir)
    path = Path(resume).expanduser()
    if (problem := checkpoint_problem(path)) is not None:
        raise CheckpointNotFoundError(f"train.resume={resume!r}: {path} is not a complete checkpoint ({problem})")
    return path


def state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the trainable parameters and the optimizer state (whole, also when sharded): a checkpoint's size
    before any checkpoint of the run can tell. A LoRA checkpoint leaves the frozen base out; without adapters every
    parameter trains."""
    trained = [p for p in model.parameters() if p.requires_grad]
    state = [t for per_param in optimizer.state.values() for t in per_param.values() if torch.is_tensor(t)]
    return sum(t.numel() * t.element_size() for t in [*trained, *state])


def save_checkpoint(
    accelerator: Accelerator,
    run_dir: Path,
    step: int,
    tokens: int,
    keep: int,
    data_state: dict | None = None,
    first_size: int = 0,
    frozen: FrozenBase | None = None,
) -> Path:
    """Save a resumable state for `step` (with this rank's `data_state`, a stream's `state_dict()`, if given), then
    drop all but the newest `keep` (>= 1) complete checkpoints. `first_size` estimates the bytes of a run's first
    checkpoint (`state_bytes`); a later one is expected as large as the previous one. With `frozen` (a LoRA run) the
    checkpoint holds the trainable parameters alone and records the base's identity.

    Every rank calls this. On a full disk or an unwritable folder every rank raises CheckpointError, with the .partial
    folder removed and the earlier checkpoints untouched."""
    main = accelerator.is_main_process
    [save] = broadcast_object_list([Save.plan(run_dir, step, first_size) if main else None])  # rank 0 reads the disk

    def write() -> None:
        with frozen.left_out() if frozen is not None else nullcontext():
            accelerator.save_state(str(save.partial))
        if frozen is not None and main:
            (save.partial / BASE_FILE).write_text(json.dumps(frozen.identity))
        if data_state is not None:
            data_state_file(save.partial, accelerator.process_index).write_text(json.dumps(data_state))

    save.attempt(accelerator, save.prepare if main else None)
    save.attempt(accelerator, write)  # every rank's files are on the disk before rank 0 marks the checkpoint complete
    save.attempt(accelerator, (lambda: save.finish(tokens)) if main else None)
    if main:
        prune(run_dir, keep)
    accelerator.wait_for_everyone()
    return save.final


@dataclass
class Save:
    """One checkpoint being saved: its folders, the bytes it is expected to take, and the checkpoint it follows."""

    step: int
    root: Path  # the run's checkpoints/ folder
    partial: Path  # written first
    final: Path  # the partial folder's name once complete
    needed: int  # expected bytes
    previous: Path | None  # the newest complete checkpoint before this one

    @classmethod
    def plan(cls, run_dir: Path, step: int, first_size: int) -> Save:
        root = checkpoint_root(run_dir)
        name = f"step_{step:06d}"
        previous = latest_checkpoint(run_dir, warn=False)
        needed = folder_bytes(previous) if previous is not None else first_size
        return cls(step, root, root / f"{name}{PARTIAL}", root / name, needed, previous)

    def prepare(self) -> None:
        """Rank 0: clear leftover .partial folders (a save that was interrupted) and check the free space."""
        self.root.mkdir(parents=True, exist_ok=True)
        for leftover in self.root.glob(f"step_*{PARTIAL}"):
            shutil.rmtree(leftover)
        if free_bytes(self.root) < self.needed:
            raise OSError(errno.ENOSPC, "not enough free space")

    def finish(self, tokens: int) -> None:
        """Rank 0, once every rank wrote its files: flush them, mark the folder complete, give it its name."""
        write_synced(self.partial / STATE_FILE, json.dumps({"step": self.step, "tokens": tokens}))
        for path in self.partial.rglob("*"):  # on the disk before the marker says so, also across a power loss
            fsync(path)
        write_synced(self.partial / MARKER, "")
        fsync(self.partial)
        if self.final.exists():  # an incomplete or damaged folder of this step, or a run restarted with resume=none
            shutil.rmtree(self.final)
        self.partial.rename(self.final)
        fsync(self.root)

    def attempt(self, accelerator: Accelerator, work: Callable[[], None] | None) -> None:
        """Run `work` on this rank (None: nothing to do here), then agree with every rank whether all succeeded. On a
        failure anywhere the .partial folder goes and every rank raises (none waits for the others in a later
        collective): CheckpointError for a full disk or an unwritable folder, else the failing rank's own error."""
        error, cause = None, None
        if work is not None:
            try:
                work()
            except Exception as caught:
                error, cause = caught, self.cause(caught)
        report = cause or (f"rank {accelerator.process_index}: {type(error).__name__}: {error}" if error else None)
        failures = [failure for failure in gather_object([report]) if failure is not None]
        if not failures:
            return
        if accelerator.is_main_process:
            shutil.rmtree(self.partial, ignore_errors=True)
        accelerator.wait_for_everyone()
        if error is not None and cause is None:
            raise error
        raise CheckpointError(self.message(cause or failures[0])) from error

    def cause(self, error: Exception) -> str | None:
        """A full disk or an unwritable folder in words; None for any other failure."""
        code = getattr(error, "errno", None)
        if code in NOT_WRITABLE:
            return f"the folder is not writable ({os.strerror(code)})"
        # torch.save reports a full disk as RuntimeError("basic_ios::clear: iostream error"), and a disk filled up
        # while it was written may have room left for less than the estimate: so judge by the space that is left.
        unwritten = self.needed - folder_bytes(self.partial)
        if code in NO_SPACE or free_bytes(self.root) < max(unwritten, NEARLY_FULL):
            return "no space left on the device"
        return None

    def message(self, cause: str) -> str:
        before = self.previous or "none (nothing was saved yet)"
        return (
            f"cannot save step {self.step} to {self.partial}: {cause}; about {human_bytes(self.needed)} needed, "
            f"{human_bytes(free_bytes(self.root))} free; the newest complete checkpoint stays {before}"
        )


def prune(run_dir: Path, keep: int) -> None:
    """Remove all but the newest `keep` complete checkpoints; a folder that will not go is reported, not fatal."""
    for old in [path for path in step_folders(run_dir) if checkpoint_problem(path) is None][keep:]:
        try:
            shutil.rmtree(old)
        except OSError as error:
            log.warning("could not remove the old checkpoint %s: %s", old, error)


def folder_bytes(path: Path) -> int:
    return sum(file.stat().st_size for file in path.rglob("*") if file.is_file())


def free_bytes(path: Path) -> int:
    """Free bytes on the disk that holds `path` (or would hold it: its nearest existing parent)."""
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free


def human_bytes(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024:
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} TiB"


def write_synced(path: Path, text: str) -> None:
    with path.open("w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def fsync(path: Path) -> None:
    """Flush a file's or a folder's (its entries') writes to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load_checkpoint(accelerator: Accelerator, path: Path, frozen: FrozenBase | None = None) -> tuple[int, int]:
    """Restore model, optimizer, scheduler and RNG; return (step, tokens) to continue from. With `frozen` (a LoRA run)
    the checkpoint holds the adapters alone, and the base the model was loaded with must be the one it records."""
    step, tokens = read_state(path)
    if frozen is not None:
        check_base(path, frozen)
    with frozen.left_out() if frozen is not None else nullcontext():
        accelerator.load_state(str(path))
    return step, tokens


def check_base(path: Path, frozen: FrozenBase) -> None:
    """CheckpointError unless the LoRA checkpoint at `path` records `frozen` as its base: its adapters were trained
    over those weights, and resuming them over others would silently train another model."""
    file = path / BASE_FILE
    try:
        recorded = json.loads(file.read_text())
    except (OSError, ValueError) as error:
        raise CheckpointError(f"{file}: unreadable record of the LoRA base ({error})") from None
    if changes := frozen.changes(recorded):
        raise CheckpointError(
            f"train.resume: {path} holds LoRA adapters of model.pretrained={frozen.pretrained!r} as the run started, "
            f"which has changed since ({'; '.join(changes)}); restore that base or train in a new train.output_dir"
        )


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
