"""Both backends against naive float64 attention: every mask kind and combination, GQA/MQA, odd and unequal sizes,
bottom-right causal, varlen documents, rows that see no key, gradients (also through the logsumexp), bf16/fp16."""

from __future__ import annotations

import itertools

import pytest
import torch
from attention_helpers import naive_attention

from legalpt.attention import flash_attn_func, flash_attn_varlen_func


def _qkv(q_shape, kv_shape, dtype=torch.float32, device="cpu"):
    return tuple(
        torch.randn(shape, dtype=dtype, device=device, requires_grad=True) for shape in (q_shape, kv_shape, kv_shape)
    )


def _naive_kwargs(kw: dict) -> dict:
    """Public keyword arguments -> naive_attention's (window_size is `window` there)."""
    kw = dict(kw)
    if "window_size" in kw:
        kw["window"] = kw.pop("window_size")
    return kw


def _run(fn, q, k, v, *args, backend, **kw):
    """(out, lse or None) from the public function; lse only where the backend has one."""
    if backend == "sdpa":
        return fn(q, k, v, *args, backend=backend, **kw), None
    out, lse, probs = fn(q, k, v, *args, backend=backend, return_attn_probs=True, **kw)
    assert probs is None
    return out, lse


def _assert_matches_naive(out, lse, q, k, v, ref_out, ref_lse, grad_atol=1e-4):
    """out and lse close to the naive ones; dq, dk, dv of a loss on out (and lse) close to float64 autograd."""
    torch.testing.assert_close(out.double(), ref_out, atol=2e-5, rtol=1e-4)
    g_out = torch.randn_like(ref_out)
    loss, ref_loss = (out.double() * g_out).sum(), (ref_out * g_out).sum()
    if lse is not None:
        assert lse.dtype == torch.float32 and lse.shape == ref_lse.shape
        assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse)), "rows that see no key differ"
        torch.testing.assert_close(lse.double(), ref_lse, atol=2e-5, rtol=1e-4)
        g_lse = torch.randn_like(ref_lse)
        finite = torch.isfinite(ref_lse)
        loss = loss + (lse.double().where(finite, 0.0) * g_lse).sum()
        ref_loss = ref_loss + (ref_lse.where(finite, 0.0) * g_lse).sum()
    grads = torch.autograd.grad(loss, (q, k, v))
    ref_grads = torch.autograd.grad(ref_loss, (q, k, v))
    for name, grad, ref in zip("qkv", grads, ref_grads, strict=True):
        assert torch.isfinite(grad).all(), f"d{name} has NaN/inf"
        torch.testing.assert_close(grad.double(), ref.double(), atol=grad_atol, rtol=1e-4, msg=f"d{name}")


