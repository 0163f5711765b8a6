"""The public API: flash-attn 2.x signatures and return values, validation before any compute, what is refused,
backend precedence, and an import that loads no CUDA code."""

from __future__ import annotations

import inspect
import logging
import subprocess
import sys

import pytest
import torch

from legalpt.attention import (
    BACKEND_ENV,
    api,
    backends,
    flash_attn_func,
    flash_attn_varlen_func,
    get_backend,
    set_backend,
)

FLASH_ATTN_FUNC = {
    "q": inspect.Parameter.empty, "k": inspect.Parameter.empty, "v": inspect.Parameter.empty,
    "dropout_p": 0.0, "softmax_scale": None, "causal": False, "window_size": (-1, -1), "softcap": 0.0,
    "alibi_slopes": None, "deterministic": False, "return_attn_probs": False,
}  # fmt: skip
FLASH_ATTN_VARLEN_FUNC = {
    "q": inspect.Parameter.empty, "k": inspect.Parameter.empty, "v": inspect.Parameter.empty,
    "cu_seqlens_q": inspect.Parameter.empty, "cu_seqlens_k": inspect.Parameter.empty,
    "max_seqlen_q": inspect.Parameter.empty, "max_seqlen_k": inspect.Parameter.empty,
    "dropout_p": 0.0, "softmax_scale": None, "causal": False, "window_size": (-1, -1), "softcap": 0.0,
    "alibi_slopes": None, "deterministic": False, "return_attn_probs": False, "block_table": None,
}  # fmt: skip
EXTRAS = {"global_tokens": 0, "dilation": 1, "block_layout": None, "block_size": (128, 128), "backend": None}


@pytest.mark.parametrize(
    ("fn", "flash_attn"), [(flash_attn_func, FLASH_ATTN_FUNC), (flash_attn_varlen_func, FLASH_ATTN_VARLEN_FUNC)]
)
def test_signature_is_flash_attn_2_plus_keyword_extras(fn, flash_attn):
    params = list(inspect.signature(fn).parameters.values())
    positional = params[: len(flash_attn)]
    assert {p.name: p.default for p in positional} == flash_attn
    assert [p.name for p in positional] == list(flash_attn)
    extras = params[len(flash_attn) :]
    assert {p.name: p.default for p in extras} == EXTRAS
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in extras)


def test_return_convention():
    q, k, v = torch.randn(2, 7, 4, 8), torch.randn(2, 9, 2, 8), torch.randn(2, 9, 2, 8)
    out = flash_attn_func(q, k, v)
    assert isinstance(out, torch.Tensor) and out.shape == (2, 7, 4, 8)
    out, lse, probs = flash_attn_func(q, k, v, return_attn_probs=True)
    assert lse.shape == (2, 4, 7) and lse.dtype == torch.float32 and probs is None
    cu = torch.tensor([0, 3, 14], dtype=torch.int32)
    q, k, v = torch.randn(14, 4, 8), torch.randn(14, 1, 8), torch.randn(14, 1, 8)
    out, lse, probs = flash_attn_varlen_func(q, k, v, cu, cu, 11, 11, return_attn_probs=True)
    assert out.shape == (14, 4, 8) and lse.shape == (4, 14) and lse.dtype == torch.float32 and probs is None


@pytest.fixture
def no_compute(monkeypatch):
    """Every backend fails the test if reached: validation must reject the input first."""

    def unreachable(name):
        raise AssertionError(f"a backend ({name}) was reached on invalid input")

    monkeypatch.setattr(backends, "get", unreachable)


def _batch(**overrides):
    args = {"q": torch.randn(2, 16, 4, 8), "k": torch.randn(2, 24, 2, 8), "v": torch.randn(2, 24, 2, 8)}
    args.update(overrides)
    return args


def _varlen(**overrides):
    cu = torch.tensor([0, 5, 16], dtype=torch.int32)
    args = {
        "q": torch.randn(16, 4, 8), "k": torch.randn(16, 2, 8), "v": torch.randn(16, 2, 8),
        "cu_seqlens_q": cu, "cu_seqlens_k": cu, "max_seqlen_q": 11, "max_seqlen_k": 11,
    }  # fmt: skip
    args.update(overrides)
    return args


def _i32(*values):
    return torch.tensor(values, dtype=torch.int32)


