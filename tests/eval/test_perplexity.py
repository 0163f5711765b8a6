"""Document perplexity and bits per byte: windows, batching with padding, bos handling, grouping, intervals, checks."""

import dataclasses
import math
import random
from collections.abc import Callable
from types import SimpleNamespace

import pytest
import torch
from eval_helpers import SPECIALS, VOCAB, make_tokenizer
from transformers import PreTrainedTokenizerFast

from legalpt.eval.perplexity import document_perplexity, heldout_loss, resolve_window, stride_windows
from legalpt.model import build_model


def random_text(rng: random.Random, words: int) -> str:
    """Random known words, with an unknown multi-byte word now and then (bytes != characters)."""
    pool = [f"w{i}" for i in range(VOCAB - len(SPECIALS))] + ["café", "§§"]
    return " ".join(rng.choices(pool, k=words))


@pytest.fixture
def models(tiny_model_config) -> Callable[[PreTrainedTokenizerFast], tuple[torch.nn.Module, torch.nn.Module]]:
    """A function of a tokenizer: a tiny Llama on legalpt attention (the preset, narrower, on the reference backend,
    with 48 positions), and the same weights on transformers' sdpa as the reference."""
    tiny = tiny_model_config(
        hidden_size=32, intermediate_size=64, max_position_embeddings=48, attention_backend="reference"
    )

    def make(tokenizer: PreTrainedTokenizerFast) -> tuple[torch.nn.Module, torch.nn.Module]:
        model = build_model(tiny, tokenizer)
        reference = build_model(dataclasses.replace(tiny, attn_implementation="sdpa"), tokenizer)
        reference.load_state_dict(model.state_dict())
        return model.eval(), reference.eval()

    return make


def token_ids(tokenizer: PreTrainedTokenizerFast, text: str, bos: bool) -> list[int]:
    return [tokenizer.bos_token_id] * bos + tokenizer(text, add_special_tokens=False)["input_ids"]


def scored_bytes(text: str, bos: bool) -> int:
    """UTF-8 bytes after the first word, which nothing predicts without a bos token."""
    return len(text.encode()) - (0 if bos else len(text.split(" ")[0].encode()))


@torch.no_grad()
def full_forward_nll(model: torch.nn.Module, ids: list[int]) -> float:
    logprobs = torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), dim=-1)  # (S, V)
    return -logprobs[:-1].gather(1, torch.tensor(ids[1:])[:, None]).sum().item()


