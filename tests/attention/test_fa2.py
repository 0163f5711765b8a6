"""The fa2 CUDA backend (issue 3) against independent references: naive float64 attention by flash-attn's accuracy
rule, and FlexAttention for the sliding-window, global and dilated masks.

Accuracy: error vs float64 at most 2x (3x for dq, dk, dv) that of plain PyTorch in the same low precision, plus a
small atol; the logsumexp, which fa2 returns in float32, against plain PyTorch in float32. Every run starts from a
CUDA caching allocator whose free memory is NaN, so an output element the kernels never write cannot pass as zero.

Dry run without a GPU, to test the tests on the reference backend, from the repository root (QUICK=1 shrinks the
long sequences, 1023 and 2048, to a few blocks; by default they are the full list):
    export LEGALPT_FA2_TEST_BACKEND=reference LEGALPT_FA2_TEST_DEVICE=cpu LEGALPT_FA2_TEST_QUICK=1
    pytest tests/attention/test_fa2.py
With LEGALPT_FA2_TEST_BACKEND=fa2-emulated the fa2 kernels themselves run, compiled for the CPU
(csrc/common/emulate.h): their logic without a GPU, slowly (pick cases with -k), and without races or timing.
With LEGALPT_FA2_TEST_BACKEND=fa3 the whole file tests the fa3 backend on a Hopper GPU (its forward on wgmma at head
dims 64 and 128; test_fa3.py runs a share of these cases on fa3 in every GPU run).
"""

from __future__ import annotations

import itertools
import os
import random
from dataclasses import dataclass

import pytest
import torch
from attention_helpers import (
    assert_documents_stay_apart,
    assert_flash_attn_rule,
    naive_attention,
    rising_scores,
    use_emulated_kernels,
)
from torch import Tensor
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
from torch.utils._python_dispatch import TorchDispatchMode

from legalpt.attention import (
    BACKEND_ENV,
    flash_attn_func,
    flash_attn_varlen_func,
    get_backend,
    kernels,
    set_backend,
)
from legalpt.attention.backends import AttentionBatch, cuda
from legalpt.attention.masks import MaskSpec

MODE = os.environ.get("LEGALPT_FA2_TEST_BACKEND", "fa2")  # fa2 | fa3 | fa2-emulated | reference
EMULATED = MODE == "fa2-emulated"
BACKEND = "fa2" if EMULATED else MODE
DEVICE = torch.device(os.environ.get("LEGALPT_FA2_TEST_DEVICE", "cpu" if EMULATED else "cuda"))
QUICK = os.environ.get("LEGALPT_FA2_TEST_QUICK", "") == "1"


def _unmarked(test):
    """The test as it is: a dry run on the reference backend needs no GPU."""
    return test


# Per test rather than a module-wide pytestmark, since test_fa2_refuses_cpu_tensors must run without a GPU.
gpu = pytest.mark.cuda if MODE in ("fa2", "fa3") else _unmarked
only_fa2 = pytest.mark.skipif(MODE != "fa2", reason="fa2's own limits on a GPU; this backend accepts this input")

DTYPES = (torch.bfloat16, torch.float16)
DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16"}
# Native head dims, then two that fa2 zero-pads to the next native one: 80 (a multiple of 8) and 36 (not).
HEAD_DIMS = (32, 64, 96, 128, 192, 256, 80, 36)
HEADS = ((4, 4), (6, 2), (6, 1))  # (query heads, key/value heads): MHA, GQA, MQA
LONG = ((255, 255), (300, 300)) if QUICK else ((1023, 1023), (2048, 2048))
SHORT = ((1, 1), (113, 113), (256, 256), (113, 203), (1, 239), (203, 113))
SEQLENS = (SHORT[1], LONG[0], SHORT[4], SHORT[5], SHORT[2], LONG[1], SHORT[3], SHORT[0])  # each half holds a long one
SOFTCAP, SOFTCAP_SCALE = 30.0, 0.5  # a scale of 0.5 makes scores large enough for the cap to bend them
POISON_BYTES = 256 << 20

