"""Context parallelism in training (`train.context_parallel`): rows longer than one device holds, split over a group
of processes that attend over the whole row together by ring attention (legalpt.attention.ring).

The W = train.context_parallel consecutive ranks of each group read the same batches (the loaders shard data over
the groups: `data_rank` of `data_world`), and each keeps its share of every batch: `collate` flattens the rows into
one sequence as `collate_packed` does, shifts the labels (position t's target is token t + 1 of its document, so a
share's last position keeps the target that lies in the next share) and keeps this process's two zigzag chunks of
input_ids, position_ids and those `shift_labels`, with the `RingPlan` that the model's attention layers follow
(legalpt.hf passes the `ring_plan` keyword argument to ring attention). The HF loss and legalpt's chunked and fused
losses take `shift_labels` as they are. Everything else stays as without it: each process's loss is the sum over its
share divided by the step's global target count, so DDP's or FSDP2's gradient reduction over all ranks adds the
shares of a row and averages the groups, as it adds micro-batches; the group's first process counts the row's
tokens and pairs for tokens/s and MFU (`segment_lengths`), the others count none.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from accelerate import Accelerator

from legalpt.attention.ring import RingPlan, shard
from legalpt.data.pack import collate_packed
from legalpt.train.loss import next_token_targets
from legalpt.train.metrics import segment_lengths


@dataclass(frozen=True)
class ContextParallel:
    """This process's place: rank `rank` of a group of `size`, which is data-parallel replica `data_rank` of
    `data_world`."""

    size: int
    rank: int
    data_rank: int
    data_world: int
    group: dist.ProcessGroup | None  # None: the group is every process

    @classmethod
    def start(cls, size: int, accelerator: Accelerator) -> ContextParallel | None:
        """The groups of `size` consecutive ranks (every process calls this: each group is created by all); None when
        `size` is 1."""
        if size == 1:
            return None
        world, rank = accelerator.num_processes, accelerator.process_index
        if world % size:
            raise ValueError(
                f"train.context_parallel: expected a divisor of the {world} processes launched (groups of equal "
                f"size), got {size}"
            )
        group = None  # one group of every process: the default one
        if world > size:
            groups = [dist.new_group(list(range(first, first + size))) for first in range(0, world, size)]
            group = groups[rank // size]
        return cls(size, rank % size, rank // size, world // size, group)

    def collate(self, rows: list[dict]) -> dict:
        """This process's share of the packed `rows` (on the CPU, in a data loader's workers or the main process)."""
        batch = collate_packed(rows)  # (1, T) each
        cu_seqlens = batch["cu_seq_lens_q"].tolist()
        shift_labels = next_token_targets(batch["labels"]).view_as(batch["labels"])  # (1, T): each position's target
        first = self.rank == 0  # counts the row's tokens and pairs for the group
        lengths = segment_lengths(batch["labels"], batch["cu_seq_lens_q"])  # (n,)
        plan = RingPlan.build(cu_seqlens, True, self.size, self.rank, torch.device("cpu"), self.group)
        share = {
            name: shard(batch[name], self.size, self.rank, dim=1) for name in ("input_ids", "position_ids")
        }  # (1, T / W) each
        labels = shard(shift_labels, self.size, self.rank, dim=1)
        return {
            **share,
            "labels": labels,  # HF computes a loss only when labels are given; shift_labels decide it
            "shift_labels": labels,
            "ring_plan": plan,
            "segment_lengths": lengths if first else torch.zeros_like(lengths),
        }


def data_shard(accelerator: Accelerator, context: ContextParallel | None) -> tuple[int, int]:
    """(index, count) of this process's share of the training data: its rank among all processes, or its group's
    among the context-parallel groups."""
    if context is None:
        return accelerator.process_index, accelerator.num_processes
    return context.data_rank, context.data_world
