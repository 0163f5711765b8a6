"""The `fa3` backend: our Hopper attention kernels (csrc/fa3: wgmma on sm90a) behind the attention custom ops.

Forward and backward run on warpgroup MMAs at head dims 64 and 128, and so at the head dims zero-padded to them
(33-63, 97-127); the others (up to 32, 65-96, 129-256) run fa2's kernels, as does the deterministic backward's dQ
pass. The kernels come from the same extension as fa2's (kernels.py builds sm_90a for Hopper), so the schedules,
checks and padding are fa2.py's.
"""

from __future__ import annotations

from torch import Tensor

from legalpt.attention import fa2
from legalpt.attention.masks import MaskSpec


def check(q: Tensor) -> None:
    """ValueError naming what keeps the fa3 backend from running on these inputs (called before any launch): fa2's
    checks, and a Hopper GPU with an sm_90a build."""
    fa2.check(q, "fa3")


def forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Tensor | None,
    cu_seqlens_k: Tensor | None,
    max_seqlen_q: int,
    max_seqlen_k: int,
    spec: MaskSpec,
    softmax_scale: float,
    softcap: float,
) -> tuple[Tensor, Tensor]:
    """fa2.forward's contract, on the Hopper forward (fa2.forward checks the inputs as fa3's)."""
    return fa2.forward(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, spec, softmax_scale, softcap, hopper=True
    )


def backward(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    dlse: Tensor | None,
    cu_seqlens_q: Tensor | None,
    cu_seqlens_k: Tensor | None,
    max_seqlen_q: int,
    max_seqlen_k: int,
    spec: MaskSpec,
    softmax_scale: float,
    softcap: float,
    deterministic: bool = False,
) -> tuple[Tensor, Tensor, Tensor]:
    """fa2.backward's contract, on the Hopper backward (fa2.backward checks the inputs as fa3's)."""
    return fa2.backward(
        dout, q, k, v, out, lse, dlse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, spec, softmax_scale,
        softcap, deterministic, hopper=True,
    )  # fmt: skip