# Mask keyword arguments of the public functions; "block_layout" names a kind of random layout, built per test.
MASKS: dict[str, dict] = {
    "none": {},
    "causal": {"causal": True},
    "window": {"window_size": (64, 0)},
    "window-both": {"window_size": (32, 17)},
    "causal-window": {"causal": True, "window_size": (64, 0)},
    "global-window": {"window_size": (32, 17), "global_tokens": 8},
    "causal-global-window": {"causal": True, "window_size": (64, 0), "global_tokens": 5},
    "dilation2-window": {"window_size": (64, 64), "dilation": 2},
    "causal-dilation3-window": {"causal": True, "window_size": (96, 0), "dilation": 3},
    "global-dilation3-window": {"window_size": (48, 48), "dilation": 3, "global_tokens": 4},
    "layout": {"block_layout": "heads"},
    "causal-layout": {"causal": True, "block_layout": "batch-heads"},
    "window-layout-64": {"window_size": (200, 50), "block_layout": "shared", "block_size": (64, 64)},
    "layout-empty-rows": {"window_size": (100, 100), "block_layout": "empty-rows"},
    "layout-odd-blocks": {"causal": True, "block_layout": "heads", "block_size": (48, 80)},
    "everything": {
        "causal": True, "window_size": (100, 0), "global_tokens": 6, "dilation": 2,
        "block_layout": "heads", "block_size": (64, 128),
    },
}  # fmt: skip


@dataclass(frozen=True)
class Case:
    """One batch attention call: (2, Sq, H, D) queries against (2, Sk, Hk, D) keys and values."""

    mask: str
    dtype: torch.dtype
    head_dim: int
    seqlens: tuple[int, int]
    heads: tuple[int, int] = (4, 4)
    softcap: float = 0.0
    strided: bool = False  # q, k, v as (B, H, S, D) tensors seen through a transpose, as transformers passes them
    deterministic: bool = False  # fa2's atomic-free dQ pass instead of the atomics

    def __str__(self) -> str:
        extras = "-softcap" * (self.softcap > 0) + "-strided" * self.strided + "-deterministic" * self.deterministic
        sq, sk = self.seqlens
        h, hk = self.heads
        return f"{self.mask}-{DTYPE_NAMES[self.dtype]}-d{self.head_dim}-{sq}x{sk}-h{h}k{hk}{extras}"


def _cases() -> list[Case]:
    cases = []
    # Every head dim, dense and causal, both dtypes (causal fp16 deterministic); lengths and heads in rotation.
    for n, (dim, mask, dtype) in enumerate(itertools.product(HEAD_DIMS, ("none", "causal"), DTYPES)):
        cases.append(Case(mask, dtype, dim, SEQLENS[n % len(SEQLENS)], HEADS[n % len(HEADS)], deterministic=n % 4 == 3))
    for m, mask in enumerate(MASKS):
        # Every mask at two head dims, both dtypes, long sequences.
        for n, (dim, dtype) in enumerate(itertools.product((64, 128), DTYPES)):
            heads = HEADS[(m + n) % len(HEADS)]
            cases.append(Case(mask, dtype, dim, LONG[n % 2], heads, strided=n == 2, deterministic=n == 1))
        # Every mask at odd, unequal and one-token lengths.
        for n, seqlens in enumerate(SHORT):
            cases.append(Case(mask, DTYPES[n % 2], 64, seqlens, HEADS[(m + n) % len(HEADS)]))
    cases += [
        Case("causal", torch.bfloat16, 64, LONG[0], (6, 2), softcap=SOFTCAP),
        Case("global-window", torch.float16, 128, (113, 203), (4, 4), softcap=SOFTCAP),
        Case("layout", torch.bfloat16, 128, LONG[1], (6, 1), softcap=SOFTCAP),
        Case("none", torch.float16, 256, (1, 239), (4, 4), softcap=SOFTCAP),
    ]
    return cases


@pytest.fixture(autouse=True)
def _emulated_kernels(monkeypatch) -> None:
    """fa2-emulated: the fa2 backend runs its kernels' CPU build; of its checks only those of the inputs apply."""
    if EMULATED:
        use_emulated_kernels(monkeypatch)