BAD_BATCH = {
    "q-not-tensor": ("q", {"q": [[1.0]]}),
    "q-dtype": ("q", {"q": torch.randn(2, 16, 4, 8).double()}),
    "k-dtype": ("k", {"k": torch.randn(2, 24, 2, 8).half()}),
    "v-dtype": ("v", {"v": torch.randn(2, 24, 2, 8).bfloat16()}),
    "k-device": ("k", {"k": torch.randn(2, 24, 2, 8, device="meta")}),
    "v-device": ("v", {"v": torch.randn(2, 24, 2, 8, device="meta")}),
    "q-rank": ("q", {"q": torch.randn(16, 4, 8)}),
    "q-empty-batch": ("q", {"q": torch.randn(0, 16, 4, 8), **{x: torch.randn(0, 24, 2, 8) for x in "kv"}}),
    "k-rank": ("k", {"k": torch.randn(2, 24, 2, 8, 1)}),
    "v-shape": ("v", {"v": torch.randn(2, 23, 2, 8)}),
    "k-batch": ("k", {"k": torch.randn(3, 24, 2, 8), "v": torch.randn(3, 24, 2, 8)}),
    "k-head-dim": ("k", {"k": torch.randn(2, 24, 2, 16), "v": torch.randn(2, 24, 2, 16)}),
    "k-heads-gqa": ("k", {"k": torch.randn(2, 24, 3, 8), "v": torch.randn(2, 24, 3, 8)}),
    "dropout": ("dropout_p", {"dropout_p": 0.1}),
    "alibi": ("alibi_slopes", {"alibi_slopes": torch.ones(4)}),
    "causal-not-bool": ("causal", {"causal": "yes"}),
    "deterministic-not-bool": ("deterministic", {"deterministic": 1}),
    "scale-nan": ("softmax_scale", {"softmax_scale": float("nan")}),
    "window-below-minus-one": ("window_size", {"window_size": (-2, 0)}),
    "window-length": ("window_size", {"window_size": (4,)}),
    "window-float": ("window_size", {"window_size": (4.0, 0)}),
    "softcap-negative": ("softcap", {"softcap": -1.0}),
    "global-negative": ("global_tokens", {"global_tokens": -1}),
    "dilation-zero": ("dilation", {"dilation": 0}),
    "block-size-zero": ("block_size", {"block_size": (0, 16)}),
    "layout-dtype": ("block_layout", {"block_layout": torch.ones(1, 1), "block_size": (16, 32)}),
    "layout-shape": ("block_layout", {"block_layout": torch.ones(2, 2, dtype=torch.bool), "block_size": (16, 32)}),
    "layout-heads": ("block_layout", {"block_layout": torch.ones(3, 1, 1, dtype=torch.bool), "block_size": (16, 32)}),
    "layout-batch": (
        "block_layout", {"block_layout": torch.ones(3, 4, 1, 1, dtype=torch.bool), "block_size": (16, 32)},
    ),
    "layout-device": (
        "block_layout", {"block_layout": torch.ones(1, 1, dtype=torch.bool, device="meta"), "block_size": (16, 32)},
    ),
    "backend-unknown": ("backend", {"backend": "flash"}),
}  # fmt: skip
TYPE_ERRORS = {"q-not-tensor", "causal-not-bool", "deterministic-not-bool", "cu-not-tensor"}


@pytest.mark.parametrize("case", list(BAD_BATCH))
def test_batch_validation(case, no_compute):
    name, overrides = BAD_BATCH[case]
    error = TypeError if case in TYPE_ERRORS else ValueError
    with pytest.raises(error, match=rf"^{name}: .*expected"):
        flash_attn_func(**_batch(**overrides))


BAD_VARLEN = {
    "q-rank": ("q", {"q": torch.randn(1, 16, 4, 8)}),
    "cu-not-tensor": ("cu_seqlens_q", {"cu_seqlens_q": [0, 5, 16]}),
    "cu-dtype": ("cu_seqlens_q", {"cu_seqlens_q": torch.tensor([0, 5, 16])}),
    "cu-rank": ("cu_seqlens_k", {"cu_seqlens_k": _i32(0, 5, 16)[None]}),
    "cu-too-short": ("cu_seqlens_k", {"cu_seqlens_k": _i32(0)}),
    "cu-device": ("cu_seqlens_q", {"cu_seqlens_q": _i32(0, 5, 16).to("meta")}),
    "cu-documents": ("cu_seqlens_k", {"cu_seqlens_k": _i32(0, 5, 10, 16)}),
    "cu-start": ("cu_seqlens_q", {"cu_seqlens_q": _i32(1, 5, 16)}),
    "cu-decreasing": ("cu_seqlens_k", {"cu_seqlens_k": _i32(0, 12, 11), "k": torch.randn(11, 2, 8),
                                       "v": torch.randn(11, 2, 8)}),
    "cu-last": ("cu_seqlens_q", {"cu_seqlens_q": _i32(0, 5, 15)}),
    "max-seqlen-short": ("max_seqlen_q", {"max_seqlen_q": 10}),
    "max-seqlen-negative": ("max_seqlen_k", {"max_seqlen_k": -1}),
    "max-seqlen-type": ("max_seqlen_k", {"max_seqlen_k": 11.0}),
    "block-table": ("block_table", {"block_table": torch.zeros(2, 1, dtype=torch.int32)}),
    "layout-documents": ("block_layout", {"block_layout": torch.ones(3, 4, 1, 1, dtype=torch.bool),
                                          "block_size": (16, 16)}),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BAD_VARLEN))
def test_varlen_validation(case, no_compute):
    name, overrides = BAD_VARLEN[case]
    error = TypeError if case in TYPE_ERRORS else ValueError
    with pytest.raises(error, match=rf"^{name}: .*expected"):
        flash_attn_varlen_func(**_varlen(**overrides))


