"""The `fa3` backend: our Hopper attention kernels (csrc/fa3: wgmma on sm90a) behind the attention custom ops.

Forward and backward run on warpgroup MMAs at head dims 64 and 128; other head dims are zero-padded to the fa2
kernels' and run those, as does the deterministic backward's dQ pass. The kernels come from the same extension as
fa2's (kernels.py builds sm_90a for Hopper), so the schedules, checks and padding are fa2.py's.
"""

from __future__ import annotations

import torch
from torch import Tensor

from legalpt.attention import fa2, kernels
from legalpt.attention.masks import MaskSpec


def check(q: Tensor) -> None:
    """ValueError naming what keeps the fa3 backend from running on these inputs (called before any launch); then
    fa2.check's checks of the inputs and the build."""
    if q.device.type != "cuda":
        raise ValueError(f"backend: fa3 cannot run here: it needs a CUDA device and the inputs are on {q.device.type}")
    if not torch.cuda.is_available():
        raise ValueError("backend: fa3 cannot run here: no CUDA device is visible")
    major, minor = torch.cuda.get_device_capability(q.device)
    if (major, minor) != (9, 0):
        name = torch.cuda.get_device_name(q.device)
        raise ValueError(f"backend: fa3 cannot run here: it needs a Hopper GPU (sm90), and {name} has {major}.{minor}")
    if not kernels.has_fa3():
        raise ValueError(
            f"backend: fa3 cannot run here: the kernels are not built for sm_90a ({kernels.ARCHS_ENV} lacks 90)"
        )
    fa2.check(q)


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
    """fa2.forward's contract, on the Hopper forward."""
    check(q)
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
    """fa2.backward's contract, on the Hopper backward."""
    check(q)
    return fa2.backward(
        dout, q, k, v, out, lse, dlse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, spec, softmax_scale,
        softcap, deterministic, hopper=True,
    )  # fmt: skip
