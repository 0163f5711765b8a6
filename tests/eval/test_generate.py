"""Batched generation against a plain greedy loop without a cache, and the benchmark script's smoke mode."""

import json
import logging
import random
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit
from transformers import PreTrainedTokenizerFast

import legalpt.hf
from legalpt.config import GenerationConfig
from legalpt.eval.generate import generate, generate_with_stats
from legalpt.model import build_model

ROOT = Path(__file__).resolve().parents[2]
WORDS = 300  # ordinary words w0 .. w299 after the four special tokens
MARGIN = 1e-3  # logit gap below which greedy decoding counts as a tie
SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]


def make_tokenizer(eos: str = "</s>") -> PreTrainedTokenizerFast:
    """A word-level tokenizer: one token per word, and decoding joins words with spaces, so texts compare exactly."""
    words = SPECIALS + [f"w{i}" for i in range(WORDS)]
    tokenizer = Tokenizer(WordLevel({word: i for i, word in enumerate(words)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token=eos, pad_token="<pad>"
    )


@pytest.fixture
def make_model(tiny_model_config) -> Callable[..., torch.nn.Module]:
    """A function of a tokenizer and ModelConfig overrides: the `tiny` preset, untied, with matrices drawn wider than
    at init so that the context (and any padding that leaks into attention) changes which token wins."""

    def make(tokenizer: PreTrainedTokenizerFast, **overrides) -> torch.nn.Module:
        model = build_model(tiny_model_config(tie_word_embeddings=False, **overrides), tokenizer)
        with torch.no_grad():
            for parameter in model.parameters():
                if parameter.ndim == 2:
                    parameter.normal_(std=0.1)
        return model.eval()

    return make


def random_prompt(length: int) -> str:
    return " ".join(f"w{random.randrange(WORDS)}" for _ in range(length))


def greedy_reference(model, tokenizer, prompt_ids: list[int], steps: int) -> list[int]:
    """Token by token: the whole sequence recomputed with sdpa at each step, no cache, no padding."""
    return greedy_with_margin(model, tokenizer, prompt_ids, steps)[0]


def greedy_with_margin(
    model, tokenizer, prompt_ids: list[int], steps: int, stop_at_eos: bool = True
) -> tuple[list[int], float]:
    """`greedy_reference`, and the smallest gap between the two best logits on the way: where it is near 0 greedy
    decoding is a tie, which rounding in another (correct) attention path may break the other way."""
    implementation = model.config._attn_implementation
    model.set_attn_implementation("sdpa")
    tokens, margin = list(prompt_ids), float("inf")
    with torch.no_grad():
        for _ in range(steps):
            top = model(torch.tensor([tokens]), use_cache=False).logits[0, -1].topk(2)
            tokens.append(int(top.indices[0]))
            margin = min(margin, float(top.values[0] - top.values[1]))
            if stop_at_eos and tokens[-1] == tokenizer.eos_token_id:
                break
    model.set_attn_implementation(implementation)
    return tokens[len(prompt_ids) :], margin


def well_defined_prompts(
    model, tokenizer, lengths: list[int], steps: int, stop_at_eos: bool = True
) -> tuple[list[str], list[list[int]]]:
    """Fresh random prompts on which greedy decoding has no near-tie, and the tokens each one produces."""
    for _ in range(50):
        prompts = [random_prompt(n) for n in lengths]
        runs = [greedy_with_margin(model, tokenizer, encode(tokenizer, p), steps, stop_at_eos) for p in prompts]
        if min(margin for _, margin in runs) > MARGIN:
            return prompts, [tokens for tokens, _ in runs]
    raise AssertionError("no prompts without a near-tie in 50 draws: the test model is degenerate")


def encode(tokenizer, prompt: str) -> list[int]:
    return tokenizer(prompt, add_special_tokens=False)["input_ids"]


def test_greedy_batches_match_a_loop_without_cache_in_prompt_order(make_model):
    tokenizer = make_tokenizer()
    model = make_model(tokenizer)
    lengths = [5, 31, 12, 2, 31, 18, 9]  # unsorted, with a tie, so sorting and batching reorder them
    cfg = GenerationConfig(max_new_tokens=7, batch_size=3)
    # The eos chosen below: an ordinary word, first produced by prompt 0 at its third step, and no prefix of any prompt
    # word (a special token is matched inside raw text, so eos "w1" would also split "w12"). The draws decode past
    # "</s>", as every row does once eos is that word: prompt 0 has a third step even where "</s>" came first, and no
    # step the rows take goes unchecked for near-ties.
    while True:
        prompts, free = well_defined_prompts(model, tokenizer, lengths, cfg.max_new_tokens, stop_at_eos=False)
        word = tokenizer.convert_ids_to_tokens(free[0][2])
        clash = any(w.startswith(word) for p in prompts for w in p.split())
        if free[0][2] not in free[0][:2] and word.startswith("w") and not clash:
            break
    # Make a token that prompt 0 produces at its third step the eos, so at least one row stops early.
    tokenizer = make_tokenizer(eos=tokenizer.convert_ids_to_tokens(free[0][2]))
    expected = [greedy_reference(model, tokenizer, encode(tokenizer, p), cfg.max_new_tokens) for p in prompts]
    assert len(expected[0]) <= 3 and expected[0][-1] == tokenizer.eos_token_id

    result = generate_with_stats(model, tokenizer, prompts, cfg)

    assert result.texts == tokenizer.batch_decode(expected, skip_special_tokens=True)
    assert result.new_tokens == [len(tokens) for tokens in expected]
    assert result.prompt_tokens == lengths
    assert result.truncated == [0] * len(prompts)
    assert result.seconds > 0
    assert generate(model, tokenizer, prompts, cfg) == result.texts


def test_legalpt_and_sdpa_attention_generate_the_same_tokens(make_model):
    tokenizer = make_tokenizer()
    model = make_model(tokenizer)
    cfg = GenerationConfig(max_new_tokens=10, batch_size=4)
    prompts, _ = well_defined_prompts(model, tokenizer, [3, 17, 40, 8], cfg.max_new_tokens, stop_at_eos=False)
    assert model.config._attn_implementation == legalpt.hf.NAME
    ours = generate_with_stats(model, tokenizer, prompts, cfg, min_new_tokens=cfg.max_new_tokens)
    model.set_attn_implementation("sdpa")
    expected = generate_with_stats(model, tokenizer, prompts, cfg, min_new_tokens=cfg.max_new_tokens)
    assert ours.texts == expected.texts
    assert ours.new_tokens == [cfg.max_new_tokens] * len(prompts)


def recording(monkeypatch) -> list[tuple[str, tuple[int, ...], tuple[int, ...]]]:
    """Record (function, q shape, k shape) of every legalpt attention call that transformers makes."""
    calls = []
    for name in ("flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache"):
        original = getattr(legalpt.hf, name)

        def wrapped(q, k, *args, _name=name, _original=original, **kwargs):
            calls.append((_name, tuple(q.shape[:-2]), tuple(k.shape[:-2])))
            return _original(q, k, *args, **kwargs)

        monkeypatch.setattr(legalpt.hf, name, wrapped)
    return calls


def test_prefill_and_every_decode_step_run_legalpt_attention(monkeypatch, make_model):
    tokenizer = make_tokenizer()
    model = make_model(tokenizer)
    layers, steps = model.config.num_hidden_layers, 5
    cfg = GenerationConfig(max_new_tokens=steps, batch_size=2)
    calls = recording(monkeypatch)

    generate(model, tokenizer, [random_prompt(3), random_prompt(9)], cfg, min_new_tokens=steps)

    # Padded batch: varlen over the 12 real prompt tokens, then one query per row over the left-padded cache where it
    # lies (9 slots per row after the prompt, one more each step).
    expected = [("flash_attn_varlen_func", (12,), (12,))] * layers
    for step in range(1, steps):
        expected += [("flash_attn_with_kvcache", (2, 1), (2, 9 + step))] * layers
    assert calls == expected

    calls.clear()
    generate(model, tokenizer, [random_prompt(6)], cfg, min_new_tokens=steps)
    expected = [("flash_attn_func", (1, 6), (1, 6))] * layers  # no padding: the dense function
    for step in range(1, steps):
        expected += [("flash_attn_func", (1, 1), (1, 6 + step))] * layers
    assert calls == expected


def test_sampling_repeats_with_its_seed_and_leaves_the_global_rng_alone(make_model):
    tokenizer = make_tokenizer()
    model = make_model(tokenizer)
    prompts = [random_prompt(n) for n in (4, 11, 20)]
    cfg = GenerationConfig(max_new_tokens=12, do_sample=True, temperature=1.5, top_p=0.95, batch_size=2)
    state = torch.get_rng_state()
    first = generate(model, tokenizer, prompts, cfg, seed=3)
    assert torch.equal(torch.get_rng_state(), state)
    torch.manual_seed(random.randrange(2**31))  # the global seed plays no part
    assert generate(model, tokenizer, prompts, cfg, seed=3) == first
    assert generate(model, tokenizer, prompts, cfg, seed=4) != first
    greedy = generate(model, tokenizer, prompts, GenerationConfig(max_new_tokens=12, batch_size=2))
    assert greedy != first
    # A nucleus this small keeps only the top token: sampling is then greedy, so top_p reaches the sampler.
    narrow = GenerationConfig(max_new_tokens=12, do_sample=True, top_p=1e-6, batch_size=2)
    assert generate(model, tokenizer, prompts, narrow, seed=5) == greedy


def test_long_prompts_keep_their_last_tokens_and_are_counted(caplog, make_model):
    tokenizer = make_tokenizer()
    model = make_model(tokenizer, max_position_embeddings=32)
    cfg = GenerationConfig(max_new_tokens=8, batch_size=2)  # room for 24 prompt tokens
    prompts = [random_prompt(40), random_prompt(10), random_prompt(25)]
    expected = [greedy_reference(model, tokenizer, encode(tokenizer, p)[-24:], 8) for p in prompts]
    model.train()
    with caplog.at_level(logging.WARNING, logger="legalpt.eval.generate"):
        result = generate_with_stats(model, tokenizer, prompts, cfg)
    assert model.training  # the caller's mode comes back
    assert result.truncated == [16, 0, 1]
    assert result.prompt_tokens == [24, 10, 24]
    assert "2 of 3 prompts" in caplog.text and "17 tokens" in caplog.text
    assert result.texts == tokenizer.batch_decode(expected, skip_special_tokens=True)


def test_empty_prompt_list_gives_an_empty_list(make_model):
    tokenizer = make_tokenizer()
    assert generate(make_model(tokenizer), tokenizer, [], GenerationConfig()) == []


@pytest.mark.parametrize(
    ("prompts", "cfg", "extra", "error", "message"),
    [
        ("w1 w2", GenerationConfig(), {}, TypeError, "prompts: expected a list of str"),
        (["w1", 7], GenerationConfig(), {}, TypeError, "prompts: expected a list of str"),
        (["w1", "  "], GenerationConfig(), {}, ValueError, r"prompts\[1\]"),
        (["w1"], GenerationConfig(max_new_tokens=0), {}, ValueError, "generation.max_new_tokens"),
        (["w1"], GenerationConfig(max_new_tokens=2048), {}, ValueError, "max_position_embeddings=2048"),
        (["w1"], GenerationConfig(batch_size=0), {}, ValueError, "generation.batch_size"),
        (["w1"], GenerationConfig(do_sample=True, temperature=0.0), {}, ValueError, "generation.temperature"),
        (["w1"], GenerationConfig(do_sample=True, top_p=0.0), {}, ValueError, "generation.top_p"),
        (["w1"], GenerationConfig(max_new_tokens=4), {"min_new_tokens": 5}, ValueError, "min_new_tokens"),
        (["w1"], GenerationConfig(), {"seed": 1.5}, TypeError, "seed"),
    ],
)
def test_bad_arguments_raise_before_generating(prompts, cfg, extra, error, message, make_model):
    tokenizer = make_tokenizer()
    with pytest.raises(error, match=message):
        generate(make_model(tokenizer), tokenizer, prompts, cfg, **extra)


def test_bench_script_smoke_mode_writes_its_json(tmp_path):
    command = [
        sys.executable, str(ROOT / "scripts" / "bench_generate.py"), "--preset", "tiny", "--device", "cpu",
        "--prompts", "6", "--prompt-tokens", "32", "--max-new-tokens", "4", "--batch-sizes", "2", "4",
        "--documents", "4", "--vocab-size", "512", "--out", str(tmp_path),
    ]  # fmt: skip
    finished = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert finished.returncode == 0, finished.stderr[-3000:]
    (path,) = tmp_path.glob("generate-cpu*-*.json")
    record = json.loads(path.read_text())
    assert {"gpu", "torch", "transformers", "cuda", "commit", "date", "command"} <= set(record["header"])
    rows = record["rows"]
    assert [(row["attention"], row["batch_size"]) for row in rows] == [
        ("legalpt", 2), ("sdpa", 2), ("legalpt", 4), ("sdpa", 4)
    ]  # fmt: skip
    for row in rows:
        assert row["prompts"] == 6 and row["new_tokens"] == 6 * 4
        assert row["prompts_per_s"] > 0 and row["new_tokens_per_s"] > 0
        assert len(row["repeats_s"]) == 2 and row["seconds"] == min(row["repeats_s"])  # the fastest of --repeats
    assert rows[0]["ratio_vs_sdpa"] == pytest.approx(rows[0]["new_tokens_per_s"] / rows[1]["new_tokens_per_s"])
    assert "new tokens/s" in finished.stdout


def test_bench_script_profile_says_where_a_call_spends_its_time(tmp_path):
    command = [
        sys.executable, str(ROOT / "scripts" / "bench_generate.py"), "--preset", "tiny", "--device", "cpu",
        "--prompts", "2", "--prompt-tokens", "16", "--max-new-tokens", "3", "--batch-sizes", "2",
        "--documents", "4", "--vocab-size", "512", "--repeats", "1", "--profile", "--out", str(tmp_path),
    ]  # fmt: skip
    finished = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert finished.returncode == 0, finished.stderr[-3000:]
    (path,) = tmp_path.glob("generate-cpu*-*.json")
    for row in json.loads(path.read_text())["rows"]:
        assert row["profile"]["steps"] == 1 and row["profile"]["wall_ms"] > 0 and len(row["repeats_s"]) == 1
        assert row["profile"]["device_busy_ms"] == 0  # no GPU: no kernels
    assert finished.stdout.count("one generate() call of 2 prompts") == 2
    assert "Self CPU" in finished.stdout


def test_bench_script_interleaves_the_timed_runs(load_script):
    bench = load_script("bench_generate")
    assert bench.interleaved(3) == ["legalpt", "sdpa", "sdpa", "legalpt", "legalpt", "sdpa"]