@pytest.fixture(autouse=True)
def _seeded(rng: random.Random) -> None:
    """Fresh random inputs in every test, from the printed seed of tests/conftest.py."""


def _poison() -> None:
    """Fill the free memory of the CUDA caching allocator with all-ones bytes (NaN in bf16, fp16 and fp32), in its
    large pool and in its small pool (blocks up to 1 MiB), so outputs allocated next start as NaN."""
    if DEVICE.type != "cuda":
        return
    torch.cuda.empty_cache()
    large = torch.full((POISON_BYTES,), 0xFF, dtype=torch.uint8, device=DEVICE)
    small = [torch.full((256 << 10,), 0xFF, dtype=torch.uint8, device=DEVICE) for _ in range(64)]
    del large, small


def _qkv(q_shape: tuple, kv_shape: tuple, dtype: torch.dtype, strided: bool = False, grad: bool = True):
    """q, k, v of shapes (..., S, H, D) on DEVICE; strided: views of (..., H, S, D) tensors."""

    def make(shape: tuple) -> Tensor:
        if not strided:
            return torch.randn(shape, dtype=dtype, device=DEVICE)
        swapped = (*shape[:-3], shape[-2], shape[-3], shape[-1])
        return torch.randn(swapped, dtype=dtype, device=DEVICE).transpose(-3, -2)

    return tuple(make(shape).requires_grad_(grad) for shape in (q_shape, kv_shape, kv_shape))


