"""FP8 attention's quantization and numerics (legalpt/attention/fp8.py) against float64 attention, and
scripts/fp8_accuracy.py."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from attention_helpers import (
    assert_fp8_kernel_computes_reference,
    assert_fused_quantization_is_quantize,
    assert_fused_quantization_keeps_special_values,
    assert_fused_quantization_rotates,
    fp8_quantize_inputs,
    fused_quantize,
    naive_attention,
)

from legalpt.attention import fp8, kernels
from legalpt.attention.fp8 import BLOCK_ROWS, E4M3_MAX, flash_attn_fp8_func, incoherence_matrix, quantize


def _dequantized(inputs: fp8.Fp8Inputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q, K, V (B, S, H, D) float64 as the e4m3 values times their scales."""

    def rows(x8: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:  # scale (B, H, blocks)
        per_row = scale.double().repeat_interleave(BLOCK_ROWS, dim=2)[..., : x8.shape[1]].transpose(1, 2)
        return x8.double() * per_row[..., None]

    v = inputs.v.double() * inputs.v_scale.double()[:, None, :, None]
    return rows(inputs.q, inputs.q_scale), rows(inputs.k, inputs.k_scale), v


def test_incoherence_matrix_is_orthogonal_and_keeps_scores(rng):
    m = incoherence_matrix(64, seed=3).double()
    torch.testing.assert_close(m @ m.T, torch.eye(64, dtype=torch.float64), atol=1e-6, rtol=0)
    q, k = torch.randn(5, 64, dtype=torch.float64), torch.randn(7, 64, dtype=torch.float64)
    torch.testing.assert_close((q @ m) @ (k @ m).T, q @ k.T)
    assert not torch.equal(incoherence_matrix(64, seed=3), incoherence_matrix(64, seed=4))  # signs follow the seed
    with pytest.raises(ValueError, match="head_dim: incoherent processing needs a power of two"):
        incoherence_matrix(96, seed=0)


def test_block_scales_fit_each_block_to_e4m3(rng):
    """Every block of 128 rows of a head maps its largest magnitude to 448; an all-zero block keeps scale 1."""
    q = torch.randn(2, 300, 4, 32) * torch.tensor([1.0, 10.0, 0.01, 1.0])[None, None, :, None]
    q[1, 128:256, 2] = 0  # one all-zero block
    k = torch.randn(2, 113, 2, 32)
    inputs = quantize(q, k, k.clone(), scaling="block", incoherent=False)
    assert inputs.q.dtype == torch.float8_e4m3fn and inputs.q.shape == q.shape
    assert inputs.q_scale.shape == (2, 4, 3) and inputs.k_scale.shape == (2, 2, 1) and inputs.v_scale.shape == (2, 2)
    amax = inputs.q.float().abs().reshape(2, 300, 4, 32).amax(-1)  # (B, S, H)
    for block in range(3):
        rows = slice(block * 128, (block + 1) * 128)
        got = amax[:, rows].amax(1)  # (B, H)
        zero = q[:, rows].abs().amax(dim=(1, 3)) == 0
        assert torch.equal(got[~zero], torch.full_like(got[~zero], E4M3_MAX))
        assert torch.equal(inputs.q_scale[:, :, block][zero], torch.ones(int(zero.sum())))
    q_deq, _, _ = _dequantized(inputs)
    normal = q.abs() > inputs.q_scale.max() * 2**-6  # e4m3's normal range (relative error <= 2^-4)
    assert ((q_deq - q.double()).abs() <= q.double().abs() * 2**-4)[normal].all()


def test_tensor_scaling_shares_one_scale(rng):
    q, k = torch.randn(1, 200, 2, 64), torch.randn(1, 200, 2, 64)
    inputs = quantize(q, k, k * 3, scaling="tensor", incoherent=True)
    for scale in (inputs.q_scale, inputs.k_scale, inputs.v_scale):
        assert torch.equal(scale, torch.full_like(scale, scale.flatten()[0].item()))


@pytest.mark.parametrize("sharpness", [1, 3])
def test_one_key_tile_matches_the_dense_formula(sharpness, rng):
    """With one key tile the running max is the row max:
    out = e4m3(2^(x - max + 8)) V8 v_scale / sum(2^(x - max + 8)). Sharper logits (q scaled up) put some of P among
    e4m3's subnormals, where a wrong shift would show."""
    q, k, v = sharpness * torch.randn(1, 70, 2, 64), torch.randn(1, 100, 2, 64), torch.randn(1, 100, 2, 64)
    inputs = quantize(q, k, v, incoherent=True, seed=5)
    out, lse = fp8.reference_forward(inputs, softmax_scale=0.125)
    q_deq, k_deq, v_deq = _dequantized(inputs)
    logits = torch.einsum("bqhd,bkhd->bhqk", q_deq, k_deq) * 0.125 / math.log(2)  # log2 domain
    x = logits - logits.amax(-1, keepdim=True) + fp8.P_SHIFT
    p = torch.exp2(x)
    p8 = p.float().to(torch.float8_e4m3fn).double()
    v_scale, total = inputs.v_scale.double()[:, None, :, None], p.sum(-1).transpose(1, 2)[..., None]
    expected = torch.einsum("bhqk,bkhd->bqhd", p8, inputs.v.double()) * v_scale / total
    # The reference's float32 logits differ from these float64 ones by a few float32 ulps, which flips P's e4m3
    # rounding where P lies that close to a midpoint: such a flip may move the output by one e4m3 step of that P.
    near = 1e-5  # relative width around P that float32 logits can reach
    rounded = [(p * (1 + sign * near)).float().to(torch.float8_e4m3fn).double() for sign in (-1, 1)]
    ambiguous = rounded[1] - rounded[0]  # (B, H, Sq, Sk): one e4m3 step where the rounding can go either way, else 0
    assert (ambiguous != 0).double().mean() < 1e-2  # rare, so the check below stays exact almost everywhere
    slack = torch.einsum("bhqk,bkhd->bqhd", ambiguous, inputs.v.double().abs()) * v_scale / total
    error = (out.double() - expected).abs()
    assert (error <= 1e-5 + 1e-5 * expected.abs() + slack).all(), f"largest error {error.max():.3g}"
    torch.testing.assert_close(lse.double(), torch.logsumexp(logits * math.log(2), -1), rtol=1e-5, atol=1e-5)
    assert v_deq.shape == v.shape


MASKS = [{}, {"causal": True}, {"window_size": (40, 7)}, {"causal": True, "window_size": (90, -1)}]


@pytest.mark.parametrize("mask", MASKS)
def test_reference_is_attention_of_the_quantized_inputs(mask, rng):
    """Over several key tiles (unequal lengths, GQA), the output differs from exact attention of the dequantized
    inputs only by P's rounding to e4m3: at most 2^-4 of max |V| (plus P's subnormals), and the logsumexp not at all."""
    q, k, v = torch.randn(2, 113, 4, 64), torch.randn(2, 300, 2, 64), torch.randn(2, 300, 2, 64)
    v[:, :, 1] *= 8  # key heads of different scales: a query head must take its own head's
    inputs = quantize(q, k, v, incoherent=False)
    out, lse = fp8.reference_forward(inputs, softmax_scale=64**-0.5, **mask)
    q_deq, k_deq, v_deq = _dequantized(inputs)
    kwargs = {"causal": mask.get("causal", False), "window": mask.get("window_size", (-1, -1))}
    exact_out, exact_lse = naive_attention(q_deq, k_deq, v_deq, **kwargs)
    bound = (2**-4 + 300 * 2**-18) * v_deq.abs().max()
    assert (out.double() - exact_out).abs().max() <= bound
    assert (out.double() - exact_out).abs().mean() <= bound / 20  # rounding errors average out over keys
    seen = exact_lse > -math.inf
    torch.testing.assert_close(lse.double()[seen], exact_lse[seen], rtol=1e-5, atol=1e-5)
    assert torch.equal(lse[~seen], exact_lse[~seen].float())


def _tile_by_tile_causal(inputs: fp8.Fp8Inputs, scale: float, diagonal_first: bool = True) -> torch.Tensor:
    """Causal FP8 attention for Sq == Sk, a multiple of BLOCK_ROWS (every query tile whole), one query tile and one
    head at a time, each query tile visiting its diagonal (partial) key tile first and then the full ones in order,
    as the kernel does (diagonal_first=False: in ascending order): (B, S, H, D)."""
    q8, k8, v8 = (x.float() for x in (inputs.q, inputs.k, inputs.v))
    batch, length, heads, _ = q8.shape
    group, tiles = heads // k8.shape[2], -(-length // BLOCK_ROWS)
    out = torch.zeros_like(q8)
    for b, h, i in itertools.product(range(batch), range(heads), range(tiles)):
        rows = torch.arange(i * BLOCK_ROWS, min((i + 1) * BLOCK_ROWS, length))
        m = torch.full((len(rows), 1), -math.inf)
        total, acc = torch.zeros(len(rows), 1), torch.zeros(len(rows), q8.shape[-1])
        for j in [i, *range(i)] if diagonal_first else range(i + 1):
            cols = torch.arange(j * BLOCK_ROWS, min((j + 1) * BLOCK_ROWS, length))
            c = torch.tensor(scale * math.log2(math.e), dtype=torch.float32) * inputs.q_scale[b, h, i]
            c = c * inputs.k_scale[b, h // group, j]
            scores = (q8[b, rows, h] @ k8[b, cols, h // group].T).masked_fill(cols[None] > rows[:, None], -math.inf)
            m_new = torch.maximum(m, scores.amax(-1, keepdim=True) * c)
            p = torch.exp2((scores.double() * c.double() - (m_new - fp8.P_SHIFT).double()).float())
            alpha = torch.exp2(m - m_new)
            total = total * alpha + p.sum(-1, keepdim=True)
            acc = acc * alpha + p.to(torch.float8_e4m3fn).float() @ v8[b, cols, h // group]
            m = m_new
        out[b, rows, h] = acc * inputs.v_scale[b, h // group] / total
    return out


def test_reference_visits_key_tiles_in_the_kernels_order(rng):
    """P's rounding depends on the running max met so far: against a tile-by-tile loop in the kernel's order
    (partial tile first) the reference agrees to float32 rounding, while ascending order differs far more."""
    q, k, v = torch.randn(1, 384, 2, 64) * 3, torch.randn(1, 384, 1, 64) * 3, torch.randn(1, 384, 1, 64)
    inputs = quantize(q, k, v, incoherent=False)
    out, _ = fp8.reference_forward(inputs, 0.125, causal=True)
    torch.testing.assert_close(out, _tile_by_tile_causal(inputs, 0.125), atol=1e-5, rtol=1e-5)
    ascending = _tile_by_tile_causal(inputs, 0.125, diagonal_first=False)
    assert (ascending - out).abs().max() > 1e-3  # the order shows at this tolerance


def test_nan_inputs_give_nan(rng):
    q, k = torch.randn(1, 50, 2, 32), torch.randn(1, 50, 2, 32)
    q[0, 7, 1, 3] = math.nan
    out, lse, _ = flash_attn_fp8_func(q, k, k.clone(), causal=True, incoherent=False, return_attn_probs=True)
    assert out[0, 7, 1].isnan().all() and lse[0, 1, 7].isnan()
    assert torch.isfinite(out[0, :7]).all() and torch.isfinite(out[0, 8:, 1]).all()


def test_rows_without_keys_give_zero_and_minus_infinity(rng):
    q, k = torch.randn(1, 50, 2, 32), torch.randn(1, 20, 2, 32)  # causal, bottom-right: the first 30 rows see nothing
    out, lse, _ = flash_attn_fp8_func(q, k, k.clone(), causal=True, incoherent=False, return_attn_probs=True)
    assert torch.equal(out[:, :30], torch.zeros_like(out[:, :30])) and torch.isfinite(out).all()
    assert torch.equal(lse[..., :30], torch.full_like(lse[..., :30], -math.inf)) and torch.isfinite(lse[..., 30:]).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_attention_error_is_fp8_sized(dtype, rng):
    """Against float64 attention of the original inputs: larger than bf16's, within what e4m3 allows."""
    q, k, v = (torch.randn(1, 257, 4, 128).to(dtype) for _ in range(3))
    out = flash_attn_fp8_func(q, k, v, causal=True)
    assert out.dtype == dtype and out.shape == q.shape
    exact, _ = naive_attention(q, k, v, causal=True)
    low, _ = naive_attention(q, k, v, causal=True, dtype=torch.bfloat16)
    rmse = (out.double() - exact).square().mean().sqrt()
    assert (low.double() - exact).square().mean().sqrt() < rmse < 0.05


def test_accuracy_script_shows_incoherent_processing_helps(load_script, tmp_path):
    accuracy = load_script("fp8_accuracy")
    result = accuracy.main(["--seqlen", "256", "--heads", "2", "--seeds", "1", "--out", str(tmp_path)])
    day = result["header"]["date"][:10].replace("-", "")
    assert [path.name for path in tmp_path.iterdir()] == [f"fp8-accuracy-{result['header']['gpu']}-{day}.json"]
    rmse = {row["method"]: row["rmse"] for row in result["rows"]}
    assert rmse["bf16"] < rmse["fp8 per-block + incoherent"] < rmse["fp8 per-tensor"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"scaling": "row"}, "scaling: expected one of"),
        ({"backend": "flex"}, "backend: expected one of"),
        ({"softmax_scale": -1.0}, "softmax_scale: expected a finite number > 0"),
        ({"window_size": (-2, 0)}, "window_size: expected"),
        ({"causal": 1}, "causal: expected a bool"),
        ({"incoherent": "yes"}, "incoherent: expected a bool"),
        ({"seed": 1.5}, r"seed: expected an int in \[0, 2\^63\)"),
        ({"seed": 2**64}, r"seed: expected an int in \[0, 2\^63\)"),
    ],
)
def test_bad_arguments_are_named(kwargs, message):
    q = torch.randn(1, 8, 2, 32)
    with pytest.raises((ValueError, TypeError), match=message):
        flash_attn_fp8_func(q, q, q, **kwargs)


def test_fa3_backend_says_why_it_cannot_run():
    """On the CPU, or at a head dim other than 128, backend="fa3" is refused with the reason; "auto" runs the
    reference there."""
    q = torch.randn(1, 8, 2, 64)
    with pytest.raises(ValueError, match="backend: fa3 cannot run FP8 attention here: the FP8 kernel has head dim 128"):
        flash_attn_fp8_func(q, q, q, backend="fa3")
    q = torch.randn(1, 8, 2, 128)
    with pytest.raises(ValueError, match="backend: fa3 cannot run FP8 attention here: it needs a CUDA device"):
        flash_attn_fp8_func(q, q, q, backend="fa3")
    torch.testing.assert_close(flash_attn_fp8_func(q, q, q), flash_attn_fp8_func(q, q, q, backend="reference"))


@pytest.mark.parametrize("lengths", [(0, 5), (5, 0), (0, 0)])
def test_empty_rows_give_zero_and_minus_infinity(lengths, rng):
    q, k = torch.randn(2, lengths[0], 2, 32), torch.randn(2, lengths[1], 2, 32)
    out, lse, _ = flash_attn_fp8_func(q, k, k.clone(), return_attn_probs=True)
    assert out.shape == q.shape and lse.shape == (2, 2, lengths[0])
    assert torch.equal(out, torch.zeros_like(out)) and (lse == -math.inf).all()


def test_tiny_inputs_keep_normal_scales(rng):
    """Inputs of magnitude 1e-20 would give a logit scale that underflows to 0; the scales stop at MIN_SCALE."""
    q = torch.randn(1, 40, 2, 32) * 1e-20
    inputs = quantize(q, q, q)
    assert (inputs.q_scale >= fp8.MIN_SCALE).all() and (inputs.k_scale * inputs.q_scale * 0.125 > 0).all()
    out = flash_attn_fp8_func(q, q, q, causal=True)
    assert torch.isfinite(out).all()


def test_bad_tensors_are_named():
    q = torch.randn(1, 8, 2, 32)
    with pytest.raises(ValueError, match="head_dim: incoherent processing needs a power of two"):
        flash_attn_fp8_func(torch.randn(1, 8, 2, 48), torch.randn(1, 8, 2, 48), torch.randn(1, 8, 2, 48))
    with pytest.raises(ValueError, match="k: expected a number of heads that divides"):
        flash_attn_fp8_func(q, torch.randn(1, 8, 3, 32), torch.randn(1, 8, 3, 32))
    with pytest.raises(ValueError, match="q: expected a 4-D tensor"):
        flash_attn_fp8_func(q[0], q[0], q[0])
    with pytest.raises(ValueError, match="q: expected dtype"):
        flash_attn_fp8_func(q.int(), q.int(), q.int())
    with pytest.raises(ValueError, match="q: expected head_dim >= 1"):
        flash_attn_fp8_func(q[..., :0], q[..., :0], q[..., :0], incoherent=False)
    with pytest.raises(TypeError, match=r"q: expected a torch\.Tensor"):
        flash_attn_fp8_func(q.tolist(), q, q)


def _bf16(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.bfloat16)


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        (lambda: (_bf16(1, 8, 2, 128).float(),) * 3, "q: expected dtype bfloat16 or float16"),
        (lambda: (_bf16(1, 8, 2, 128), _bf16(1, 8, 2, 128).half(), _bf16(1, 8, 2, 128)), "k: expected dtype"),
        (lambda: (_bf16(1, 8, 2, 64),) * 3, "q: expected head_dim 128"),
        (lambda: (_bf16(1, 8, 2, 128), _bf16(1, 8, 2, 128).to("meta"), _bf16(1, 8, 2, 128)), "k: expected device"),
        (lambda: (_bf16(1, 8, 2, 128), _bf16(1, 8, 2, 128), _bf16(1, 9, 2, 128)), "v: expected shape"),
        (lambda: (_bf16(1, 0, 2, 128), _bf16(1, 8, 2, 128), _bf16(1, 8, 2, 128)), "q, k: expected a batch row"),
        (lambda: (_bf16(1, 8, 0, 128), _bf16(1, 8, 2, 128), _bf16(1, 8, 2, 128)), "q, k: expected a batch row, a head"),
        (lambda: (_bf16(1, 8, 2, 128),) * 3, "q: the fused quantization cannot run here: it needs a CUDA device"),
    ],
    ids=["float32", "mixed-dtypes", "head-dim-64", "k-elsewhere", "v-shape", "no-rows", "no-heads", "on-the-cpu"],
)
def test_kernel_quantize_names_bad_inputs_before_any_launch(inputs, message, monkeypatch):
    """The fused quantization refuses what its kernels cannot read with a ValueError naming the argument, before it
    reaches the extension."""
    monkeypatch.setattr(kernels, "extension", lambda: pytest.fail("kernel_quantize reached the kernels"))
    with pytest.raises(ValueError, match=message):
        fp8.kernel_quantize(*inputs())


# The fused quantization on a GPU: dtype, (Sq, Sk), (heads, kv heads), batch, layout (fp8_quantize_inputs)
QUANTIZE_CASES = [
    (torch.bfloat16, (1, 1), (2, 2), 1, "misaligned"),
    (torch.bfloat16, (4173, 1023), (16, 2), 2, "contiguous"),
    (torch.float16, (777, 777), (4, 4), 2, "packed"),
    (torch.float16, (300, 16384), (8, 8), 1, "heads-first"),
]


@pytest.mark.cuda
@pytest.mark.parametrize(("dtype", "lengths", "heads", "batch", "layout"), QUANTIZE_CASES)
def test_fused_quantization_on_the_gpu(dtype, lengths, heads, batch, layout, monkeypatch, rng):
    """The fused quantization kernels against quantize, outputs poisoned before the run: bit for bit without the
    rotation, within float32's rounding of the sums with it (the helpers' docstrings)."""
    if (reason := fp8._fa3_unavailable(torch.empty(1, 1, 1, 128, device="cuda"))) is not None:
        pytest.skip(f"the FP8 kernels cannot run here: {reason}")
    poisoned = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **kw: poisoned(*a, **kw).fill_(float("nan")))
    q, k, v = fp8_quantize_inputs(dtype, lengths, heads, batch, layout, device="cuda")
    assert_fused_quantization_is_quantize(q, k, v)
    assert_fused_quantization_rotates(q, k, v, seed=rng.randrange(2**63))
    if min(q.shape[1], k.shape[1]) >= 8 and k.shape[2] >= 2:
        assert_fused_quantization_keeps_special_values(q, k, v)


