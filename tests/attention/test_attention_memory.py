"""The reference backend in O(N) memory, and on the GPU: peak memory of forward + backward grows linearly with N."""

from __future__ import annotations

import weakref

import pytest
import torch
from attention_helpers import naive_attention
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from legalpt.attention import flash_attn_func, flash_attn_varlen_func
from legalpt.attention.backends import AttentionBatch, reference
from legalpt.attention.masks import MaskSpec


class LiveBytes(TorchDispatchMode):
    """Peak bytes of tensor storages created under the mode and still alive (freed storages end via weakref)."""

    def __init__(self):
        super().__init__()
        self.live = self.peak = 0
        self._alive: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            key, size = storage.data_ptr(), storage.nbytes()
            if key in self._alive or size == 0:
                continue  # a view or in-place result of a storage already counted
            self._alive.add(key)
            self.live += size
            self.peak = max(self.peak, self.live)
            weakref.finalize(storage, self._free, key, size)
        return out

    def _free(self, key: int, size: int) -> None:
        self._alive.discard(key)
        self.live -= size


def _peak_bytes(n: int, causal: bool) -> int:
    """Peak live bytes of one reference forward + backward on a single document of n tokens (inputs excluded)."""
    q, k, v, dout = (torch.randn(1, n, 2, 16) for _ in range(4))
    spec = MaskSpec(causal=causal, block_size=(128, 128))
    with LiveBytes() as mode:
        batch = AttentionBatch(q, k, v, None, None, n, n, spec, 0.25)
        out, lse = reference.forward(batch)
        grads = reference.backward(batch, out, lse, dout, None)
        del out, lse, grads
    return mode.peak


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_peak_memory_is_linear_in_n(causal):
    small, large = _peak_bytes(512, causal), _peak_bytes(2048, causal)
    # 4x the tokens: linear memory grows ~4x, quadratic 16x. Dense float32 scores of both heads alone are 32 MiB.
    assert large < 5 * small, (small, large)
    assert large < 2 * 2048 * 2048 * 4 / 2


@pytest.mark.cuda
def test_cuda_peak_memory_is_linear_in_n():
    def peak(n: int) -> int:
        q, k, v = (torch.randn(1, n, 4, 64, device="cuda", requires_grad=True) for _ in range(3))
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        flash_attn_func(q, k, v, causal=True, backend="reference").sum().backward()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base

    small, large = peak(4096), peak(16384)
    assert large < 5 * small, (small, large)
    assert large < 16384 * 16384 * 4  # a single head's dense float32 scores


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_reference_matches_naive(dtype):
    lens = [300, 1, 77, 500]
    cu = torch.tensor([0, 300, 301, 378, 878], dtype=torch.int32, device="cuda")
    q, k, v = (torch.randn(878, h, 64, device="cuda", dtype=dtype, requires_grad=True) for h in (8, 2, 2))
    layout = torch.rand(4, 8, 4, 4, device="cuda") < 0.7
    kw = {"causal": True, "window_size": (200, 0), "global_tokens": 4, "block_layout": layout}
    out, lse, _ = flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), return_attn_probs=True, **kw)
    ref_out, ref_lse = naive_attention(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, window=(200, 0), causal=True,
                                       global_tokens=4, block_layout=layout)  # fmt: skip
    g = torch.randn_like(ref_out)
    grads = torch.autograd.grad((out.double() * g).sum(), (q, k, v))
    ref_grads = torch.autograd.grad((ref_out * g).sum(), (q, k, v))
    atol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.double(), ref_out, atol=atol, rtol=1e-3)
    torch.testing.assert_close(lse.double(), ref_lse, atol=1e-4, rtol=1e-4)
    for grad, ref in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(grad.double(), ref.double(), atol=10 * atol, rtol=1e-2)