def _layout(kind: str, batch: int, heads: int, seqlens: tuple[int, int], block_size: tuple[int, int]) -> Tensor:
    """A random block layout; batch is the number of documents for varlen."""
    blocks = (-(-seqlens[0] // block_size[0]), -(-seqlens[1] // block_size[1]))
    shape = {"shared": blocks, "heads": (heads, *blocks)}.get(kind, (batch, heads, *blocks))
    layout = torch.rand(shape, device=DEVICE) < 0.6
    if kind == "empty-rows":
        layout[..., 0, :] = False  # the first query block sees no key
        layout[:, 0] = False  # head 0 sees nothing at all
    return layout


def _mask_kwargs(mask: str, batch: int, heads: int, seqlens: tuple[int, int]) -> dict:
    kw = dict(MASKS[mask])
    if "block_layout" in kw:
        kw.setdefault("block_size", (128, 128))
        kw["block_layout"] = _layout(kw["block_layout"], batch, heads, seqlens, kw["block_size"])
    return kw


def _naive_kwargs(kw: dict, cu: tuple | None = None) -> dict:
    """Public keyword arguments (and varlen's cu_seqlens) -> naive_attention's."""
    naive = {("window" if key == "window_size" else key): value for key, value in kw.items() if key != "deterministic"}
    if cu is not None:
        naive.update(cu_seqlens_q=cu[0], cu_seqlens_k=cu[1])
    return naive


def _built(head_dim: int) -> int:
    """The built head dim that `head_dim` runs as on a GPU (zero-padded up to it); skips the test where this install
    built none that large (LEGALPT_HEAD_DIMS narrows the build: README, docs/kernels.md)."""
    built = kernels.extension().head_dims
    padded = kernels.padded_head_dim(head_dim, built)
    if padded is None:
        pytest.skip(f"head dim {head_dim}: this install built head dims {built} (LEGALPT_HEAD_DIMS)")
    return padded


def _run(q: Tensor, k: Tensor, v: Tensor, kw: dict, cu: tuple | None = None) -> tuple[Tensor, Tensor]:
    """(out, lse) of the backend under test, on poisoned memory; cu = (cu_q, cu_k, max_q, max_k) for varlen."""
    if MODE in ("fa2", "fa3"):
        _built(q.shape[-1])
    _poison()
    if cu is None:
        out, lse, _ = flash_attn_func(q, k, v, return_attn_probs=True, backend=BACKEND, **kw)
    else:
        out, lse, _ = flash_attn_varlen_func(q, k, v, *cu, return_attn_probs=True, backend=BACKEND, **kw)
    return out, lse


def _check(q: Tensor, k: Tensor, v: Tensor, kw: dict, cu: tuple | None = None, lse_grad: bool = False) -> Tensor:
    """Hold out, lse, dq, dk, dv of the backend under test to flash-attn's rule; rows that see no key must give
    out 0, lse -inf and dq 0 exactly. Returns those rows: bool (B, Sq, H) or (total_q, H).

    The loss is <out, g> (+ <lse, g_lse> with lse_grad, over the rows that see a key).
    """
    out, lse = _run(q, k, v, kw, cu)
    naive = _naive_kwargs(kw, cu)
    exact_out, exact_lse = naive_attention(q, k, v, **naive)
    plain_out, plain_lse = naive_attention(q, k, v, dtype=q.dtype, **naive)
    with torch.no_grad():
        _, f32_lse = naive_attention(q, k, v, dtype=torch.float32, **naive)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert lse.shape == exact_lse.shape and lse.dtype == torch.float32
    seen = torch.isfinite(exact_lse)
    assert torch.equal(torch.isneginf(lse), ~seen), "lse must be -inf exactly on the rows that see no key"
    unseen = (~seen).transpose(-1, -2)  # lse (B, H, Sq) or (H, total_q) -> rows of out
    assert torch.isfinite(out).all(), "out has NaN or inf"
    assert (out[unseen] == 0).all(), "rows that see no key must be 0"
    assert_flash_attn_rule("out", out, exact_out, plain_out, ratio=2, atol=1e-5)
    assert_flash_attn_rule("lse", lse[seen], exact_lse[seen], f32_lse[seen], ratio=2, atol=1e-4)

    g = torch.randn_like(exact_out)
    outputs = ((out, lse), (exact_out, exact_lse), (plain_out, plain_lse))
    losses = [(o.double() * g).sum() for o, _ in outputs]
    if lse_grad:
        g_lse = torch.randn_like(exact_lse)
        lses = (m.double().where(seen, 0.0) for _, m in outputs)  # rows that see no key: -inf would make the loss -inf
        losses = [loss + (m * g_lse).sum() for loss, m in zip(losses, lses, strict=True)]
    _poison()
    grads = torch.autograd.grad(losses[0], (q, k, v))
    exact_grads = torch.autograd.grad(losses[1], (q, k, v))
    plain_grads = torch.autograd.grad(losses[2], (q, k, v))
    for name, grad, exact, plain in zip("qkv", grads, exact_grads, plain_grads, strict=True):
        assert grad.shape == exact.shape and grad.dtype == q.dtype
        assert torch.isfinite(grad).all(), f"d{name} has NaN or inf"
        assert_flash_attn_rule(f"d{name}", grad, exact, plain, ratio=3, atol=3e-5)
    assert (grads[0][unseen] == 0).all(), "dq of rows that see no key must be 0"
    return unseen


def _check_case(case: Case, lse_grad: bool = False) -> Tensor:
    (sq, sk), (heads, kv_heads), dim = case.seqlens, case.heads, case.head_dim
    q, k, v = _qkv((2, sq, heads, dim), (2, sk, kv_heads, dim), case.dtype, case.strided)
    kw = _mask_kwargs(case.mask, 2, heads, case.seqlens)
    kw["deterministic"] = case.deterministic
    if case.softcap > 0:
        kw.update(softcap=case.softcap, softmax_scale=SOFTCAP_SCALE)
    return _check(q, k, v, kw, lse_grad=lse_grad)


@gpu
@pytest.mark.parametrize("case", _cases(), ids=str)
def test_matches_naive(case: Case):
    _check_case(case)


NO_KEY_CASES = [
    Case("causal", torch.bfloat16, 64, (300, 113), (6, 2)),  # causal, Sq > Sk: the first 187 rows
    Case("window-both", torch.float16, 128, (400, 150), (4, 4)),  # a window ending before the first key
    Case("layout-empty-rows", torch.bfloat16, 128, LONG[0], (6, 1)),
    Case("layout-empty-rows", torch.float16, 64, (113, 203), (6, 2), softcap=SOFTCAP),
]


@gpu
@pytest.mark.parametrize("case", NO_KEY_CASES, ids=str)
def test_rows_that_see_no_key(case: Case):
    assert _check_case(case).any(), "the case must hold rows that see no key"


@gpu
@pytest.mark.parametrize(
    "case",
    [
        Case("causal-global-window", torch.bfloat16, 64, LONG[0], (6, 2)),
        Case("layout-empty-rows", torch.float16, 128, (203, 113), (4, 4)),
        Case("everything", torch.bfloat16, 96, (113, 203), (6, 1), softcap=SOFTCAP),
    ],
    ids=str,
)
def test_logsumexp_gradient(case: Case):
    """Gradients flowing in through the logsumexp as well as the output."""
    _check_case(case, lse_grad=True)


def _cu(lens: list[int]) -> Tensor:
    return torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32, device=DEVICE)


def _documents(rng: random.Random) -> tuple[list[int], list[int]]:
    """Random document lengths (queries, keys), plus one of one token, one without keys, one without queries,
    one with more keys than queries and one with fewer."""
    top = 300 if QUICK else 900
    pairs = [(n, n) for n in (rng.randint(2, top) for _ in range(rng.randint(3, 6)))]
    pairs += [(1, 1), (37, 0), (0, 23), (rng.randint(1, 200), rng.randint(200, top)), (180, 60)]
    rng.shuffle(pairs)
    return [q for q, _ in pairs], [k for _, k in pairs]


VARLEN_MASKS = ["none", "causal", "window-both", "causal-global-window", "causal-dilation3-window", "causal-layout"]


@gpu
@pytest.mark.parametrize(
    ("dtype", "head_dim", "heads", "deterministic"),
    [(torch.bfloat16, 64, (6, 2), False), (torch.float16, 128, (4, 1), True)],
    ids=["bf16-d64-h6k2", "fp16-d128-h4k1-deterministic"],
)
@pytest.mark.parametrize("mask", [*VARLEN_MASKS, "everything"])
def test_varlen_matches_naive(mask: str, dtype: torch.dtype, head_dim: int, heads: tuple, deterministic: bool, rng):
    lens_q, lens_k = _documents(rng)
    cu = (_cu(lens_q), _cu(lens_k), max(lens_q), max(lens_k) + 7)  # max_seqlen may exceed the longest document
    q, k, v = _qkv((sum(lens_q), heads[0], head_dim), (sum(lens_k), heads[1], head_dim), dtype)
    kw = {**_mask_kwargs(mask, len(lens_q), heads[0], cu[2:]), "deterministic": deterministic}
    assert _check(q, k, v, kw, cu).any(), "the document without keys must hold rows that see no key"


@gpu
@pytest.mark.parametrize("head_dim", [64, 128])
def test_varlen_documents_stay_apart(head_dim: int):
    assert_documents_stay_apart(BACKEND, head_dim, DEVICE)


SPLIT_CASES = [
    Case("causal-global-window", torch.bfloat16, 64, LONG[0], (6, 2)),
    Case("global-window", torch.float16, 128, (300, 203), (4, 4)),
    Case("global-dilation3-window", torch.bfloat16, 96, LONG[1], (6, 1)),
    Case("everything", torch.float16, 256, (300, 300), (4, 4), softcap=SOFTCAP),
]


@gpu
@pytest.mark.parametrize("case", SPLIT_CASES, ids=str)
def test_split_global_key_tiles(case: Case, monkeypatch):
    """The backward with the global keys' tiles split over blocks of one query tile each (cuda._split; at the default
    SPLIT_VISITS a split starts past 2048 query rows at d128), their dK and dV added in float32 from the parts."""
    monkeypatch.setattr(cuda, "SPLIT_VISITS", 1)
    if MODE != "reference":  # the dry run builds no kernels, and has no split
        padded = _built(case.head_dim)  # a head dim runs padded up to a built one, as the backend pads it
        _, tile = kernels.extension().tiles(padded, BACKEND == "fa3")
        mask = MaskSpec(global_tokens=MASKS[case.mask]["global_tokens"])
        none = torch.empty(0)
        batch = AttentionBatch(none, none, none, None, None, *case.seqlens, mask, 1.0, deterministic=case.deterministic)
        assert cuda._split(batch, tile, padded)[1] > 1
    _check_case(case)


@gpu
def test_split_global_key_tiles_varlen(monkeypatch, rng):
    monkeypatch.setattr(cuda, "SPLIT_VISITS", 1)
    lens_q, lens_k = _documents(rng)
    cu = (_cu(lens_q), _cu(lens_k), max(lens_q), max(lens_k))
    q, k, v = _qkv((sum(lens_q), 4, 128), (sum(lens_k), 1, 128), torch.bfloat16)
    _check(q, k, v, _mask_kwargs("causal-global-window", len(lens_q), 4, cu[2:]), cu)


@gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_NAMES.get)
@pytest.mark.parametrize("head_dim", HEAD_DIMS[:6])
@pytest.mark.parametrize(
    ("mask", "seqlens"), [("causal", LONG[0]), ("none", (113, LONG[1][1]))], ids=["causal", "dense-unequal"]
)
def test_rescale_when_the_max_moves(head_dim: int, mask: str, seqlens: tuple, dtype: torch.dtype):
    """Scores that rise along the keys in some rows: the forward's rescale (O and the row sum, skipped while no row
    of a warp moves its max) runs in every late key tile with large corrections, which random scores never
    exercise, and the warp's vote must count the lanes whose rows move (float16 overflows where it does not)."""
    (sq, sk), shapes = seqlens, ((2, seqlens[0], 4, head_dim), (2, seqlens[1], 2, head_dim))
    q, k, v = _qkv(*shapes, dtype, grad=False)
    with torch.no_grad():
        rising_scores(q, k)
    _check(q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), _mask_kwargs(mask, 2, 4, (sq, sk)))


