"""Context parallelism: exact attention over a sequence sharded across processes (ring attention).

A packed sequence of T tokens (documents given by `cu_seqlens`, as `flash_attn_varlen_func` takes them) is cut into
2W equal chunks for W processes; process r holds chunks r and 2W-1-r (the zigzag layout), so that under a causal mask
every process has as many visible pairs as any other. Each process keeps its queries; the keys and values travel
round the ring (process r sends to r+1), and at each of the W steps a process attends its query chunks to the key
chunks it holds, one backend call per pair of chunks that share a document:
- a key chunk before the query chunk: the whole intersection of each document is visible (not causal);
- the same chunk: causal within each document, as without context parallelism;
- a key chunk after the query chunk: nothing visible under causal, skipped.
Partial results merge by their logsumexp, which our backends return: out = sum_i exp(lse_i - lse) out_i with
lse = logsumexp_i lse_i. The backward rotates K and V again and recomputes each pair's gradient from the merged out
and lse (the flash backward needs nothing else); dK and dV follow their K and V one step behind and come home after
the last step, summed in float32. Transfers overlap compute in both passes: the next K and V are sent while the held
ones are attended, and a block's dK and dV so far arrive while this process computes its own part of them. Memory
per process is that of its T/W tokens: nothing of the other processes' chunks is kept.

The plan (which pairs, their `cu_seqlens` and key ranges) is read from the host copy of `cu_seqlens` once per batch
(`RingPlan.build`); every layer reuses it. Masks other than causal or none (windows, global tokens) are not
supported here. The backend must be one of ours with a separate backward (reference, fa2, fa3).
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

from legalpt.attention import api
from legalpt.attention.backends import AttentionBatch
from legalpt.attention.masks import MaskSpec
from legalpt.attention.ops import KernelBackend


@dataclass(frozen=True)
class PairCall:
    """One backend call: a query chunk of this process against the rows of a key chunk that share its documents."""

    q_rows: slice  # the chunk's rows in this process's local tokens
    k_rows: slice  # rows of the key chunk in the local tokens of the process that holds it
    cu_seqlens_q: Tensor  # int32 (docs + 1,), from 0 to the chunk's length
    cu_seqlens_k: Tensor  # int32 (docs + 1,), from 0 to k_hi - k_lo
    max_seqlen_q: int
    max_seqlen_k: int
    causal: bool


@dataclass(frozen=True)
class RingPlan:
    """For each ring step (the key chunks of process rank - step), the backend calls of this process."""

    world: int
    rank: int
    chunk: int  # tokens per chunk: T / (2 * world)
    causal: bool
    steps: tuple[tuple[PairCall, ...], ...]
    group: dist.ProcessGroup | None = None  # the processes of the ring, in rank order; None: the default group

    def to(self, device: torch.device | str, non_blocking: bool = False) -> RingPlan:
        """The plan with its offsets on `device` (a data loader moves batches, and so plans, with `.to`)."""
        steps = tuple(
            tuple(
                dataclasses.replace(
                    call,
                    cu_seqlens_q=call.cu_seqlens_q.to(device, non_blocking=non_blocking),
                    cu_seqlens_k=call.cu_seqlens_k.to(device, non_blocking=non_blocking),
                )
                for call in calls
            )
            for calls in self.steps
        )
        return dataclasses.replace(self, steps=steps)

    @classmethod
    def build(
        cls,
        cu_seqlens: list[int],
        causal: bool,
        world: int,
        rank: int,
        device: torch.device,
        group: dist.ProcessGroup | None = None,
    ) -> RingPlan:
        """The plan of process `rank` of `world` for documents at `cu_seqlens` (host ints from 0 to T; T divisible
        by 2 * world)."""
        total = cu_seqlens[-1]
        if world < 1 or not 0 <= rank < world:
            raise ValueError(f"rank: expected a process in [0, {world}), got {rank}")
        if cu_seqlens[0] != 0 or any(b < a for a, b in itertools.pairwise(cu_seqlens)):
            raise ValueError(f"cu_seqlens: expected non-decreasing offsets from 0, got {cu_seqlens}")
        if total <= 0 or total % (2 * world):
            raise ValueError(
                f"cu_seqlens: expected a positive total length divisible by 2 x {world} processes, got {total}"
            )
        chunk = total // (2 * world)
        steps = []
        for step in range(world):
            source = (rank - step) % world
            calls = []
            for q_index, q_chunk in enumerate(zigzag_chunks(world, rank)):
                for k_index, k_chunk in enumerate(zigzag_chunks(world, source)):
                    if causal and k_chunk > q_chunk:
                        continue
                    call = _pair_call(cu_seqlens, chunk, (q_chunk, q_index), (k_chunk, k_index), causal, device)
                    if call is not None:
                        calls.append(call)
            steps.append(tuple(calls))
        return cls(world, rank, chunk, causal, tuple(steps), group)


def zigzag_chunks(world: int, rank: int) -> tuple[int, int]:
    """The two chunks (of 2 * world) that process `rank` holds: an early one and its mirror from the end."""
    return rank, 2 * world - 1 - rank


def shard(x: Tensor, world: int, rank: int, dim: int = 0) -> Tensor:
    """Process `rank`'s tokens of a full sequence `x` along `dim`: its two zigzag chunks, in order."""
    chunks = x.chunk(2 * world, dim)
    return torch.cat([chunks[c] for c in zigzag_chunks(world, rank)], dim)


