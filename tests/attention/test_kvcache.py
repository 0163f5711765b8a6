"""flash_attn_with_kvcache against the float64 oracle: flash-attn 2.x's signature, the in-place append, every mask
option, cache rows, left padding, rows that see no key, and bad input refused before any compute."""

from __future__ import annotations

import inspect

import pytest
import torch
from attention_helpers import naive_attention, use_emulated_kernels

from legalpt.attention import backends, flash_attn_with_kvcache, kernels
from legalpt.attention.backends import cuda

FLASH_ATTN_WITH_KVCACHE = {
    "q": inspect.Parameter.empty, "k_cache": inspect.Parameter.empty, "v_cache": inspect.Parameter.empty,
    "k": None, "v": None, "rotary_cos": None, "rotary_sin": None, "cache_seqlens": None, "cache_batch_idx": None,
    "cache_leftpad": None, "block_table": None, "softmax_scale": None, "causal": False, "window_size": (-1, -1),
    "softcap": 0.0, "rotary_interleaved": True, "alibi_slopes": None, "num_splits": 0, "return_softmax_lse": False,
}  # fmt: skip
BATCH, CACHE_ROWS, SEQLEN_CACHE, HEADS, KV_HEADS, HEAD_DIM = 3, 5, 113, 6, 2, 16
FORWARD = type(backends.get("reference")).forward  # the reference backend's, before any test wraps it


def test_signature_is_flash_attn_2_plus_keyword_backend():
    params = list(inspect.signature(flash_attn_with_kvcache).parameters.values())
    assert [p.name for p in params[:-1]] == list(FLASH_ATTN_WITH_KVCACHE)
    assert {p.name: p.default for p in params[:-1]} == FLASH_ATTN_WITH_KVCACHE
    assert params[-1].name == "backend" and params[-1].default is None
    assert params[-1].kind is inspect.Parameter.KEYWORD_ONLY


def make_inputs(
    seqlen_q: int,
    new: int,
    rows: str,
    heads=HEADS,
    kv_heads=KV_HEADS,
    dtype=torch.float32,
    device="cpu",
    head_dim=HEAD_DIM,
    head_major=False,
) -> dict:
    """Random q, caches and new keys; slots the call must not read hold NaN (so a stray read shows), and so do the
    slots the new keys go to (so a missed write shows). Entry 0 holds no cached key. `head_major`: the caches are
    (rows, kv heads, slots, head dim) in memory, as transformers keeps them, seen as flash-attn's layout."""
    cache_rows = CACHE_ROWS if rows.endswith("idx") else BATCH
    seqlens = torch.randint(0, SEQLEN_CACHE - new + 1, (BATCH,), dtype=torch.int32)
    seqlens[0] = 0
    leftpad = (torch.rand(BATCH) * (seqlens + 1)).int().clamp(max=seqlens) if rows == "leftpad" else None
    batch_idx = None
    if rows == "batch_idx":  # any order
        batch_idx = torch.randperm(CACHE_ROWS)[:BATCH].int()
    if rows == "increasing_idx":  # rows in order, one left out: read where they lie
        batch_idx = torch.randperm(CACHE_ROWS)[:BATCH].sort().values.int()
    k_cache, v_cache = (torch.randn(cache_rows, SEQLEN_CACHE, kv_heads, head_dim, dtype=dtype) for _ in range(2))
    if head_major:
        k_cache, v_cache = (c.transpose(1, 2).contiguous().transpose(1, 2) for c in (k_cache, v_cache))
    for b in range(BATCH):
        row = b if batch_idx is None else int(batch_idx[b])
        first = 0 if leftpad is None else int(leftpad[b])
        for cache in (k_cache, v_cache):
            cache[row, :first] = float("nan")
            cache[row, int(seqlens[b]) :] = float("nan")
    args = {
        "q": torch.randn(BATCH, seqlen_q, heads, head_dim, dtype=dtype),
        "k_cache": k_cache,
        "v_cache": v_cache,
        "k": torch.randn(BATCH, new, kv_heads, head_dim, dtype=dtype) if new else None,
        "v": torch.randn(BATCH, new, kv_heads, head_dim, dtype=dtype) if new else None,
        "cache_seqlens": seqlens,
        "cache_batch_idx": batch_idx,
        "cache_leftpad": leftpad,
    }
    return {name: x.to(device) if isinstance(x, torch.Tensor) else x for name, x in args.items()}