@gpu
@pytest.mark.parametrize("head_dim", HEAD_DIMS[:6])
@pytest.mark.parametrize("scale", [-0.125, 0.0])
def test_softmax_scale_of_any_sign(head_dim: int, scale: float):
    """A scale <= 0 turns the scores' max into a min: the forward takes them to logits before the max."""
    q, k, v = _qkv((2, 113, 4, head_dim), (2, 203, 2, head_dim), torch.bfloat16)
    _check(q, k, v, {"causal": True, "window_size": (64, 0), "softmax_scale": scale})
    _check(q, k, v, {"window_size": (64, 0), "dilation": 2, "softmax_scale": scale})  # the general kernel


@gpu
def test_deterministic_backward_is_bitwise_repeatable():
    """deterministic=True: 20 backward passes give the same bits (dq is where atomics could reorder sums)."""
    seqlen = LONG[0][0]
    q, k, v = _qkv((2, seqlen, 8, 128), (2, seqlen, 2, 128), torch.bfloat16)
    out = flash_attn_func(q, k, v, causal=True, deterministic=True, backend=BACKEND)
    g = torch.randn_like(out)
    first = torch.autograd.grad(out, (q, k, v), g, retain_graph=True)
    for _ in range(19):
        _poison()
        again = torch.autograd.grad(out, (q, k, v), g, retain_graph=True)
        for name, a, b in zip("qkv", first, again, strict=True):
            assert torch.equal(a, b), f"d{name} differs between runs"