def unshard(parts: list[Tensor], dim: int = 0) -> Tensor:
    """The full sequence from every process's `shard` (in rank order)."""
    world = len(parts)
    chunks: list[Tensor | None] = [None] * (2 * world)
    for rank, part in enumerate(parts):
        first, second = part.chunk(2, dim)
        chunks[rank], chunks[2 * world - 1 - rank] = first, second
    return torch.cat(chunks, dim)


def _pair_call(
    cu_seqlens: list[int],
    chunk: int,
    q_chunk: tuple[int, int],
    k_chunk: tuple[int, int],
    causal: bool,
    device: torch.device,
) -> PairCall | None:
    """The call of one query chunk against one key chunk, each given as (chunk of the sequence, its place among its
    process's two); None when no document spans both."""
    (q_chunk, q_index), (k_chunk, k_index) = q_chunk, k_chunk
    q0, q1 = q_chunk * chunk, (q_chunk + 1) * chunk
    k0, k1 = k_chunk * chunk, (k_chunk + 1) * chunk
    # the documents that intersect the query chunk: from the one holding q0 to the one holding q1 - 1
    first = bisect.bisect_right(cu_seqlens, q0) - 1
    last = bisect.bisect_left(cu_seqlens, q1)
    bounds = cu_seqlens[first : last + 1]  # their starts, then the last one's end
    q_bounds = [min(max(b, q0), q1) - q0 for b in bounds]
    k_bounds = [min(max(b, k0), k1) - k0 for b in bounds]
    k_lo, k_hi = k_bounds[0], k_bounds[-1]
    if k_hi == k_lo:
        return None
    k_bounds = [b - k_lo for b in k_bounds]
    lengths_q = [b - a for a, b in itertools.pairwise(q_bounds)]
    lengths_k = [b - a for a, b in itertools.pairwise(k_bounds)]
    return PairCall(
        q_rows=slice(q_index * chunk, (q_index + 1) * chunk),
        k_rows=slice(k_index * chunk + k_lo, k_index * chunk + k_hi),
        cu_seqlens_q=torch.tensor(q_bounds, dtype=torch.int32, device=device),
        cu_seqlens_k=torch.tensor(k_bounds, dtype=torch.int32, device=device),
        max_seqlen_q=max(lengths_q),
        max_seqlen_k=max(lengths_k),
        causal=causal and q_chunk == k_chunk,
    )


def ring_flash_attn_varlen_func(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    plan: RingPlan,
    softmax_scale: float | None = None,
    return_attn_probs: bool = False,
    *,
    deterministic: bool = False,
    backend: str | None = None,
) -> Tensor | tuple[Tensor, Tensor, None]:
    """Attention of this process's tokens over the whole sharded sequence.

    q: (T / W, H, D), k and v: (T / W, Hk, D): this process's two chunks (`shard`), in the plan's layout. Returns
    out (T / W, H, D); with return_attn_probs=True, (out, softmax_lse (H, T / W) float32, None), the logsumexp not
    differentiable. Differentiable in q, k and v; every process of the plan's group calls this together.
    deterministic: the backward's kernels run without atomics (the steps' sums are in a fixed order already)."""
    api._check_rank(q, k, v, 3, "(local_tokens, heads, head_dim)")
    api._check_qkv(q, k, v)
    local = 2 * plan.chunk
    for name, x in (("q", q), ("k", k)):
        if x.shape[0] != local:
            raise ValueError(f"{name}: expected {local} local tokens (two chunks of the plan), got {x.shape[0]}")
    if softmax_scale is None:
        softmax_scale = q.shape[-1] ** -0.5
    if not isinstance(deterministic, bool):
        raise TypeError(f"deterministic: expected a bool, got {type(deterministic).__name__}")
    scale = float(softmax_scale)
    chosen = _kernel_backend(backend, q, k, v, plan, scale)
    out, lse = _RingAttention.apply(q, k, v, plan, scale, chosen, deterministic)
    return (out, lse, None) if return_attn_probs else out


def _kernel_backend(
    backend: str | None, q: Tensor, k: Tensor, v: Tensor, plan: RingPlan, scale: float
) -> KernelBackend:
    """The backend for the plan's calls, checked on the first one (step 0 always has one: a chunk attends to
    itself); it must have a separate backward."""
    call = plan.steps[0][0]
    batch = _batch(q[call.q_rows], k[call.k_rows], v[call.k_rows], call, scale)
    chosen = api._resolve_backend(backend, False, batch)  # KernelBackends all return the logsumexp
    if not isinstance(chosen, KernelBackend):
        raise ValueError(f"backend: expected reference, fa2 or fa3 for ring attention, got {chosen.name}")
    return chosen