@torch.no_grad()
def strided_nll(model: torch.nn.Module, ids: list[int], context: int, stride: int) -> float:
    """Token by token: token t seen from the window start s*k with the most left context, t < s*k + context."""
    total = 0.0
    for t in range(1, len(ids)):
        begin = 0 if t < context else ((t - context) // stride + 1) * stride
        logits = model(torch.tensor([ids[begin:t]])).logits[0, -1].double()
        total -= torch.log_softmax(logits, dim=-1)[ids[t]].item()
    return total


class Forced(torch.nn.Module):
    """Logits that put (nearly) all mass on `successor[token]`: a model that knows the next token, or one that
    knows nothing (margin 0: uniform)."""

    def __init__(self, successor: torch.Tensor, margin: float, max_positions: int = 48):
        super().__init__()
        self.successor, self.margin = successor, margin
        self.anchor = torch.nn.Parameter(torch.zeros(()))  # gives the model a device
        self.config = SimpleNamespace(max_position_embeddings=max_positions)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> SimpleNamespace:
        logits = torch.zeros(*input_ids.shape, len(self.successor))  # (B, L, V)
        logits.scatter_(-1, self.successor[input_ids][..., None], self.margin)
        return SimpleNamespace(logits=logits)


def test_stride_windows_score_each_token_once_with_the_most_context(rng):
    for _ in range(300):
        length, context = rng.randint(0, 60), rng.randint(2, 20)
        stride = rng.randint(1, context - 1)
        windows = stride_windows(length, context, stride)
        scored = [t for _, end, first in windows for t in range(first, end)]
        assert scored == list(range(1, length))  # once each, in order, all but the first
        for begin, end, first in windows:
            assert 0 <= begin < first < end <= begin + context
            # Context of each scored token: all before it, or at least context - stride tokens.
            assert first - begin >= min(first, context - stride)
        assert windows == [] or windows[-1][1] == length


@pytest.mark.parametrize("bos", [False, True])
def test_documents_that_fit_match_one_full_forward(rng, bos, models):
    tokenizer = make_tokenizer(bos)
    model, reference = models(tokenizer)
    docs = [{"id": f"d{i}", "text": random_text(rng, rng.randint(2, 30)), "kind": "opinion"} for i in range(5)]
    result = document_perplexity(model, tokenizer, docs, context=40, stride=10, batch_size=3, samples=50)
    assert result["first_token"] == ("predicted from bos" if bos else "not scored")
    assert [row["id"] for row in result["per_document"]] == [doc["id"] for doc in docs]
    for doc, row in zip(docs, result["per_document"], strict=True):
        ids = token_ids(tokenizer, doc["text"], bos)
        assert row["tokens"] == len(ids) - 1
        assert row["bytes"] == scored_bytes(doc["text"], bos)
        assert row["nll"] == pytest.approx(full_forward_nll(reference, ids), rel=1e-4)
        assert row["bits_per_byte"] == pytest.approx(row["nll"] / math.log(2) / row["bytes"])


def test_long_documents_match_the_strided_reference(rng, models):
    tokenizer = make_tokenizer(bos=False)
    model, reference = models(tokenizer)
    lengths = [rng.randint(40, 70), 16, rng.randint(17, 30), 5, rng.randint(40, 70)]
    docs = [{"id": str(i), "text": random_text(rng, n), "kind": "contract"} for i, n in enumerate(lengths)]
    context, stride = 16, rng.randint(3, 8)
    result = document_perplexity(model, tokenizer, docs, context, stride, batch_size=4, samples=0)
    assert (result["context"], result["stride"]) == (context, stride)
    for doc, row in zip(docs, result["per_document"], strict=True):
        ids = token_ids(tokenizer, doc["text"], bos=False)
        assert row["nll"] == pytest.approx(strided_nll(reference, ids, context, stride), rel=1e-4)


def test_groups_by_kind_and_over_all(rng, models):
    tokenizer = make_tokenizer(bos=True)
    model, _ = models(tokenizer)
    kinds = ["contract", "opinion", "other", "opinion", "contract", "opinion"]
    docs = [{"id": i, "text": random_text(rng, rng.randint(3, 60)), "kind": k} for i, k in enumerate(kinds)]
    result = document_perplexity(model, tokenizer, docs, context=24, stride=8, batch_size=2, samples=100, seed=3)
    assert set(result["by_kind"]) == {"all", "contract", "opinion", "other"}
    for kind, summary in result["by_kind"].items():
        rows = [row for row in result["per_document"] if kind in ("all", row["kind"])]
        nll, tokens, num_bytes = (sum(row[key] for row in rows) for key in ("nll", "tokens", "bytes"))
        assert (summary["documents"], summary["tokens"], summary["bytes"]) == (len(rows), tokens, num_bytes)
        assert summary["loss"] == pytest.approx(nll / tokens)
        assert summary["perplexity"] == pytest.approx(math.exp(nll / tokens))
        assert summary["bits_per_byte"] == pytest.approx(nll / math.log(2) / num_bytes)
        low, high = summary["bits_per_byte_ci"]
        if len(rows) == 1:
            assert low == pytest.approx(summary["bits_per_byte"]) == pytest.approx(high)
        else:
            assert min(r["bits_per_byte"] for r in rows) <= low <= summary["bits_per_byte"] <= high
            assert low < high <= max(r["bits_per_byte"] for r in rows)
    assert result["by_kind"]["all"]["documents"] == len(docs)
    again = document_perplexity(model, tokenizer, docs, context=24, stride=8, batch_size=5, samples=100, seed=3)
    assert again["by_kind"]["all"]["bits_per_byte_ci"] == pytest.approx(result["by_kind"]["all"]["bits_per_byte_ci"])


def test_a_model_that_knows_the_next_token_has_zero_loss(rng):
    tokenizer = make_tokenizer(bos=False)
    words = VOCAB - len(SPECIALS)
    successor = torch.cat(
        [torch.zeros(len(SPECIALS), dtype=torch.long), len(SPECIALS) + (torch.arange(words) + 1) % words]
    )
    docs = []
    for i in range(4):  # w_k w_k+1 w_k+2 ..., some longer than the window
        start, n = rng.randrange(words), rng.randint(2, 80)
        docs.append({"id": i, "text": " ".join(f"w{(start + j) % words}" for j in range(n)), "kind": "opinion"})
    result = document_perplexity(Forced(successor, 1e4), tokenizer, docs, 20, 7, batch_size=3, samples=10)
    summary = result["by_kind"]["all"]
    assert summary["loss"] < 1e-6 and summary["bits_per_byte"] < 1e-6
    assert summary["perplexity"] == pytest.approx(1.0)


def test_a_uniform_model_costs_log2_vocab_bits_per_token(rng):
    tokenizer = make_tokenizer(bos=True)
    docs = [{"id": i, "text": random_text(rng, rng.randint(1, 70)), "kind": "other"} for i in range(4)]
    model = Forced(torch.zeros(VOCAB, dtype=torch.long), margin=0.0)
    result = document_perplexity(model, tokenizer, docs, 20, 7, batch_size=2, samples=0)
    tokens = sum(len(doc["text"].split()) for doc in docs)  # bos predicts the first word
    num_bytes = sum(len(doc["text"].encode()) for doc in docs)
    summary = result["by_kind"]["all"]
    assert (summary["tokens"], summary["bytes"]) == (tokens, num_bytes)
    assert summary["loss"] == pytest.approx(math.log(VOCAB))
    assert summary["perplexity"] == pytest.approx(VOCAB)
    assert summary["bits_per_byte"] == pytest.approx(tokens * math.log2(VOCAB) / num_bytes)
    assert all(math.isnan(x) for x in summary["bits_per_byte_ci"])  # samples=0: no interval


def test_documents_without_a_prediction_are_counted_not_scored(rng):
    tokenizer = make_tokenizer(bos=False)
    model = Forced(torch.zeros(VOCAB, dtype=torch.long), margin=0.0)
    docs = [
        {"id": "empty", "text": "", "kind": "other"},
        {"id": "one", "text": "w3", "kind": "other"},
        {"id": "two", "text": "w3 café", "kind": "other"},
    ]
    result = document_perplexity(model, tokenizer, docs, 8, 4, batch_size=2, samples=0)
    assert [row["id"] for row in result["per_document"]] == ["two"]
    assert sum(result["skipped"].values()) == 2
    assert result["per_document"][0]["bytes"] == len(" café".encode())
    with pytest.raises(ValueError, match="none of the 2 documents"):
        document_perplexity(model, tokenizer, docs[:2], 8, 4, batch_size=2)


def test_windows_and_inputs_are_checked_before_scoring():
    tokenizer = make_tokenizer(bos=False)
    model = Forced(torch.zeros(VOCAB, dtype=torch.long), margin=0.0, max_positions=32)
    assert resolve_window(model, 0, 0) == (32, 16)
    assert resolve_window(model, 10, 0) == (10, 5)
    docs = [{"id": 0, "text": "w1 w2 w3", "kind": "opinion"}]
    for context, stride, name in [
        (1, 0, "perplexity_context"),
        (33, 4, "perplexity_context"),
        (8, 8, "perplexity_stride"),
        (8, -1, "perplexity_stride"),
    ]:
        with pytest.raises(ValueError, match=rf"eval\.{name}"):
            document_perplexity(model, tokenizer, docs, context, stride, batch_size=1)
    with pytest.raises(ValueError, match=r"eval\.batch_size"):
        document_perplexity(model, tokenizer, docs, 8, 4, batch_size=0)
    with pytest.raises(ValueError, match=r"documents\[0\]"):
        document_perplexity(model, tokenizer, [{"id": 0, "text": "w1 w2"}], 8, 4, batch_size=1)
    with pytest.raises(ValueError, match="reserved"):
        document_perplexity(model, tokenizer, [{"id": 0, "text": "w1 w2", "kind": "all"}], 8, 4, batch_size=1)


class SummedLoss(torch.nn.Module):
    """Stands in for an HF model in `heldout_loss`: a summed loss of 1 nat per predicted token."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(()))

    def forward(self, input_ids, labels, num_items_in_batch) -> SimpleNamespace:
        return SimpleNamespace(loss=(labels[:, 1:] != -100).sum().float())


@pytest.mark.parametrize(("max_batches", "total"), [(0, 5), (3, 3), (9, 5)])
def test_heldout_loss_shows_progress_on_the_main_process_only(monkeypatch, max_batches, total):
    import legalpt.eval.perplexity as perplexity

    bars = []

    class Recorded(perplexity.tqdm):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.shown = not kwargs.get("disable", False)  # tqdm sets `disable` when it closes
            bars.append(self)

    monkeypatch.setattr(perplexity, "tqdm", Recorded)
    batches = [{"input_ids": torch.zeros(2, 4, dtype=torch.long), "labels": torch.ones(2, 4, dtype=torch.long)}] * 5
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    report = heldout_loss(SummedLoss(), batches, max_batches)
    assert report["loss"] == 1.0
    assert (bars[-1].shown, bars[-1].desc, bars[-1].total, bars[-1].n) == (True, "eval", total, total)
    heldout_loss(SummedLoss(), iter(batches), max_batches)  # a generator: the bar counts to max_batches, if any
    assert (bars[-1].total, bars[-1].n) == (max_batches or None, min(max_batches or 5, 5))
    monkeypatch.setenv("LOCAL_RANK", "1")  # another process of a launched job: no bar
    assert heldout_loss(SummedLoss(), batches, max_batches) == report
    assert not bars[-1].shown
    heldout_loss(SummedLoss(), batches, max_batches, progress=True)
    assert bars[-1].shown
