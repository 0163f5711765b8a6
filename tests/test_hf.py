"""transformers models on `attn_implementation="legalpt"` against transformers' own sdpa and eager attention."""

import copy
import subprocess
import sys
from collections.abc import Callable

import pytest
import torch
from transformers import AttentionInterface, AttentionMaskInterface, AutoConfig, AutoModelForCausalLM
from transformers.masking_utils import sliding_window_causal_mask_function

import legalpt.hf
from legalpt.attention import backends
from legalpt.hf import NAME, window_size

VOCAB = 128
WINDOW = 8  # shorter than the sequences below, so the sliding window changes the result
ARCHS = ["llama", "mistral", "qwen2"]


@pytest.fixture(scope="module")
def make_model(tiny_model_config) -> Callable[..., torch.nn.Module]:
    """A function of an arch and a dtype: a model of the `tiny` preset's shape (2 layers, GQA; a narrower MLP) on
    legalpt attention. Mistral slides in every layer, Qwen2 in its second layer only, which needs transformers' own
    config (legalpt's `hf_config` slides in every layer)."""
    tiny = tiny_model_config(intermediate_size=96, max_position_embeddings=256)
    per_arch = {
        "llama": {},
        "mistral": {"sliding_window": WINDOW},
        "qwen2": {"use_sliding_window": True, "sliding_window": WINDOW, "max_window_layers": 1},
    }

    def make(arch: str, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
        config = AutoConfig.for_model(
            arch,
            vocab_size=VOCAB,
            hidden_size=tiny.hidden_size,
            num_hidden_layers=tiny.num_layers,
            num_attention_heads=tiny.num_heads,
            num_key_value_heads=tiny.num_kv_heads,
            intermediate_size=tiny.intermediate_size,
            max_position_embeddings=tiny.max_position_embeddings,
            pad_token_id=0,
            **per_arch[arch],
        )
        return AutoModelForCausalLM.from_config(config, attn_implementation=NAME, dtype=dtype).eval()

    return make


def logits(model: torch.nn.Module, implementation: str, **inputs) -> torch.Tensor:
    model.set_attn_implementation(implementation)
    with torch.no_grad():
        return model(**inputs, use_cache=False).logits.float()


def logits_and_grads(model, implementation: str, input_ids: torch.Tensor, weights: torch.Tensor, **amp):
    """Logits, and the gradients of their weighted sum; `amp` = torch.autocast arguments for the forward pass."""
    model.set_attn_implementation(implementation)
    model.zero_grad()
    with torch.autocast("cpu", **(amp or {"enabled": False})):
        out = model(input_ids=input_ids, use_cache=False).logits
    (out.float() * weights).sum().backward()
    return out.detach().float(), {name: p.grad.float() for name, p in model.named_parameters()}


def test_import_legalpt_does_not_import_transformers():
    code = "import sys, legalpt; assert 'transformers' not in sys.modules, 'transformers imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_register_is_idempotent_and_models_call_legalpt_attention(monkeypatch, make_model):
    legalpt.hf.register()
    legalpt.hf.register()
    assert "flash" not in NAME
    assert AttentionInterface()[NAME] is legalpt.hf.attention_forward
    assert AttentionMaskInterface()[NAME] is legalpt.hf.key_mask
    calls = []
    dense = legalpt.hf.flash_attn_func
    monkeypatch.setattr(legalpt.hf, "flash_attn_func", lambda *args, **kw: calls.append(1) or dense(*args, **kw))
    model = make_model("llama")
    logits(model, NAME, input_ids=torch.randint(VOCAB, (2, 12)))
    assert len(calls) == model.config.num_hidden_layers


def test_window_size_matches_transformers_sliding_window():
    i, j = torch.arange(12)[:, None], torch.arange(12)[None, :]
    for sliding_window in range(1, 14):
        left, right = window_size(sliding_window, causal=True)
        ours = (j <= i) & (j >= i - left) & (j <= i + right)
        theirs = sliding_window_causal_mask_function(sliding_window)(0, 0, i, j)
        assert torch.equal(ours, theirs), sliding_window
    assert window_size(None, causal=True) == (-1, -1)


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("arch", ARCHS)
def test_float32_logits_and_gradients_match_sdpa_and_eager(arch, make_model):
    # Tolerances: a few times the gap between sdpa and eager themselves (relative to the largest logit, and per
    # parameter relative to the gradient's norm).
    model = make_model(arch, torch.float32)
    input_ids = torch.randint(VOCAB, (2, 24))
    weights = torch.randn(2, 24, VOCAB)
    ours, our_grads = logits_and_grads(model, NAME, input_ids, weights)
    for reference in ("sdpa", "eager"):
        expected, grads = logits_and_grads(model, reference, input_ids, weights)
        assert (ours - expected).abs().max() <= 1e-5 * expected.abs().max(), reference
        for name, grad in grads.items():
            assert relative_error(our_grads[name], grad) <= 2e-5, (reference, name)


@pytest.mark.parametrize("arch", ARCHS)
def test_bfloat16_logits_and_gradients_by_flash_attn_rule(arch, make_model):
    """flash-attn's rule for low precision: against the same model in float32 (eager), our bf16 error is at most 2x
    (logits) and 3x (gradients) that of transformers' own bf16 attention (sdpa and eager), plus a small floor."""
    model = make_model(arch, torch.bfloat16)
    exact = copy.deepcopy(model).float()
    input_ids = torch.randint(VOCAB, (2, 24))
    weights = torch.randn(2, 24, VOCAB)
    truth, true_grads = logits_and_grads(exact, "eager", input_ids, weights)
    ours, our_grads = logits_and_grads(model, NAME, input_ids, weights)
    for reference in ("sdpa", "eager"):
        theirs, their_grads = logits_and_grads(model, reference, input_ids, weights)
        assert relative_error(ours, truth) <= 2 * relative_error(theirs, truth) + 1e-3, reference
        for name, true_grad in true_grads.items():
            ours_error = relative_error(our_grads[name], true_grad)
            assert ours_error <= 3 * relative_error(their_grads[name], true_grad) + 1e-3, (reference, name, ours_error)


@pytest.mark.parametrize("arch", ARCHS)
def test_bf16_autocast_over_float32_weights_matches_sdpa(arch, make_model):
    """Under autocast RoPE hands over float32 q, k and a bfloat16 v, as in mixed-precision training. flash-attn's
    rule against the same model without autocast: our error at most 2x (logits) and 3x (gradients) that of sdpa
    under the same autocast, plus a small floor. (Compared with sdpa directly, two bf16 computations differ by up to
    ~3% of a small gradient's norm on some inputs, though each is as far from float32 as the other.)"""
    model = make_model(arch)
    input_ids = torch.randint(VOCAB, (2, 24))
    weights = torch.randn(2, 24, VOCAB)
    truth, true_grads = logits_and_grads(model, "eager", input_ids, weights)
    ours, our_grads = logits_and_grads(model, NAME, input_ids, weights, dtype=torch.bfloat16)
    theirs, their_grads = logits_and_grads(model, "sdpa", input_ids, weights, dtype=torch.bfloat16)
    assert relative_error(ours, truth) <= 2 * relative_error(theirs, truth) + 1e-3
    for name, true_grad in true_grads.items():
        ours_error = relative_error(our_grads[name], true_grad)
        assert ours_error <= 3 * relative_error(their_grads[name], true_grad) + 1e-3, (name, ours_error)


def test_sliding_window_changes_logits_after_the_window(make_model):
    model = make_model("mistral")
    input_ids = torch.randint(VOCAB, (1, 24))
    windowed = logits(model, NAME, input_ids=input_ids)
    model.config.sliding_window = None
    full = logits(model, "sdpa", input_ids=input_ids)
    torch.testing.assert_close(windowed[:, :WINDOW], full[:, :WINDOW])
    assert not torch.allclose(windowed[:, WINDOW:], full[:, WINDOW:], atol=1e-3)


@pytest.mark.parametrize("switch", ["off", "torch", "env"])
def test_deterministic_mode_reaches_the_backward(switch, monkeypatch, make_model, deterministic_mode):
    """torch.use_deterministic_algorithms(True) or FLASH_ATTENTION_DETERMINISTIC=1: every backward call of the
    kernels runs without atomics (batch.deterministic), dense and packed rows alike; else with them."""
    if switch == "torch":
        deterministic_mode()
    monkeypatch.setenv("FLASH_ATTENTION_DETERMINISTIC", "1" if switch == "env" else "0")
    reference = backends.get("reference")
    seen = []
    backward = type(reference).backward
    monkeypatch.setattr(
        type(reference), "backward", lambda self, batch, *a: seen.append(batch) or backward(self, batch, *a)
    )
    model = make_model("llama").train()
    positions = torch.tensor([[*range(7), *range(5)]])  # two documents: the varlen path
    for extra in ({}, {"position_ids": positions}):
        model(input_ids=torch.randint(VOCAB, (1, 12)), use_cache=False, **extra).logits.sum().backward()
    assert len(seen) == 2 * model.config.num_hidden_layers
    assert {batch.varlen for batch in seen} == {False, True}
    assert {batch.deterministic for batch in seen} == {switch != "off"}


def random_documents(rows: int, length: int) -> list[list[int]]:
    """Document lengths filling each row exactly, the longer ones past the sliding window."""
    documents = []
    for _ in range(rows):
        cuts = sorted(torch.randperm(length - 1)[:2].add(1).tolist())
        documents.append([b - a for a, b in zip([0, *cuts], [*cuts, length], strict=True)])
    return documents


@pytest.mark.parametrize("arch", ARCHS)
def test_packed_rows_give_each_document_its_own_logits(arch, make_model):
    model = make_model(arch)
    lengths = random_documents(rows=2, length=30)
    input_ids = torch.randint(VOCAB, (2, 30))
    position_ids = torch.tensor([[p for n in row for p in range(n)] for row in lengths])
    packed = logits(model, NAME, input_ids=input_ids, position_ids=position_ids)
    for row, row_lengths in enumerate(lengths):
        start = 0
        for n in row_lengths:
            alone = logits(model, "sdpa", input_ids=input_ids[row : row + 1, start : start + n])
            torch.testing.assert_close(packed[row, start : start + n], alone[0], atol=2e-5, rtol=1e-4)
            start += n


def test_packed_and_padded_rows_give_each_document_its_own_logits(make_model):
    model = make_model("mistral")
    lengths = [[5, 11], [12, 3, 9]]  # the first row ends with 8 padding tokens
    input_ids = torch.randint(1, VOCAB, (2, 24))
    mask = torch.ones(2, 24, dtype=torch.long)
    mask[0, 16:] = 0
    position_ids = torch.tensor([[*range(5), *range(11), *range(8)], [*range(12), *range(3), *range(9)]])
    packed = logits(model, NAME, input_ids=input_ids, attention_mask=mask, position_ids=position_ids)
    for row, row_lengths in enumerate(lengths):
        start = 0
        for n in row_lengths:
            alone = logits(model, "sdpa", input_ids=input_ids[row : row + 1, start : start + n])
            torch.testing.assert_close(packed[row, start : start + n], alone[0], atol=2e-5, rtol=1e-4)
            start += n


def test_padded_rows_find_their_documents_once_per_forward(monkeypatch, make_model):
    """The host syncs of a padded (and restarting) batch's documents run once per forward, not once per layer: every
    layer gets the same mask and position_ids, and the same cu_seqlens back."""
    found, cu_seqlens = [], []
    find = legalpt.hf._find_documents
    monkeypatch.setattr(legalpt.hf, "_find_documents", lambda *args: found.append(1) or find(*args))
    varlen = legalpt.hf.flash_attn_varlen_func
    monkeypatch.setattr(legalpt.hf, "flash_attn_varlen_func", lambda q, k, v, cu_q, *a, **kw: cu_seqlens.append(cu_q)
                        or varlen(q, k, v, cu_q, *a, **kw))  # fmt: skip
    model = make_model("llama")
    assert model.config.num_hidden_layers > 1
    mask = torch.ones(2, 24, dtype=torch.long)
    mask[0, 16:] = 0
    position_ids = torch.tensor([[*range(5), *range(11), *range(8)], [*range(12), *range(3), *range(9)]])
    for forward in range(2):  # a new mask and new position_ids: found again
        logits(model, NAME, input_ids=torch.randint(1, VOCAB, (2, 24)), attention_mask=mask.clone(),
               position_ids=position_ids.clone())  # fmt: skip
        assert len(found) == forward + 1
    layers = model.config.num_hidden_layers
    assert len(cu_seqlens) == 2 * layers
    assert all(cu is cu_seqlens[0] for cu in cu_seqlens[:layers])
    assert cu_seqlens[0].tolist() == [0, 5, 16, 16, 28, 31, 40]  # row 0's padding: an empty document


@pytest.mark.parametrize("arch", ARCHS)
def test_cu_seq_lens_kwargs_separate_documents(arch, make_model):
    # Positions run on across documents: RoPE is relative, so only cu_seq_lens keeps the documents apart.
    model = make_model(arch)
    lengths = random_documents(rows=1, length=40)[0]
    input_ids = torch.randint(VOCAB, (1, 40))
    cu_seq_lens = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    kwargs = {"cu_seq_lens_q": cu_seq_lens, "cu_seq_lens_k": cu_seq_lens, "max_length_q": max(lengths)}
    packed = logits(model, NAME, input_ids=input_ids, **kwargs, max_length_k=max(lengths))
    for start, end in zip(cu_seq_lens[:-1].tolist(), cu_seq_lens[1:].tolist(), strict=True):
        alone = logits(model, "sdpa", input_ids=input_ids[:, start:end])
        torch.testing.assert_close(packed[0, start:end], alone[0], atol=2e-5, rtol=1e-4)


def padded_batch(lengths: list[int], side: str) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(lengths)
    input_ids = torch.randint(1, VOCAB, (len(lengths), width))
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for row, n in enumerate(lengths):
        mask[row, :n] = 1
    if side == "left":
        mask = mask.flip(1)
    return input_ids.masked_fill(mask == 0, 0), mask


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("side", ["right", "left"])
def test_padded_batch_matches_sdpa_on_real_tokens(arch, side, make_model):
    model = make_model(arch)
    input_ids, mask = padded_batch([20, 13, 6], side)
    ours = logits(model, NAME, input_ids=input_ids, attention_mask=mask)
    expected = logits(model, "sdpa", input_ids=input_ids, attention_mask=mask)
    real = mask.bool()
    torch.testing.assert_close(ours[real], expected[real], atol=2e-5, rtol=1e-4)


def generate(model, implementation: str, input_ids, mask, **kwargs):
    model.set_attn_implementation(implementation)
    out = model.generate(
        input_ids=input_ids,
        attention_mask=mask,
        max_new_tokens=6,
        do_sample=False,
        output_scores=True,
        return_dict_in_generate=True,
        **kwargs,
    )
    return out.sequences, torch.stack(out.scores)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("cache_implementation", ["dynamic", "static"])
@pytest.mark.parametrize("lengths", [[11, 5], [9, 9]])  # left-padded, and without padding
def test_greedy_generation_with_cache_matches_sdpa_and_eager(
    arch, cache_implementation, lengths, make_model, monkeypatch
):
    model = make_model(arch)
    input_ids, mask = padded_batch(lengths, "left")
    kwargs = {"pad_token_id": 0, "eos_token_id": None, "cache_implementation": cache_implementation}
    over_cache = []
    real = legalpt.hf.flash_attn_with_kvcache
    monkeypatch.setattr(legalpt.hf, "flash_attn_with_kvcache", lambda *a, **kw: over_cache.append(1) or real(*a, **kw))
    ours, our_scores = generate(model, NAME, input_ids, mask, **kwargs)
    for reference in ("sdpa", "eager"):
        expected, scores = generate(model, reference, input_ids, mask, **kwargs)
        torch.testing.assert_close(our_scores, scores, atol=2e-5, rtol=1e-4, msg=reference)
        assert torch.equal(ours, expected), reference
    # Padding gives decoding a key mask, so it reads the cache in place (sliding-window caches drop the padded slots
    # once the window passes them, and then need none); a dynamic cache without padding has no mask, and
    # flash_attn_func reads it. Static caches' empty slots give a mask depending on the cache's layer kind.
    padded = lengths[0] != lengths[1]
    assert bool(over_cache) if padded else (cache_implementation == "static" or not over_cache)


@pytest.mark.parametrize(("hole", "over_cache"), [(False, 1), (True, 0)])
def test_decoding_reads_a_left_padded_cache_in_place_and_gathers_around_a_hole(hole, over_cache, monkeypatch):
    """One query per row past a GQA cache of 12 slots, row 0 left-padded by 4 and row 1 (with `hole`) missing slots
    3 and 4: equal to sdpa over the real slots, through flash_attn_with_kvcache only when all padding comes first."""
    q, k, v = torch.randn(2, 4, 1, 8), torch.randn(2, 2, 12, 8), torch.randn(2, 2, 12, 8)  # (B, H, S, D)
    mask = torch.ones(2, 12, dtype=torch.bool)
    mask[0, :4] = False
    mask[1, 3:5] = not hole
    calls = []
    real = legalpt.hf.flash_attn_with_kvcache
    monkeypatch.setattr(legalpt.hf, "flash_attn_with_kvcache", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    module = torch.nn.Module()
    out, _ = legalpt.hf.attention_forward(module, q, k, v, mask, scaling=0.3, is_causal=True)  # (B, 1, H, D)
    expected = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=mask[:, None, None], scale=0.3, enable_gqa=True
    )
    torch.testing.assert_close(out, expected.transpose(1, 2), atol=1e-5, rtol=1e-5)
    assert len(calls) == over_cache


def test_unsupported_inputs_raise(make_model):
    model = make_model("llama")
    input_ids = torch.randint(VOCAB, (2, 8))
    model.set_attn_implementation(NAME)
    with pytest.raises(ValueError, match="2D padding mask"):
        model(input_ids=input_ids, attention_mask=torch.ones(2, 1, 8, 8, dtype=torch.bool), use_cache=False)
    cu_seq_lens = torch.tensor([0, 8, 16])
    with pytest.raises(ValueError, match="cu_seq_lens_q"):
        model(
            input_ids=input_ids,
            attention_mask=torch.tensor([[1] * 8, [0] + [1] * 7]),
            cu_seq_lens_q=cu_seq_lens,
            cu_seq_lens_k=cu_seq_lens,
            use_cache=False,
        )