# (batch, seqlen_q, seqlen_k, heads, kv_heads, head_dim, block_size, mask keyword arguments)
BATCH_CASES = {
    "full": (2, 113, 113, 4, 4, 16, (16, 16), {}),
    "full-one-block": (2, 37, 53, 2, 2, 32, (128, 128), {}),
    "causal": (2, 113, 113, 4, 4, 16, (16, 16), {"causal": True}),
    "causal-q<k": (2, 113, 203, 4, 2, 16, (32, 16), {"causal": True}),
    "causal-q>k": (2, 203, 113, 4, 2, 16, (16, 32), {"causal": True}),
    "causal-q1": (3, 1, 203, 4, 1, 16, (16, 16), {"causal": True}),
    "causal-k1": (2, 50, 1, 2, 2, 16, (16, 16), {"causal": True}),
    "one-token": (1, 1, 1, 2, 1, 16, (16, 16), {"causal": True}),
    "window-left": (2, 113, 113, 4, 4, 16, (16, 16), {"window_size": (17, -1)}),
    "window-right": (2, 113, 113, 4, 4, 16, (16, 16), {"window_size": (-1, 9)}),
    "window-both": (2, 113, 203, 4, 4, 16, (16, 16), {"window_size": (20, 5)}),
    "window-zero": (1, 113, 113, 2, 2, 16, (16, 16), {"window_size": (0, 0)}),
    "causal-window": (2, 203, 113, 4, 2, 16, (32, 16), {"causal": True, "window_size": (30, 0)}),
    "causal-window-right": (2, 113, 113, 4, 4, 16, (16, 16), {"causal": True, "window_size": (30, 12)}),
    "global": (2, 113, 113, 4, 4, 16, (16, 16), {"window_size": (4, 4), "global_tokens": 9}),
    "causal-global": (2, 113, 203, 4, 2, 16, (16, 16), {"causal": True, "window_size": (8, 0), "global_tokens": 5}),
    "causal-global-q>k": (1, 203, 113, 2, 2, 16, (16, 16), {"causal": True, "window_size": (8, 0), "global_tokens": 5}),
    "global-no-window": (1, 113, 113, 2, 2, 16, (16, 16), {"causal": True, "global_tokens": 20}),
    "dilation": (2, 113, 113, 4, 4, 16, (16, 16), {"dilation": 3}),
    "causal-dilation": (2, 113, 203, 4, 2, 16, (16, 16), {"causal": True, "dilation": 2}),
    "window-dilation": (2, 113, 113, 4, 4, 16, (16, 16), {"window_size": (24, 24), "dilation": 4}),
    "all-position-masks": (
        2, 113, 203, 4, 2, 16, (32, 16),
        {"causal": True, "window_size": (40, 0), "dilation": 3, "global_tokens": 6},
    ),
    "gqa": (2, 113, 113, 6, 2, 32, (16, 16), {"causal": True}),
    "mqa": (2, 113, 113, 4, 1, 32, (16, 16), {"causal": True, "window_size": (10, 0)}),
    "blocks-unequal": (2, 113, 203, 4, 2, 16, (8, 48), {"causal": True, "window_size": (50, 0)}),
    "blocks-of-one": (1, 19, 23, 2, 1, 16, (1, 1), {"causal": True, "window_size": (3, 2), "global_tokens": 2}),
}  # fmt: skip


@pytest.mark.parametrize("backend", ["reference", "sdpa"])
@pytest.mark.parametrize("case", list(BATCH_CASES), ids=list(BATCH_CASES))
def test_batch_matches_naive(case, backend):
    batch, sq, sk, heads, kv_heads, dim, block_size, kw = BATCH_CASES[case]
    q, k, v = _qkv((batch, sq, heads, dim), (batch, sk, kv_heads, dim))
    out, lse = _run(flash_attn_func, q, k, v, backend=backend, block_size=block_size, **kw)
    assert out.shape == q.shape and out.dtype == q.dtype
    ref_out, ref_lse = naive_attention(q, k, v, block_size=block_size, **_naive_kwargs(kw))
    _assert_matches_naive(out, lse, q, k, v, ref_out, ref_lse)


LAYOUT_KWARGS = {
    "layout": {},
    "layout-causal": {"causal": True},
    "layout-global": {"causal": True, "window_size": (20, 0), "global_tokens": 5},
    "layout-dilation": {"window_size": (30, 30), "dilation": 2},
}