# (varlen, head_dim) of the custom-op tests: 80 is padded inside fa2, so its outputs are made from wider buffers
OP_VARIANTS = [(False, 64), (True, 80)]
OP_IDS = ["batch-d64", "varlen-d80"]


def _op_inputs(varlen: bool, head_dim: int) -> tuple:
    """The public function and its positional arguments: GQA, one-token and unequal documents or Sq != Sk."""
    if varlen:
        cu = _cu([200, 1, 310])
        q, k, v = _qkv((511, 6, head_dim), (511, 2, head_dim), torch.bfloat16)
        return flash_attn_varlen_func, (q, k, v, cu, cu, 310, 310)
    q, k, v = _qkv((2, 203, 6, head_dim), (2, 250, 2, head_dim), torch.bfloat16)
    return flash_attn_func, (q, k, v)


@gpu
@pytest.mark.parametrize(("varlen", "head_dim"), OP_VARIANTS, ids=OP_IDS)
def test_compile_fullgraph_matches_eager(varlen: bool, head_dim: int):
    """One opaque custom op under torch.compile(fullgraph=True): forward and backward bitwise equal to eager."""
    fn, args = _op_inputs(varlen, head_dim)
    kw = {"causal": True, "window_size": (64, 0), "global_tokens": 4, "deterministic": True}

    def loss(*args):
        out, lse, _ = fn(*args, return_attn_probs=True, backend=BACKEND, **kw)
        return out, lse, (out.float() * out.detach().float()).sum() + lse.sum()

    torch._dynamo.reset()
    results = []
    for run in (loss, torch.compile(loss, fullgraph=True)):
        out, lse, total = run(*args)
        results.append((out, lse, *torch.autograd.grad(total, args[:3])))
    for name, eager, compiled in zip(("out", "lse", "dq", "dk", "dv"), *results, strict=True):
        assert torch.equal(eager, compiled), f"{name}: compiled differs from eager"