FP8_KERNEL_CASES = [  # dtype, (Sq, Sk), (heads, kv heads), mask keyword arguments
    (torch.bfloat16, (1, 1), (2, 2), {}),
    (torch.bfloat16, (113, 1023), (8, 2), {"causal": True}),
    (torch.float16, (1023, 113), (4, 4), {"causal": True}),  # the first 910 rows see no key
    (torch.bfloat16, (4096, 4096), (16, 16), {"causal": True}),
    (torch.bfloat16, (2048, 2048), (8, 1), {"window_size": (256, 0)}),
    (torch.float16, (777, 777), (4, 2), {}),
]


@pytest.mark.cuda
@pytest.mark.parametrize(("dtype", "lengths", "heads", "mask"), FP8_KERNEL_CASES)
def test_fa3_fp8_kernel_computes_its_reference(dtype, lengths, heads, mask, monkeypatch):
    """The Hopper kernel against the reference on the same quantized inputs, outputs poisoned before the run, and
    both against float64 attention of those inputs."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the FP8 kernel runs on Hopper (sm90)")
    poisoned = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **kw: poisoned(*a, **kw).fill_(float("nan")))
    (seqlen_q, seqlen_k), (h, hk) = lengths, heads
    q = torch.randn(2, seqlen_q, h, 128, dtype=dtype, device="cuda")
    k, v = (torch.randn(2, seqlen_k, hk, 128, dtype=dtype, device="cuda") for _ in range(2))
    out, lse, _ = flash_attn_fp8_func(q, k, v, return_attn_probs=True, backend="fa3", **mask)
    fused = fused_quantize(fp8.quantize)  # the kernel's inputs, for the reference and the truth
    monkeypatch.setattr(fp8, "quantize", fused)
    ref, ref_lse, _ = flash_attn_fp8_func(q, k, v, return_attn_probs=True, backend="reference", **mask)
    window = mask.get("window_size", (-1, -1))  # float64 attention of the quantized inputs:
    truth = naive_attention(*_dequantized(fused(q, k, v)), causal=mask.get("causal", False), window=window)
    assert_fp8_kernel_computes_reference(out, lse, ref, ref_lse, q, k, truth)