@pytest.mark.parametrize("backend", ["reference", "sdpa"])
@pytest.mark.parametrize("layout_dims", [2, 3, 4])
@pytest.mark.parametrize("case", list(LAYOUT_KWARGS))
def test_block_layout_matches_naive(case, layout_dims, backend):
    batch, heads, sq, sk, block_size = 2, 4, 113, 203, (32, 16)
    blocks = (-(-sq // block_size[0]), -(-sk // block_size[1]))
    layout = torch.rand((batch, heads, *blocks)[4 - layout_dims :]) < 0.5
    layout[..., 0, :] = False  # the first query block sees nothing: out 0, lse -inf
    q, k, v = _qkv((batch, sq, heads, 16), (batch, sk, 2, 16))
    kw = {**LAYOUT_KWARGS[case], "block_layout": layout, "block_size": block_size}
    out, lse = _run(flash_attn_func, q, k, v, backend=backend, **kw)
    ref_out, ref_lse = naive_attention(q, k, v, **_naive_kwargs(kw))
    _assert_matches_naive(out, lse, q, k, v, ref_out, ref_lse)
    assert (out[:, : block_size[0]] == 0).all()


def test_softcap_matches_naive():
    q, k, v = _qkv((2, 113, 4, 16), (2, 203, 2, 16))
    kw = {"causal": True, "window_size": (50, 0), "global_tokens": 3, "softcap": 2.0, "softmax_scale": 0.7}
    out, lse = _run(flash_attn_func, q, k, v, backend="reference", block_size=(32, 16), **kw)
    ref_out, ref_lse = naive_attention(q, k, v, block_size=(32, 16), **_naive_kwargs(kw))
    _assert_matches_naive(out, lse, q, k, v, ref_out, ref_lse)


def _cu(lens):
    return torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32)


# Documents of every kind: empty query side, single tokens, Sq < Sk and Sq > Sk, several blocks, no keys.
VARLEN_LENS = ([5, 0, 130, 1, 64, 33, 7, 40], [5, 3, 130, 40, 64, 70, 0, 17])
VARLEN_KWARGS = {
    "full": {},
    "causal": {"causal": True},
    "window-global": {"window_size": (7, 3), "global_tokens": 2},
    "causal-window-dilation": {"causal": True, "window_size": (33, 0), "dilation": 2},
    "layout-per-doc": {"causal": True, "global_tokens": 4, "block_layout": "per-doc"},
    "layout-per-head": {"window_size": (20, 20), "block_layout": "per-head"},
}


@pytest.mark.parametrize("backend", ["reference", "sdpa"])
@pytest.mark.parametrize("case", list(VARLEN_KWARGS))
def test_varlen_matches_naive(case, backend):
    lens_q, lens_k = VARLEN_LENS
    cu_q, cu_k = _cu(lens_q), _cu(lens_k)
    heads, block_size, max_q, max_k = 4, (48, 32), max(lens_q), max(lens_k) + 5  # max_seqlen may exceed the longest
    kw = dict(VARLEN_KWARGS[case], block_size=block_size)
    blocks = (-(-max_q // block_size[0]), -(-max_k // block_size[1]))
    if kw.get("block_layout") == "per-doc":
        kw["block_layout"] = torch.rand(len(lens_q), heads, *blocks) < 0.6
    elif kw.get("block_layout") == "per-head":
        kw["block_layout"] = torch.rand(heads, *blocks) < 0.6
    q, k, v = _qkv((sum(lens_q), heads, 16), (sum(lens_k), 2, 16))
    out, lse = _run(flash_attn_varlen_func, q, k, v, cu_q, cu_k, max_q, max_k, backend=backend, **kw)
    assert out.shape == q.shape
    ref_out, ref_lse = naive_attention(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, **_naive_kwargs(kw))
    _assert_matches_naive(out, lse, q, k, v, ref_out, ref_lse)


def test_varlen_documents_do_not_see_each_other():
    """Changing one document's keys and values leaves every other document's output unchanged."""
    lens = [37, 64, 5, 90]
    cu = _cu(lens)
    q, k, v = (torch.randn(sum(lens), 4, 16) for _ in range(3))
    out = flash_attn_varlen_func(q, k, v, cu, cu, 90, 90, causal=False, block_size=(32, 32))
    k2, v2 = k.clone(), v.clone()
    k2[37:101] += 3.0
    v2[37:101] -= 5.0
    out2 = flash_attn_varlen_func(q, k2, v2, cu, cu, 90, 90, causal=False, block_size=(32, 32))
    assert torch.equal(out[:37], out2[:37]) and torch.equal(out[101:], out2[101:])
    assert not torch.allclose(out[37:101], out2[37:101])


@pytest.mark.parametrize("backend", ["reference", "sdpa"])
def test_rows_that_see_no_key(backend):
    """Causal with Sq > Sk leaves the first Sq - Sk query rows without keys: output 0, lse -inf, zero gradients."""
    q, k, v = _qkv((2, 50, 4, 16), (2, 20, 2, 16))
    out, lse = _run(flash_attn_func, q, k, v, backend=backend, causal=True, block_size=(16, 16))
    assert torch.equal(out[:, :30], torch.zeros_like(out[:, :30]))
    assert torch.isfinite(out).all()
    if lse is not None:
        assert torch.isneginf(lse[:, :, :30]).all() and torch.isfinite(lse[:, :, 30:]).all()
    (out * torch.randn_like(out)).sum().backward()
    for x in (q, k, v):
        assert torch.isfinite(x.grad).all()
    assert torch.equal(q.grad[:, :30], torch.zeros_like(q.grad[:, :30]))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("varlen", [False, True])
def test_low_precision_within_twice_plain_pytorch_error(dtype, varlen):
    """flash-attn's rule: error vs float64 at most 2x that of plain PyTorch in the same dtype (+ a small atol)."""
    kw = {"causal": True, "window_size": (60, 0), "global_tokens": 3, "block_size": (32, 32)}
    if varlen:
        lens = [70, 1, 150, 35]
        cu = _cu(lens)
        q, k, v = _qkv((sum(lens), 4, 32), (sum(lens), 2, 32), dtype=dtype)
        extra, ref_extra = (cu, cu, 150, 150), {"cu_seqlens_q": cu, "cu_seqlens_k": cu}
        fn = flash_attn_varlen_func
    else:
        q, k, v = _qkv((2, 150, 4, 32), (2, 150, 2, 32), dtype=dtype)
        extra, ref_extra, fn = (), {}, flash_attn_func
    out = fn(q, k, v, *extra, **kw)
    assert out.dtype == dtype
    exact, _ = naive_attention(q, k, v, **ref_extra, **_naive_kwargs(kw))
    plain, _ = naive_attention(q, k, v, dtype=dtype, **ref_extra, **_naive_kwargs(kw))
    g = torch.randn_like(exact)
    grads = torch.autograd.grad((out.double() * g).sum(), (q, k, v))
    exact_grads = torch.autograd.grad((exact * g).sum(), (q, k, v))
    plain_grads = torch.autograd.grad((plain.double() * g).sum(), (q, k, v))
    atol = 1e-3 if dtype == torch.float16 else 5e-3
    assert (out.double() - exact).abs().max() <= 2 * (plain.double() - exact).abs().max() + atol
    for name, grad, ex, pl in zip("qkv", grads, exact_grads, plain_grads, strict=True):
        err, plain_err = (grad.double() - ex).abs().max(), (pl.double() - ex).abs().max()
        assert err <= 2 * plain_err + atol, f"d{name}: {err} vs plain {plain_err}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reference_ignores_autocast(dtype):
    """Under autocast (as in mixed-precision training) the reference still computes in float32: same result."""
    q, k, v = _qkv((2, 70, 4, 32), (2, 70, 2, 32), dtype=dtype)
    kw = {"causal": True, "block_size": (16, 16), "backend": "reference"}
    expected = flash_attn_func(q, k, v, **kw)
    expected_grads = torch.autograd.grad(expected.float().square().sum(), (q, k, v))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = flash_attn_func(q, k, v, **kw)
        grads = torch.autograd.grad(out.float().square().sum(), (q, k, v))
    assert out.dtype == dtype and torch.equal(out, expected)
    assert all(torch.equal(a, b) for a, b in zip(grads, expected_grads, strict=True))