def expected(args: dict, **options) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out, lse, k_cache, v_cache) after the call, written out entry by entry: the new keys appended at
    cache_seqlens, then float64 attention over the visible slots of each entry's cache row."""
    k_cache, v_cache = args["k_cache"].clone(), args["v_cache"].clone()
    outs, lses = [], []
    for b in range(args["q"].shape[0]):
        row = b if args["cache_batch_idx"] is None else int(args["cache_batch_idx"][b])
        end = int(args["cache_seqlens"][b])
        if args["k"] is not None:
            new = args["k"].shape[1]
            k_cache[row, end : end + new] = args["k"][b]
            v_cache[row, end : end + new] = args["v"][b]
            end += new
        first = 0 if args["cache_leftpad"] is None else int(args["cache_leftpad"][b])
        keys, values = k_cache[row, first:end], v_cache[row, first:end]
        out, lse = naive_attention(args["q"][b : b + 1], keys[None], values[None], **options)
        outs.append(out)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses), k_cache, v_cache


def assert_same_cache(got: torch.Tensor, want: torch.Tensor) -> None:
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("head_major", [False, True])
@pytest.mark.parametrize("rows", ["plain", "batch_idx", "increasing_idx", "leftpad"])
@pytest.mark.parametrize("seqlen_q", [1, 5])
@pytest.mark.parametrize("new", [0, 1, 4])
@pytest.mark.parametrize("softcap", [0.0, 2.5])
@pytest.mark.parametrize("window", [(-1, -1), (3, 0), (2, 5)])
@pytest.mark.parametrize("causal", [False, True])
def test_matches_float64_oracle(causal, window, softcap, new, seqlen_q, rows, head_major, rng):
    args = make_inputs(seqlen_q, new, rows, head_major=head_major)
    options = {"causal": causal, "window_size": window, "softcap": softcap}
    out_want, lse_want, k_want, v_want = expected(args, causal=causal, window=window, softcap=softcap)
    out, lse = flash_attn_with_kvcache(**args, **options, return_softmax_lse=True, backend="reference")
    assert out.shape == args["q"].shape and lse.shape == (BATCH, HEADS, seqlen_q) and lse.dtype == torch.float32
    assert not out.isnan().any() and not lse.isnan().any()
    torch.testing.assert_close(out.double(), out_want, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(lse.double(), lse_want, atol=2e-5, rtol=1e-5)
    assert_same_cache(args["k_cache"], k_want)
    assert_same_cache(args["v_cache"], v_want)


@pytest.mark.parametrize(("heads", "kv_heads"), [(2, 2), (4, 1), (8, 2)])  # MHA, MQA, GQA
def test_any_head_ratio_and_softmax_scale(heads, kv_heads, rng):
    args = make_inputs(3, 2, "plain", heads=heads, kv_heads=kv_heads)
    out_want, lse_want, *_ = expected(args, causal=True, softmax_scale=0.3)
    out, lse = flash_attn_with_kvcache(**args, causal=True, softmax_scale=0.3, return_softmax_lse=True)
    torch.testing.assert_close(out.double(), out_want, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(lse.double(), lse_want, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("rows", "head_major", "seqlen_q", "in_place", "heads"),
    [
        ("plain", False, 3, True, HEADS),
        ("increasing_idx", False, 1, True, HEADS),
        ("leftpad", False, 1, True, HEADS),
        ("batch_idx", False, 1, False, HEADS),
        ("leftpad", True, 1, True, 1),  # decoding over transformers' layout: one head, the GQA group as queries
        ("increasing_idx", True, 1, True, 1),
        ("leftpad", True, 3, False, HEADS),  # several queries over transformers' layout: gathered
    ],
)
def test_rows_in_order_are_read_where_they_lie(rows, head_major, seqlen_q, in_place, heads, rng, monkeypatch):
    """No copy of the cache where its rows come in order: the backend gets views of the cache itself."""
    args = make_inputs(seqlen_q, 1, rows, head_major=head_major)
    if rows == "batch_idx":
        args["cache_batch_idx"] = args["cache_batch_idx"].sort(descending=True).values  # surely out of order
    seen = []
    reference = backends.get("reference")
    monkeypatch.setattr(type(reference), "forward", lambda self, batch: seen.append(batch) or FORWARD(self, batch))
    flash_attn_with_kvcache(**args, causal=True, backend="reference")
    [batch] = seen
    assert (batch.k.untyped_storage().data_ptr() == args["k_cache"].untyped_storage().data_ptr()) == in_place
    assert batch.q.shape[1] == heads


@pytest.mark.parametrize("new", [0, 2])
@pytest.mark.parametrize("num_splits", [1, 2, 5, 200])  # 200: more parts than any entry has keys
def test_split_decoding_merges_to_the_oracle(num_splits, new, rng, monkeypatch):
    """Decoding over transformers' layout with the keys split in parts, merged by their logsumexp: the same as
    attention over all keys. Entry 0 has no cached key (with new=0 none at all: output 0, logsumexp -inf)."""
    args = make_inputs(1, new, "leftpad", head_major=True)
    out_want, lse_want, *_ = expected(args, causal=True, softcap=1.5)
    seen = []
    reference = backends.get("reference")
    monkeypatch.setattr(type(reference), "forward", lambda self, batch: seen.append(batch) or FORWARD(self, batch))
    out, lse = flash_attn_with_kvcache(
        **args, causal=True, softcap=1.5, num_splits=num_splits, return_softmax_lse=True, backend="reference"
    )
    torch.testing.assert_close(out.double(), out_want, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(lse.double(), lse_want, atol=2e-5, rtol=1e-5)
    [batch] = seen  # a document per (entry, key head, part), each with the group's queries
    assert batch.q.shape[0] == BATCH * HEADS * num_splits and batch.max_seqlen_q == HEADS // KV_HEADS
    if new == 0:
        assert torch.equal(out[0], torch.zeros_like(out[0])) and bool((lse[0] == -torch.inf).all())


def test_the_layers_of_a_step_read_the_padding_from_the_host_once(rng, monkeypatch):
    """Every layer passes the same cache_leftpad tensor: its values are read once (a host sync on a GPU), and read
    again when it changes in place."""
    args = make_inputs(1, 0, "leftpad", head_major=True)
    reads = []
    tolist = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda self: reads.append(self) or tolist(self))
    first = [flash_attn_with_kvcache(**args, causal=True) for _ in range(3)]
    assert sum(r is args["cache_leftpad"] for r in reads) == 1
    assert all(torch.equal(out, first[0]) for out in first)
    args["cache_leftpad"].zero_()  # every slot from 0 is visible now (the NaN slots are before the old padding)
    args["k_cache"].nan_to_num_(0.0)
    args["v_cache"].nan_to_num_(0.0)
    out_want, *_ = expected(args, causal=True)
    torch.testing.assert_close(flash_attn_with_kvcache(**args, causal=True).double(), out_want, atol=2e-5, rtol=1e-5)
    assert sum(r is args["cache_leftpad"] for r in reads) == 2


def test_a_backend_without_logsumexp_decodes_in_one_part(rng):
    """sdpa returns no logsumexp, so split parts could not merge: the call runs whole, and equals the oracle."""
    args = make_inputs(1, 1, "leftpad", head_major=True)
    args["k_cache"].nan_to_num_(0.0)  # sdpa's dense mask multiplies masked slots by zero: NaN would spread
    args["v_cache"].nan_to_num_(0.0)
    out_want, *_ = expected(args, causal=True)
    out = flash_attn_with_kvcache(**args, causal=True, num_splits=4, backend="sdpa")
    torch.testing.assert_close(out.double(), out_want, atol=2e-5, rtol=1e-5)


def test_inference_tensors_are_read_each_call(rng):
    """Tensors made under inference_mode have no version counter: nothing about them is kept between calls."""
    with torch.inference_mode():
        args = make_inputs(1, 0, "leftpad", head_major=True)
        out_want, *_ = expected(args, causal=True)
        first = flash_attn_with_kvcache(**args, causal=True)
        args["cache_leftpad"].zero_()
        args["k_cache"].nan_to_num_(0.0)
        args["v_cache"].nan_to_num_(0.0)
        again_want, *_ = expected(args, causal=True)
        again = flash_attn_with_kvcache(**args, causal=True)
    torch.testing.assert_close(first.double(), out_want, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(again.double(), again_want, atol=2e-5, rtol=1e-5)


def test_int_cache_seqlens_equals_the_tensor_and_none_means_the_whole_cache(rng):
    q, k_cache, v_cache = torch.randn(2, 1, 4, 8), torch.randn(2, 9, 1, 8), torch.randn(2, 9, 1, 8)
    k, v = torch.randn(2, 1, 1, 8), torch.randn(2, 1, 1, 8)
    as_int = flash_attn_with_kvcache(q, k_cache.clone(), v_cache.clone(), k, v, cache_seqlens=7, causal=True)
    lens = torch.full((2,), 7, dtype=torch.int32)
    as_tensor = flash_attn_with_kvcache(q, k_cache.clone(), v_cache.clone(), k, v, cache_seqlens=lens, causal=True)
    torch.testing.assert_close(as_int, as_tensor, rtol=0, atol=0)
    whole, _ = naive_attention(q, k_cache, v_cache)
    torch.testing.assert_close(flash_attn_with_kvcache(q, k_cache, v_cache).double(), whole, atol=2e-5, rtol=1e-5)


def test_entry_without_keys_gives_zero_and_minus_infinity(rng):
    q, k_cache, v_cache = torch.randn(2, 3, 2, 8), torch.randn(2, 4, 2, 8), torch.randn(2, 4, 2, 8)
    seqlens = torch.tensor([0, 4], dtype=torch.int32)
    out, lse = flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, causal=True, return_softmax_lse=True)
    assert torch.equal(out[0], torch.zeros_like(out[0])) and torch.equal(lse[0], torch.full_like(lse[0], -torch.inf))
    assert torch.isfinite(out).all() and torch.isfinite(lse[1]).all()


def test_many_queries_over_few_keys_see_only_the_keys_before_them(rng):
    """Sq > keys with causal (chunked prefill over a short cache): the first queries see nothing."""
    q, k_cache, v_cache = torch.randn(1, 6, 2, 8), torch.randn(1, 8, 2, 8), torch.randn(1, 8, 2, 8)
    k, v = torch.randn(1, 2, 2, 8), torch.randn(1, 2, 2, 8)
    out, lse = flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=1, causal=True, return_softmax_lse=True)
    assert torch.equal(out[0, :3], torch.zeros_like(out[0, :3])) and (lse[0, :, :3] == -torch.inf).all()
    want, _ = naive_attention(q, k_cache[:, :3], v_cache[:, :3], causal=True)
    torch.testing.assert_close(out.double(), want, atol=2e-5, rtol=1e-5)


def _good() -> dict:
    return {
        "q": torch.randn(2, 1, 4, 8),
        "k_cache": torch.randn(2, 10, 2, 8),
        "v_cache": torch.randn(2, 10, 2, 8),
        "k": torch.randn(2, 1, 2, 8),
        "v": torch.randn(2, 1, 2, 8),
        "cache_seqlens": torch.tensor([3, 9], dtype=torch.int32),
    }


def _i32(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


BAD = {
    "q-rank": ("q", {"q": torch.randn(2, 4, 8)}),
    "q-empty-batch": ("q", {"q": torch.randn(0, 1, 4, 8), "k": None, "v": None, "cache_seqlens": _i32()}),
    "q-dtype": ("q", {"q": torch.randn(2, 1, 4, 8).double()}),
    "cache-dtype": ("k_cache", {"k_cache": torch.randn(2, 10, 2, 8).half()}),
    "cache-heads": ("k_cache", {"k_cache": torch.randn(2, 10, 3, 8), "v_cache": torch.randn(2, 10, 3, 8)}),
    "cache-head-dim": ("k_cache", {"k_cache": torch.randn(2, 10, 2, 4), "v_cache": torch.randn(2, 10, 2, 4)}),
    "v-cache-shape": ("v_cache", {"v_cache": torch.randn(2, 11, 2, 8)}),
    "cache-batch": ("k_cache", {"k_cache": torch.randn(3, 10, 2, 8), "v_cache": torch.randn(3, 10, 2, 8)}),
    "k-without-v": ("v", {"v": None}),
    "k-shape": ("k", {"k": torch.randn(2, 1, 1, 8), "v": torch.randn(2, 1, 1, 8)}),
    "k-dtype": ("k", {"k": torch.randn(2, 1, 2, 8).half()}),
    "v-shape": ("v", {"v": torch.randn(2, 2, 2, 8)}),
    "seqlens-missing": ("cache_seqlens", {"cache_seqlens": None}),
    "seqlens-dtype": ("cache_seqlens", {"cache_seqlens": torch.tensor([3, 9])}),
    "seqlens-shape": ("cache_seqlens", {"cache_seqlens": _i32(3)}),
    "seqlens-type": ("cache_seqlens", {"cache_seqlens": 3.0}),
    "overflow": ("cache_seqlens", {"cache_seqlens": _i32(3, 10)}),
    "overflow-int": ("cache_seqlens", {"cache_seqlens": 10}),
    "seqlens-negative": ("cache_seqlens", {"cache_seqlens": _i32(-1, 3)}),
    "batch-idx-range": ("cache_batch_idx", {"cache_batch_idx": _i32(0, 2)}),
    "batch-idx-dtype": ("cache_batch_idx", {"cache_batch_idx": torch.tensor([0, 1])}),
    "leftpad-past-seqlens": ("cache_leftpad", {"cache_leftpad": _i32(4, 0)}),
    "rotary": ("rotary_cos", {"rotary_cos": torch.randn(16, 4), "rotary_sin": torch.randn(16, 4)}),
    "paged": ("block_table", {"block_table": _i32(0, 1)[:, None]}),
    "alibi": ("alibi_slopes", {"alibi_slopes": torch.ones(4)}),
    "window": ("window_size", {"window_size": (-2, 0)}),
    "softcap": ("softcap", {"softcap": -1.0}),
    "num-splits": ("num_splits", {"num_splits": -1}),
    "lse-flag": ("return_softmax_lse", {"return_softmax_lse": 1}),
    "causal-int": ("causal", {"causal": 1}),
    "backend": ("backend", {"backend": "nope"}),
}


@pytest.mark.parametrize("after_good_call", [False, True], ids=["first", "after-good"])
@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_raises_naming_the_argument_before_any_compute(case, after_good_call, monkeypatch):
    """Also after a good call with the other arguments (the same tensors): what a call's checks decide is kept for
    the layers of a step, and must not let a different argument through."""
    name, overrides = BAD[case]
    good = _good()
    if after_good_call:
        flash_attn_with_kvcache(**good, causal=True)
    args = {**good, "causal": True, **overrides}
    caches = args["k_cache"].clone(), args["v_cache"].clone()

    def unreachable(backend):
        raise AssertionError(f"a backend ({backend}) was reached on invalid input")

    monkeypatch.setattr(backends, "get", unreachable)
    with pytest.raises((ValueError, TypeError), match=f"^{name}:"):
        flash_attn_with_kvcache(**args)
    assert_same_cache(args["k_cache"], caches[0])
    assert_same_cache(args["v_cache"], caches[1])


def test_cache_seqlens_edited_in_place_after_a_good_call_is_checked_again():
    """The checks kept for a step's layers are keyed by the cache_* tensors' versions: an in-place edit is seen."""
    args = _good()
    flash_attn_with_kvcache(**args)
    args["cache_seqlens"][1] = 10  # past the cache, with the new key
    with pytest.raises(ValueError, match=r"^cache_seqlens:"):
        flash_attn_with_kvcache(**args)


@pytest.mark.parametrize(("backend", "name"), [("sdpa", "return_softmax_lse"), ("fa2", "backend")])
def test_a_backend_that_refuses_the_call_leaves_the_cache_untouched(backend, name):
    """sdpa has no logsumexp; fa2 needs a GPU and half precision: both refuse after the checks, before the append."""
    args = _good()
    caches = args["k_cache"].clone(), args["v_cache"].clone()
    with pytest.raises(ValueError, match=f"^{name}:"):
        flash_attn_with_kvcache(**args, return_softmax_lse=backend == "sdpa", backend=backend)
    assert_same_cache(args["k_cache"], caches[0])
    assert_same_cache(args["v_cache"], caches[1])


@pytest.mark.cuda
@pytest.mark.parametrize("rows", ["plain", "batch_idx", "leftpad"])
@pytest.mark.parametrize("seqlen_q", [1, 5])
@pytest.mark.parametrize("causal", [False, True])
def test_cuda_matches_reference(causal, seqlen_q, rows, rng):
    """The kernels (auto: fa3 or fa2) through the gathered varlen batch, bf16, against the reference on the same
    inputs; the caches must end bit-identical."""
    args = make_inputs(seqlen_q, 2, rows, dtype=torch.bfloat16, device="cuda")
    ref_args = {name: x.clone() if isinstance(x, torch.Tensor) else x for name, x in args.items()}
    options = {"causal": causal, "window_size": (40, 0) if causal else (-1, -1), "return_softmax_lse": True}
    out, lse = flash_attn_with_kvcache(**args, **options, backend="auto")
    out_ref, lse_ref = flash_attn_with_kvcache(**ref_args, **options, backend="reference")
    torch.testing.assert_close(out, out_ref, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse, lse_ref, atol=1e-2, rtol=1e-3)
    assert_same_cache(args["k_cache"], ref_args["k_cache"])
    assert_same_cache(args["v_cache"], ref_args["v_cache"])


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_the_layers_of_a_step_run_fa3_prepared_once_each_on_its_own_inputs(device, rng, monkeypatch):
    """The layers of a decoding step pass their own q and caches, laid out alike, with the same cache_seqlens and
    cache_leftpad: fa3 is checked and scheduled for the first, then runs every layer on that layer's inputs (on the
    CPU, the emulated kernels). A cache whose start is not 16-byte aligned takes the per-call path, which copies."""
    if device == "cpu":
        use_emulated_kernels(monkeypatch)
    elif kernels.unavailable_reason(torch.device("cuda"), 64, torch.bfloat16, True) is not None:
        pytest.skip("fa3 needs a Hopper GPU")
    checks = []
    check = cuda.CudaBackend.check
    monkeypatch.setattr(cuda.CudaBackend, "check", lambda self, batch: checks.append(batch) or check(self, batch))
    first = make_inputs(1, 0, "leftpad", dtype=torch.bfloat16, device=device, head_dim=64, head_major=True)

    def other(x: torch.Tensor) -> torch.Tensor:  # other values, the same layout, NaN where the first has it
        return torch.where(x.isnan(), x, torch.randn_like(x))

    def unaligned(x: torch.Tensor) -> torch.Tensor:  # the same layout one element into a larger buffer
        buffer = torch.empty(x.numel() + 1, dtype=x.dtype, device=x.device)
        return buffer.as_strided(x.shape, x.stride(), storage_offset=1).copy_(x)

    layers = [first, *({**first, "q": torch.randn_like(first["q"])} for _ in range(3))]
    for layer in layers[1:]:
        layer["k_cache"], layer["v_cache"] = other(first["k_cache"]), other(first["v_cache"])
    layers[3]["k_cache"], layers[3]["v_cache"] = unaligned(layers[3]["k_cache"]), unaligned(layers[3]["v_cache"])
    assert all(layer["k_cache"].stride() == first["k_cache"].stride() for layer in layers)
    for n, layer in enumerate(layers):
        out = flash_attn_with_kvcache(**layer, causal=True, backend="fa3")
        want = flash_attn_with_kvcache(**layer, causal=True, backend="reference")
        torch.testing.assert_close(out, want, atol=2e-2, rtol=2e-2, msg=f"layer {n}")
        assert len(checks) == (1 if n < 3 else 2)


def test_a_compiled_decoding_call_traces_the_op(rng, monkeypatch):
    """Under torch.compile(fullgraph=True) a decoding call over a head-major cache is traced through the op (no graph
    break: nothing is prepared from the tracer's tensors) and gives eager's output; on the CPU, the emulated fa3."""
    use_emulated_kernels(monkeypatch)
    q = torch.randn(BATCH, 1, HEADS, 64, dtype=torch.bfloat16)
    k_cache, v_cache = (
        torch.randn(BATCH, KV_HEADS, SEQLEN_CACHE, 64, dtype=torch.bfloat16).transpose(1, 2) for _ in "kv"
    )

    def step(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        return flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=SEQLEN_CACHE - 10, causal=True, backend="fa3")

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")(q, k_cache, v_cache)
    torch.testing.assert_close(compiled, step(q, k_cache, v_cache), atol=0, rtol=0)