def _op_args(varlen: bool, head_dim: int) -> tuple:
    """attention_forward arguments: GQA, softcap, causal window, global tokens, dilation, a per-head layout."""
    _, (q, k, v, *seq) = _op_inputs(varlen, head_dim)
    seq = seq or [None, None, q.shape[1], k.shape[1]]
    layout = _layout("heads", 1, q.shape[-2], tuple(seq[2:]), (64, 64))
    # softmax_scale, softcap, mask [causal, left, right, global_tokens, dilation, block_q, block_k], layout,
    # deterministic, backend
    options = (0.3, 3.0, [1, 100, 0, 4, 2, 64, 64], layout, True, BACKEND)
    return (q, k, v, *seq, *options)


@gpu
@pytest.mark.parametrize(("varlen", "head_dim"), OP_VARIANTS, ids=OP_IDS)
def test_opcheck(varlen: bool, head_dim: int):
    """Schema, fake tensors (shapes and strides of real outputs), autograd registration, AOT dispatch."""
    args = _op_args(varlen, head_dim)
    torch.library.opcheck(torch.ops.legalpt.attention_forward.default, args)
    out, lse = torch.ops.legalpt.attention_forward(*args)
    q, k, v = (x.detach() for x in args[:3])
    backward_args = (torch.randn_like(out), out.detach(), lse.detach(), torch.randn_like(lse), q, k, v, *args[3:])
    torch.library.opcheck(torch.ops.legalpt.attention_backward.default, backward_args)


def _flex_mask_mod(
    causal: bool = False, window_size: tuple[int, int] = (-1, -1), global_tokens: int = 0, dilation: int = 1
):
    """The element rule of DESIGN.md for one document with Sq == Sk, as a FlexAttention mask_mod."""
    left, right = window_size

    def mask_mod(b, h, q_idx, kv_idx):
        distance = q_idx - kv_idx
        visible = distance % dilation == 0
        if left >= 0:
            visible = visible & (distance <= left)
        if right >= 0:
            visible = visible & (distance >= -right)
        if global_tokens > 0:
            visible = visible | (q_idx < global_tokens) | (kv_idx < global_tokens)
        if causal:
            visible = visible & (distance >= 0)
        return visible

    return mask_mod


# (seqlen, head_dim, mask keyword arguments)
FLEX_CASES = {
    "causal-sliding-window": (LONG[1][0], 128, {"causal": True, "window_size": (256, 0)}),
    "global-window": (LONG[0][0] + 1, 64, {"window_size": (128, 64), "global_tokens": 64}),
    "causal-dilated-window": (LONG[0][0] + 1, 128, {"causal": True, "window_size": (384, 0), "dilation": 2}),
}


