"""Stopping a training run on request: SIGINT (Ctrl-C) and SIGTERM (a cluster's preemption notice).

While the training loop runs, the first such signal only marks a request: the loop finishes its optimizer step, saves
a checkpoint (none with train.save_every=0) and ends, and `legalpt-train` exits with 128 + the signal's number (130
for SIGINT, 143 for SIGTERM), as a shell reports a process that a signal ended; `train.resume=auto` (the default)
continues from that checkpoint. A second Ctrl-C aborts at once, without saving. With several processes the ranks
reduce their requests at every step boundary, so all of them stop after the same step even when the signal reached
one of them only.
"""

from __future__ import annotations

import logging
import signal
import threading
from time import monotonic

import torch
import torch.distributed as dist
from accelerate import Accelerator

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGINT, signal.SIGTERM)
# torchrun forwards to its workers the Ctrl-C that the terminal already sent them: a SIGINT this soon after the first
# is that copy, not a second press.
ECHO_S = 1.0


def exit_status(signum: int) -> int:
    """The exit status of a run that the signal `signum` stopped."""
    return 128 + signum


class StopSignals:
    """Context manager around the training loop: while inside, SIGINT and SIGTERM request a stop, and `requested()`
    says at each step boundary whether to stop (the handlers of before come back on exit)."""

    def __init__(self, accelerator: Accelerator, saves: bool = True):
        self.accelerator = accelerator
        self.saves = saves  # whether the stop saves a checkpoint (train.save_every > 0): what the warning says
        self.signum: int | None = None  # the first signal this process received
        self.received_at = 0.0  # when, by time.monotonic
        self.previous: dict[int, object] = {}  # the handlers to restore
        self.group = None  # the process group that reduces the requests (None: the default group)

    def __enter__(self) -> StopSignals:
        if self.accelerator.num_processes > 1:
            self.group = cpu_group()
        # Python runs signal handlers in the main thread only; elsewhere (a notebook's worker thread) signals keep
        # their default behaviour.
        if threading.current_thread() is threading.main_thread():
            self.previous = {signum: signal.signal(signum, self.receive) for signum in SIGNALS}
        return self

    def __exit__(self, *exc_info) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)

    def receive(self, signum: int, frame) -> None:
        now = monotonic()
        if self.signum is None:
            self.signum, self.received_at = signum, now
            then = "with a checkpoint (a second Ctrl-C aborts without saving)" if self.saves else "(train.save_every=0)"
            log.warning("%s received: stopping after this step %s", signal.Signals(signum).name, then)
        elif signum == signal.SIGINT and now - self.received_at > ECHO_S:
            raise KeyboardInterrupt

    def requested(self) -> int | None:
        """The signal to stop for (the highest number any rank received), or None to go on. With several processes
        this is a collective: every rank calls it after every optimizer step."""
        if self.accelerator.num_processes == 1:
            return self.signum
        flag = torch.tensor([self.signum or 0])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
        return int(flag.item()) or None


def cpu_group():
    """A process group that reduces CPU tensors, so that the check at each step never waits for the GPU: the default
    group when it runs gloo (a CPU launch), else a gloo group of all ranks."""
    if "gloo" in dist.get_backend():
        return None
    return dist.new_group(backend="gloo")
