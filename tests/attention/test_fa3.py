"""The fa3 backend (forward and backward on Hopper's wgmma, csrc/sm90) on a GPU run of its own: test_fa2.py's
cases at the head dims that run fa3's kernels (64 and 128, and 36 padded to 64; every mask, both dtypes, odd and
unequal lengths, GQA and MQA, softcap, strided inputs, deterministic dQ), rows that see no key, varlen packs, split
global key tiles and FlexAttention as a second reference, all through test_fa2.py's checks (out, lse, dq, dk, dv)
with the backend switched to fa3. `LEGALPT_FA2_TEST_BACKEND=fa3 pytest tests/attention/test_fa2.py` runs all of
test_fa2.py on fa3. The CPU tests of its checks and build flags are in test_fa2_checks.py, of its kernels' logic in
test_fa2_emulated.py.
"""

from __future__ import annotations

import pytest
import test_fa2 as base
import torch

from legalpt.attention import flash_attn_func, flash_attn_varlen_func, kernels

pytestmark = pytest.mark.cuda

HEAD_DIMS = (64, 128)  # the fa3 kernels'; head dims that pad to them (36 in test_fa2's list) run them too
CASES = [case for case in base._cases() if kernels.padded_head_dim(case.head_dim) in HEAD_DIMS]


@pytest.fixture(autouse=True)
def _on_fa3(monkeypatch, rng) -> None:
    """The backend under test is fa3 (on a Hopper GPU), with fresh inputs seeded by tests/conftest.py's rng."""
    if not torch.cuda.is_available() or kernels.unavailable_reason(torch.device("cuda"), 64, torch.bfloat16, True):
        pytest.skip("the fa3 kernels need a Hopper GPU (sm90) and an sm_90a build (LEGALPT_CUDA_ARCHS with 90)")
    monkeypatch.setattr(base, "BACKEND", "fa3")


@pytest.mark.parametrize("case", CASES, ids=str)
def test_matches_naive(case: base.Case):
    base._check_case(case)


@pytest.mark.parametrize("case", base.NO_KEY_CASES, ids=str)
def test_rows_that_see_no_key(case: base.Case):
    assert base._check_case(case).any()


@pytest.mark.parametrize("mask", base.VARLEN_MASKS)
def test_varlen_matches_naive(mask: str, rng):
    base.test_varlen_matches_naive(mask, torch.bfloat16, 128, (6, 2), False, rng)


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_varlen_documents_stay_apart(head_dim: int):
    base.test_varlen_documents_stay_apart(head_dim)


@pytest.mark.parametrize("case", [c for c in base.SPLIT_CASES if c.head_dim in HEAD_DIMS], ids=str)
def test_split_global_key_tiles(case: base.Case, monkeypatch):
    base.test_split_global_key_tiles(case, monkeypatch)


def test_deterministic_backward_is_bitwise_repeatable():
    base.test_deterministic_backward_is_bitwise_repeatable()


@pytest.mark.parametrize("case", list(base.FLEX_CASES))
def test_flex_attention_agrees(case: str):
    base.test_flex_attention_agrees(case)


@pytest.mark.parametrize("dtype", base.DTYPES, ids=base.DTYPE_NAMES.get)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize(
    ("mask", "seqlens"), [("causal", base.LONG[0]), ("none", (113, base.LONG[1][1]))], ids=["causal", "dense-unequal"]
)
def test_rescale_when_the_max_moves(head_dim: int, mask: str, seqlens: tuple, dtype: torch.dtype):
    base.test_rescale_when_the_max_moves(head_dim, mask, seqlens, dtype)


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("scale", [-0.125, 0.0])
def test_softmax_scale_of_any_sign(head_dim: int, scale: float):
    base.test_softmax_scale_of_any_sign(head_dim, scale)


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("varlen", [False, True], ids=["window", "varlen-window"])
def test_dq_reductions_at_scale(head_dim: int, varlen: bool, rng):
    """The backward's blocks add their dQ parts into shared query tiles by TMA reductions (csrc/fa3/bwd.cuh,
    add_dq_tiles): here hundreds of blocks reach the same tiles at once (a window at 16k tokens, in varlen documents
    whose last tiles reach into the next one) over memory poisoned with NaN, and dq must match the deterministic
    pass's (fa2's dQ kernel, which sums in a fixed order) in every one of 5 runs."""
    lens = [rng.randint(1, 3000) for _ in range(12)] if varlen else [16384]
    total, heads = sum(lens), 8
    q, k, v = base._qkv((total, heads, head_dim), (total, heads // 2, head_dim), torch.bfloat16)
    kw = {"causal": True, "window_size": (700, 0)}
    grad = torch.randn((total, heads, head_dim), dtype=torch.bfloat16, device=q.device)
    cu = base._cu(lens)

    def dq(deterministic: bool) -> torch.Tensor:
        if varlen:
            args = (q, k, v, cu, cu, max(lens), max(lens))
            out = flash_attn_varlen_func(*args, **kw, deterministic=deterministic, backend="fa3")
        else:
            out = flash_attn_func(q[None], k[None], v[None], **kw, deterministic=deterministic, backend="fa3")
        return torch.autograd.grad(out, q, grad.view_as(out))[0]

    reference = dq(deterministic=True).float()
    tolerance = 1e-2 * reference.abs().max().item()
    for _ in range(5):
        base._poison()
        error = (dq(deterministic=False).float() - reference).abs().max().item()
        assert error <= tolerance, f"dq differs from the deterministic pass's by {error} (at most {tolerance})"