def _batch(
    q: Tensor, k: Tensor, v: Tensor, call: PairCall, scale: float, deterministic: bool = False
) -> AttentionBatch:
    spec = MaskSpec(causal=call.causal)
    return AttentionBatch(
        q, k, v, call.cu_seqlens_q, call.cu_seqlens_k, call.max_seqlen_q, call.max_seqlen_k, spec, scale,
        deterministic=deterministic,
    )  # fmt: skip


class _Ring:
    """Passes tensors to the next process and takes the previous one's (point-to-point, in the plan's group)."""

    def __init__(self, plan: RingPlan):
        group = plan.group or dist.group.WORLD
        self.group = group
        self.next = dist.get_global_rank(group, (plan.rank + 1) % plan.world)
        self.prev = dist.get_global_rank(group, (plan.rank - 1) % plan.world)
        self.pending: list = []
        self.sending: list[Tensor] = []  # held until the transfer is done, whatever the caller drops

    def start(self, tensors: list[Tensor]) -> list[Tensor]:
        """Send `tensors` on; return the buffers the previous process's are received into."""
        received = [torch.empty_like(t) for t in tensors]
        ops = [dist.P2POp(dist.isend, t, self.next, self.group) for t in tensors]
        ops += [dist.P2POp(dist.irecv, r, self.prev, self.group) for r in received]
        self.pending, self.sending = dist.batch_isend_irecv(ops), tensors
        return received

    def wait(self) -> None:
        for request in self.pending:
            request.wait()
        self.pending, self.sending = [], []


def _merge(out: Tensor, lse: Tensor, part: Tensor, part_lse: Tensor) -> None:
    """Fold a partial result into the running one, in place: out (T, H, D) float32, lse (H, T) float32."""
    merged = torch.logaddexp(lse, part_lse)
    finite = torch.isfinite(merged)  # rows that saw nothing yet keep 0 (exp(-inf - -inf) would be NaN)
    old = torch.where(finite, (lse - merged).exp(), 0.0).T[..., None]  # (T, H, 1)
    new = torch.where(finite, (part_lse - merged).exp(), 0.0).T[..., None]
    out.mul_(old).add_(part.float() * new)
    lse.copy_(merged)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, plan: RingPlan, scale: float, backend: KernelBackend, deterministic: bool):
        k, v = k.contiguous(), v.contiguous()  # sent whole, point to point
        out = q.new_zeros(q.shape, dtype=torch.float32)  # (T, H, D)
        lse = q.new_full((q.shape[1], q.shape[0]), float("-inf"), dtype=torch.float32)  # (H, T)
        ring = _Ring(plan) if plan.world > 1 else None
        held = [k, v]
        for step, calls in enumerate(plan.steps):
            incoming = ring.start(held) if step < plan.world - 1 else None
            for call in calls:
                kc, vc = held[0][call.k_rows], held[1][call.k_rows]
                part, part_lse = backend.forward(_batch(q[call.q_rows], kc, vc, call, scale))
                _merge(out[call.q_rows], lse[:, call.q_rows], part, part_lse)
            if incoming is not None:
                ring.wait()
                held = incoming
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.plan, ctx.scale, ctx.backend, ctx.deterministic = plan, scale, backend, deterministic
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        """Each step computes the gradients of the K, V block held while the next block is already on its way, and
        adds them to that block's float32 dK, dV as the previous process passed them on (which arrived during the
        compute); after the last step every block's dK, dV reach their owner."""
        q, k, v, out, lse = ctx.saved_tensors
        plan, scale, backend = ctx.plan, ctx.scale, ctx.backend
        dout = dout.contiguous()
        dq = torch.zeros_like(q, dtype=torch.float32)
        kv_ring, dkv_ring = (_Ring(plan), _Ring(plan)) if plan.world > 1 else (None, None)
        held, passed = [k, v], None  # passed: the held block's dK, dV so far (None at step 0: this process's block)
        for step, calls in enumerate(plan.steps):
            incoming = kv_ring.start(held) if step < plan.world - 1 else None
            grads = [torch.zeros_like(k, dtype=torch.float32), torch.zeros_like(v, dtype=torch.float32)]
            for call in calls:
                rows, keys = call.q_rows, call.k_rows
                batch = _batch(q[rows], held[0][keys], held[1][keys], call, scale, ctx.deterministic)
                row_lse = lse[:, rows].contiguous()
                dq_part, dk_part, dv_part = backend.backward(batch, out[rows], row_lse, dout[rows], None)
                dq[rows] += dq_part
                grads[0][keys] += dk_part
                grads[1][keys] += dv_part
            if passed is not None:
                dkv_ring.wait()
                for mine, theirs in zip(grads, passed, strict=True):
                    mine.add_(theirs)
            if incoming is not None:
                kv_ring.wait()
                held = incoming
            passed = dkv_ring.start(grads) if plan.world > 1 else grads  # on to the process that holds it next
        if plan.world > 1:
            dkv_ring.wait()  # after the last step the next process is the block's owner: this one's came home
        return dq.to(q.dtype), passed[0].to(k.dtype), passed[1].to(v.dtype), None, None, None, None
