"""The `sdpa` backend: torch's scaled_dot_product_attention with a dense boolean mask built from the element rule.

A comparison backend: it builds the full (Sq, Sk) mask per batch row (varlen: over the whole packed axis), so memory
is O(N^2). It has no logsumexp and no softcap. Autograd is torch's own.
"""

from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

from legalpt.attention.backends.base import AttentionBatch
from legalpt.attention.masks import Documents, batch_mask, packed_mask


class Sdpa:
    """torch's scaled_dot_product_attention on a dense mask: no logsumexp, no softcap."""

    name = "sdpa"
    returns_lse = False

    def check(self, batch: AttentionBatch) -> None:
        if batch.softcap > 0:
            raise ValueError("softcap: the sdpa backend cannot cap scores, expected 0.0 (use backend='reference')")

    def attention(self, batch: AttentionBatch) -> tuple[Tensor, None]:
        return attention(batch), None


def attention(batch: AttentionBatch) -> Tensor:
    """out like q: (B, Sq, H, D), or (total_q, H, D) for a varlen batch."""
    q, k, v, spec = batch.q, batch.k, batch.v, batch.mask
    if q.dim() == 4:
        mask = batch_mask(spec, q.shape[1], k.shape[1], q.device)  # (B or 1, H or 1, Sq, Sk)
        qh, kh, vh = (x.transpose(1, 2) for x in (q, k, v))  # (B, H, S, D)
    else:
        docs = Documents.from_cu_seqlens(
            batch.cu_seqlens_q, batch.cu_seqlens_k, q.shape[0], k.shape[0], batch.max_seqlen_q, batch.max_seqlen_k
        )
        mask = packed_mask(spec, docs, q.device)[None]  # (1, H or 1, total_q, total_k)
        qh, kh, vh = (x.transpose(0, 1)[None] for x in (q, k, v))  # (1, H, total, D)
    # A row with no visible key would come out NaN; give it key 0, then zero its output (and so its gradients).
    seen = mask.any(-1, keepdim=True)
    mask = mask | (~seen & (torch.arange(mask.shape[-1], device=q.device) == 0))
    kernels = sdpa_kernel(SDPBackend.MATH) if batch.deterministic else nullcontext()
    with kernels:
        out = F.scaled_dot_product_attention(
            qh, kh, vh, attn_mask=mask, scale=batch.softmax_scale, enable_gqa=q.shape[-2] != k.shape[-2]
        )
    out = out.masked_fill(~seen, 0.0)
    return (out.transpose(1, 2) if q.dim() == 4 else out[0].transpose(0, 1)).contiguous()


SDPA = Sdpa()