def test_sdpa_refuses_what_it_cannot_do():
    with pytest.raises(ValueError, match=r"^return_attn_probs: "):
        flash_attn_func(**_batch(), return_attn_probs=True, backend="sdpa")
    with pytest.raises(ValueError, match=r"^softcap: "):
        flash_attn_func(**_batch(), softcap=5.0, backend="sdpa")


@pytest.fixture
def backend_spy(monkeypatch):
    """Replace every backend with a recorder of its name; start from no env variable and the default "auto"."""
    monkeypatch.delenv(BACKEND_ENV, raising=False)
    monkeypatch.setattr(api, "_default_backend", "auto")
    calls = []

    class Recorder:
        """The backend's own checks (so that auto chooses as it would), a record instead of its computation."""

        def __init__(self, name):
            self.real = backends.get(name)
            self.name, self.returns_lse = name, self.real.returns_lse

        def check(self, batch):
            self.real.check(batch)

        def attention(self, batch):
            calls.append(self.name)
            return torch.zeros_like(batch.q), None

    recorders = {name: Recorder(name) for name in backends.NAMES}
    monkeypatch.setattr(backends, "get", recorders.__getitem__)
    return calls


def test_backend_precedence(backend_spy, monkeypatch):
    batch = _batch()
    flash_attn_func(**batch)
    set_backend("sdpa")
    assert get_backend() == "sdpa"
    flash_attn_func(**batch)
    monkeypatch.setenv(BACKEND_ENV, "reference")
    flash_attn_func(**batch)
    flash_attn_func(**batch, backend="sdpa")
    flash_attn_varlen_func(**_varlen(), backend="sdpa")
    flash_attn_varlen_func(**_varlen())
    assert backend_spy == ["reference", "sdpa", "reference", "sdpa", "sdpa", "reference"]


def test_auto_backend_runs_reference(backend_spy, monkeypatch):
    monkeypatch.setenv(BACKEND_ENV, "auto")
    set_backend("sdpa")
    flash_attn_func(**_batch())
    flash_attn_func(**_batch(), backend="auto")
    assert backend_spy == ["reference", "reference"]


def test_auto_says_once_why_it_falls_back_to_the_reference(caplog, monkeypatch):
    monkeypatch.setattr(api, "_auto_reasons_logged", set())
    with caplog.at_level(logging.INFO, logger="legalpt.attention.api"):
        for _ in range(3):
            flash_attn_func(**_batch(), backend="auto")
    fallbacks = [r.getMessage() for r in caplog.records if "running the reference" in r.getMessage()]
    assert len(fallbacks) == 1 and "CUDA device" in fallbacks[0]


def test_unknown_backend_names(backend_spy, monkeypatch):
    expected = r"^set_backend: expected one of auto, reference, fa2, fa3, sdpa, flex, got 'fa9'"
    with pytest.raises(ValueError, match=expected):
        set_backend("fa9")
    assert get_backend() == "auto"
    monkeypatch.setenv(BACKEND_ENV, "fa9")
    with pytest.raises(ValueError, match=rf"^{BACKEND_ENV}: expected one of auto, reference, fa2, fa3, sdpa, flex"):
        flash_attn_func(**_batch())
    assert backend_spy == []


def test_deterministic_backward_is_bitwise_repeatable():
    lens = torch.tensor([0, 70, 71, 200], dtype=torch.int32)
    q, k, v = (torch.randn(200, 4, 16, requires_grad=True) for _ in range(3))
    grads = []
    for _ in range(2):
        out = flash_attn_varlen_func(
            q, k, v, lens, lens, 129, 129, causal=True, deterministic=True, block_size=(16, 16)
        )
        grads.append(torch.autograd.grad(out.square().sum(), (q, k, v)))
    assert all(torch.equal(a, b) for a, b in zip(*grads, strict=True))


def test_import_loads_no_cuda_code():
    code = (
        "import sys, torch, legalpt.attention; "
        "assert not torch.cuda.is_initialized(); "
        "assert 'torch.utils.cpp_extension' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_cu_seqlens_values_are_read_once_per_tensor_and_version(monkeypatch):
    """The layers of a model share one cu_seqlens pair per step: its values (a host sync on a GPU) are checked on
    the first call only, and again once the tensor changes in place, where a bad value is still caught."""
    reads, documents = [], api.Documents

    class Counted:  # api's Documents, counting the reads (the reference backend reads the values for its own plan)
        @staticmethod
        def from_cu_seqlens(*args):
            reads.append(1)
            return documents.from_cu_seqlens(*args)

    monkeypatch.setattr(api, "Documents", Counted)
    batch = _varlen()
    for _ in range(3):
        flash_attn_varlen_func(**batch, backend="reference")
    assert len(reads) == 1
    batch["cu_seqlens_k"] = batch["cu_seqlens_k"].clone()  # another tensor: read again
    flash_attn_varlen_func(**batch, backend="reference")
    assert len(reads) == 2
    batch["cu_seqlens_k"][1] = 17  # in place: its version moves on, and 17 is past the 16 tokens
    with pytest.raises(ValueError, match=r"^cu_seqlens_k: expected non-decreasing values"):
        flash_attn_varlen_func(**batch, backend="reference")