@gpu
@pytest.mark.parametrize("case", list(FLEX_CASES))
def test_flex_attention_agrees(case: str):
    """FlexAttention, compiled, as a second reference: it must itself pass flash-attn's rule against float64 (so the
    mask_mod is right), and fa2's error must be within 2x of its error. Both compute in bf16 with float32
    accumulation, so their errors are both about one bf16 rounding of the output, which makes 2x a robust bound."""
    seqlen, head_dim, kw = FLEX_CASES[case]
    q, k, v = _qkv((2, seqlen, 8, head_dim), (2, seqlen, 2, head_dim), torch.bfloat16, grad=False)
    out, _ = _run(q, k, v, kw)
    block_mask = create_block_mask(_flex_mask_mod(**kw), None, None, seqlen, seqlen, device=DEVICE)
    flex = torch.compile(flex_attention, dynamic=False)  # static shapes: one compile per case, never a dynamic one
    flex_out = flex(*(x.transpose(1, 2) for x in (q, k, v)), block_mask=block_mask, enable_gqa=True).transpose(1, 2)
    exact, _ = naive_attention(q, k, v, **_naive_kwargs(kw))
    plain, _ = naive_attention(q, k, v, dtype=torch.bfloat16, **_naive_kwargs(kw))
    assert_flash_attn_rule("flex out", flex_out, exact, plain, ratio=2, atol=1e-5)
    assert_flash_attn_rule("out vs flex", out, exact, flex_out, ratio=2, atol=1e-5)


class _OpBackends(TorchDispatchMode):
    """Records the backend argument of every legalpt::attention_forward call."""

    def __init__(self):
        super().__init__()
        self.backends: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.legalpt.attention_forward.default:
            self.backends.append(kwargs.get("backend", args[-1]))
        return func(*args, **kwargs)


@pytest.fixture
def auto_backend(monkeypatch):
    """The process default set to "auto" (and the environment variable unset) for one test."""
    monkeypatch.delenv(BACKEND_ENV, raising=False)
    previous = get_backend()
    set_backend("auto")
    yield
    set_backend(previous)


@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "fp16", "fp32"])
def test_auto_picks_our_kernels_for_half_precision(dtype: torch.dtype, auto_backend):
    q, k, v = _qkv((2, 64, 4, 64), (2, 64, 2, 64), dtype, grad=False)
    with _OpBackends() as calls:
        flash_attn_func(q, k, v, causal=True)
        flash_attn_varlen_func(q[0], k[0], v[0], _cu([20, 44]), _cu([20, 44]), 44, 44)
    hopper = DEVICE.type == "cuda" and torch.cuda.get_device_capability(DEVICE) == (9, 0)
    hopper = hopper and kernels.extension().has_sm90
    expected = ("fa3" if hopper else "fa2") if BACKEND in ("fa2", "fa3") and dtype in DTYPES else "reference"
    assert calls.backends == [expected, expected]


def _small_call(varlen: bool, device: torch.device | str, dtype: torch.dtype, head_dim: int) -> None:
    if varlen:
        q, k, v = (torch.randn(20, h, head_dim, dtype=dtype, device=device) for h in (4, 2, 2))
        cu = torch.tensor([0, 7, 20], dtype=torch.int32, device=device)
        flash_attn_varlen_func(q, k, v, cu, cu, 13, 13, backend="fa2")
    else:
        q, k, v = (torch.randn(2, 16, h, head_dim, dtype=dtype, device=device) for h in (4, 2, 2))
        flash_attn_func(q, k, v, backend="fa2")


@pytest.mark.parametrize("varlen", [False, True], ids=["batch", "varlen"])
def test_fa2_refuses_cpu_tensors(varlen: bool):
    """Runs on any machine, with or without a GPU: fa2 says that it needs CUDA tensors."""
    with pytest.raises(ValueError, match="fa2") as error:
        _small_call(varlen, "cpu", torch.bfloat16, 64)
    assert "CUDA" in str(error.value)


@gpu
@only_fa2
@pytest.mark.parametrize("varlen", [False, True], ids=["batch", "varlen"])
def test_fa2_refuses_float32(varlen: bool):
    with pytest.raises(ValueError, match="fa2") as error:
        _small_call(varlen, DEVICE, torch.float32, 64)
    assert "bfloat16" in str(error.value)


@gpu
@only_fa2
@pytest.mark.parametrize("varlen", [False, True], ids=["batch", "varlen"])
def test_fa2_refuses_head_dim_over_256(varlen: bool):
    with pytest.raises(ValueError, match="head_dim"):
        _small_call(varlen, DEVICE, torch.bfloat16, 264)
