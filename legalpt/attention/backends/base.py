"""The contract every attention backend keeps: an `AttentionBatch` in, the output and its logsumexp out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from torch import Tensor

from legalpt.attention.masks import MaskSpec


@dataclass(frozen=True, eq=False)
class AttentionBatch:
    """One attention call, checked by the public API (api.py) before any backend sees it.

    q: (B, Sq, H, D), k and v: (B, Sk, Hk, D); or varlen q: (total_q, H, D), k and v: (total_k, Hk, D) with
    cu_seqlens_q/k int32 (documents + 1,). max_seqlen_q/k: the rows' lengths, or an upper bound on the documents'.
    """

    q: Tensor
    k: Tensor
    v: Tensor
    cu_seqlens_q: Tensor | None
    cu_seqlens_k: Tensor | None
    max_seqlen_q: int
    max_seqlen_k: int
    mask: MaskSpec
    softmax_scale: float
    softcap: float = 0.0  # 0 = off; else scores become softcap * tanh(score / softcap)
    deterministic: bool = False  # a backward without atomics (fixed summation order)

    @property
    def varlen(self) -> bool:
        return self.cu_seqlens_q is not None

    @property
    def documents(self) -> int:
        """Batch rows, or the documents of a varlen batch."""
        return self.q.shape[0] if self.cu_seqlens_q is None else self.cu_seqlens_q.shape[0] - 1

    def op_args(self) -> tuple:
        """The batch as the custom ops' arguments (ops.py): the mask flattened by `MaskSpec.ints`."""
        return (
            self.q, self.k, self.v, self.cu_seqlens_q, self.cu_seqlens_k, self.max_seqlen_q, self.max_seqlen_k,
            self.softmax_scale, self.softcap, self.mask.ints(), self.mask.block_layout, self.deterministic,
        )  # fmt: skip

    @classmethod
    def from_op_args(cls, q, k, v, cu_q, cu_k, max_q, max_k, scale, softcap, mask, layout, deterministic):
        """The inverse of `op_args`."""
        spec = MaskSpec.from_ints(mask, layout)
        return cls(q, k, v, cu_q, cu_k, max_q, max_k, spec, scale, softcap, deterministic)


class Backend(Protocol):
    """An attention implementation: ours (reference, fa2, fa3: ops.KernelBackend) or a comparison (sdpa, flex)."""

    name: str
    returns_lse: bool  # whether `attention` gives the logsumexp (return_attn_probs=True needs it)

    def check(self, batch: AttentionBatch) -> None:
        """ValueError naming what keeps this backend from running `batch` here; cheap (decided once per device,
        head dim and dtype where the machine matters)."""

    def attention(self, batch: AttentionBatch) -> tuple[Tensor, Tensor | None]:
        """Differentiable: out like q, and the logsumexp float32 ((B, H, Sq), or (H, total_q) for varlen) or None."""
