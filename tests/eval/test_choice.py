"""Multiple choice: loading CaseHOLD and LegalBench files, log-likelihood scores, accuracy and its interval."""

import csv
import dataclasses
import json
import math
import random
from types import SimpleNamespace

import pytest
import torch
from eval_helpers import SPECIALS, VOCAB, make_tokenizer

from legalpt.config import CHOICE_FORMATS
from legalpt.eval.choice import (
    LEGALBENCH_PROMPT,
    ChoiceItem,
    load_choice_items,
    score_choices,
    summarize_choices,
)
from legalpt.model import build_model


def words(rng: random.Random, low: int, high: int, pool: int = VOCAB - len(SPECIALS)) -> str:
    return " ".join(f"w{rng.randrange(pool)}" for _ in range(rng.randint(low, high)))


def casehold_rows(rng: random.Random, n: int) -> list[dict]:
    rows = []
    for i in range(n):
        row = {"example_id": 100 + i, "citing_prompt": f"{words(rng, 1, 6)} ( <HOLDING> ) {words(rng, 0, 3)}"}
        row |= {f"holding_{k}": f"holding that {words(rng, 1, 4)}" for k in range(5)}
        rows.append(row | {"label": rng.randrange(5)})
    return rows


def legalbench_rows(rng: random.Random, n: int) -> list[dict]:
    answers = ["Yes", "No", "yes", " NO "]
    return [
        {"text": words(rng, 2, 8), "citation": "Roe v. Wade, 410 U.S. 113", "answer": rng.choice(answers)}
        for _ in range(n)
    ]


def write(path, rows: list[dict]):
    """rows as .csv, .tsv or .jsonl, by the path's suffix."""
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
        return path
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]), delimiter="\t" if path.suffix == ".tsv" else ",")
        writer.writeheader()
        writer.writerows(rows)
    return path


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".jsonl"])
def test_casehold_items_hold_the_prompt_up_to_the_holding(tmp_path, rng, suffix):
    rows = casehold_rows(rng, 6)
    path = write(tmp_path / f"casehold{suffix}", rows)
    for fmt in ("auto", "casehold"):
        items = load_choice_items(str(path), format=fmt)
        assert [item.id for item in items] == [str(row["example_id"]) for row in rows]
        for item, row in zip(items, rows, strict=True):
            assert item.context == row["citing_prompt"][: row["citing_prompt"].index("<HOLDING>")]
            assert item.choices == [row[f"holding_{k}"] for k in range(5)]
            assert item.label == row["label"]


def test_lexglue_casehold_copy_reads_the_same(tmp_path, rng):
    rows = casehold_rows(rng, 3)
    lexglue = [
        {"context": r["citing_prompt"], "endings": [r[f"holding_{k}"] for k in range(5)], "label": r["label"]}
        for r in rows
    ]
    items = load_choice_items(str(write(tmp_path / "lexglue.jsonl", lexglue)))
    expected = load_choice_items(str(write(tmp_path / "casehold.jsonl", rows)))
    assert [(i.context, i.choices, i.label) for i in items] == [(i.context, i.choices, i.label) for i in expected]
    assert [item.id for item in items] == ["0", "1", "2"]


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".jsonl"])
def test_legalbench_items_ask_a_yes_no_question(tmp_path, rng, suffix):
    rows = legalbench_rows(rng, 8)
    path = write(tmp_path / f"legalbench{suffix}", rows)
    for fmt in ("auto", "legalbench"):
        items = load_choice_items(str(path), format=fmt)
        assert len(items) == len(rows)
        for item, row in zip(items, rows, strict=True):
            assert item.context == LEGALBENCH_PROMPT.format(text=row["text"], citation=row["citation"])
            assert [c.strip() for c in item.choices] == ["Yes", "No"]
            assert item.label == (0 if row["answer"].strip().lower() == "yes" else 1)


@pytest.mark.parametrize("fmt", [fmt for fmt in CHOICE_FORMATS if fmt != "auto"])
def test_every_format_the_config_accepts_is_read_and_told_by_its_columns(tmp_path, rng, fmt):
    rows = {"casehold": casehold_rows, "legalbench": legalbench_rows}[fmt](rng, 3)
    path = write(tmp_path / f"{fmt}.jsonl", rows)
    items = load_choice_items(str(path), format=fmt)
    assert len(items) == 3 and load_choice_items(str(path)) == items


def test_bad_sources_and_rows_are_named(tmp_path, rng):
    casehold = write(tmp_path / "casehold.csv", casehold_rows(rng, 2))
    legalbench = write(tmp_path / "legalbench.tsv", legalbench_rows(rng, 2))
    with pytest.raises(ValueError, match=r"legalbench\.tsv.*casehold data needs columns citing_prompt"):
        load_choice_items(str(legalbench), format="casehold")
    with pytest.raises(ValueError, match=r"casehold\.csv.*text, citation, answer"):
        load_choice_items(str(casehold), format="legalbench")
    other = write(tmp_path / "other.csv", [{"question": "q", "answer": "Yes"}])
    with pytest.raises(ValueError, match=r"other\.csv.*match no format.*citing_prompt.*text, citation, answer"):
        load_choice_items(str(other))
    with pytest.raises(ValueError, match=r"eval\.choice_format"):
        load_choice_items(str(casehold), format="mmlu")
    with pytest.raises(FileNotFoundError, match=r"missing\.jsonl"):
        load_choice_items(str(tmp_path / "missing.jsonl"))
    no_holding = casehold_rows(rng, 2)
    no_holding[1]["citing_prompt"] = "w1 w2"
    with pytest.raises(ValueError, match=r"row 1.*<HOLDING>"):
        load_choice_items(str(write(tmp_path / "no_holding.jsonl", no_holding)))
    bad_label = casehold_rows(rng, 1)
    bad_label[0]["label"] = 5
    with pytest.raises(ValueError, match=r"row 0.*label in \[0, 5\)"):
        load_choice_items(str(write(tmp_path / "bad_label.csv", bad_label)))
    maybe = legalbench_rows(rng, 2)
    maybe[0]["answer"] = "Maybe"
    with pytest.raises(ValueError, match=r"row 0.*Yes or No.*Maybe"):
        load_choice_items(str(write(tmp_path / "maybe.jsonl", maybe)))


@torch.no_grad()
def direct_loglik(model: torch.nn.Module, context: list[int], continuation: list[int]) -> float:
    ids = torch.tensor([context + continuation])
    logprobs = torch.log_softmax(model(ids).logits[0].double(), dim=-1)  # (S, V)
    return sum(logprobs[len(context) - 1 + k, token].item() for k, token in enumerate(continuation))


@pytest.mark.parametrize("bos", [False, True])
def test_scores_match_a_direct_loop(rng, bos, tiny_model_config):
    tokenizer = make_tokenizer(bos)
    tiny = tiny_model_config(
        hidden_size=32, intermediate_size=64, max_position_embeddings=40, attention_backend="reference"
    )
    model = build_model(tiny, tokenizer)
    reference = build_model(dataclasses.replace(tiny, attn_implementation="sdpa"), tokenizer)
    reference.load_state_dict(model.state_dict())
    model.train()  # scoring switches to eval mode (no dropout) and back
    choices = [[words(rng, 1, 5) + " §" * rng.randint(0, 2) for _ in range(rng.randint(2, 4))] for _ in range(5)]
    items = [ChoiceItem(f"q{i}", words(rng, 1, 12) + " ", c, 0) for i, c in enumerate(choices)]
    items.append(ChoiceItem("long", words(rng, 45, 50) + " ", ["w1 w2 w3", "w4"], 1))  # over the 40 positions
    rows = score_choices(model, tokenizer, items, batch_size=3)
    assert model.training
    prefix = [tokenizer.bos_token_id] if bos else []
    for item, row in zip(items, rows, strict=True):
        context = tokenizer(item.context, add_special_tokens=False)["input_ids"]
        expected = []
        for choice in item.choices:
            continuation = tokenizer(choice, add_special_tokens=False)["input_ids"]
            kept = context[max(0, len(prefix) + len(context) + len(continuation) - 40) :]
            expected.append(direct_loglik(reference.eval(), prefix + kept, continuation))
        assert row["loglik"] == pytest.approx(expected, rel=1e-4)
        assert row["choice_tokens"] == [len(c.split()) for c in item.choices]
        # Per UTF-8 byte of the continuation, which starts with the space that ended the context ("§" is 2 bytes).
        lengths = [1 + len(c.encode()) for c in item.choices]
        assert row["loglik_norm"] == pytest.approx([s / n for s, n in zip(expected, lengths, strict=True)], rel=1e-4)
        assert row["prediction"] == max(range(len(expected)), key=expected.__getitem__)
        assert (row["truncated"] > 0) == (item.id == "long")


class Rigged(torch.nn.Module):
    """Next-token logits that favour one word everywhere: choices made of it win."""

    def __init__(self, favourite: int):
        super().__init__()
        self.favourite = favourite
        self.anchor = torch.nn.Parameter(torch.zeros(()))  # gives the model a device
        self.config = SimpleNamespace(max_position_embeddings=64)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> SimpleNamespace:
        logits = torch.zeros(*input_ids.shape, VOCAB)  # (B, L, V)
        logits[..., self.favourite] = 30.0
        return SimpleNamespace(logits=logits)


def test_a_model_that_prefers_the_labelled_choice_is_always_right(rng):
    tokenizer = make_tokenizer(bos=False)
    items = []
    for i in range(12):  # the right choice is the favoured word w0, shorter or longer than the others
        choices = [f"w{rng.randint(1, 59)} " * rng.randint(1, 3) for _ in range(rng.randint(2, 5))]
        label = rng.randrange(len(choices))
        choices[label] = "w0 " * rng.randint(1, 3)
        items.append(ChoiceItem(str(i), words(rng, 1, 8), [" " + c.strip() for c in choices], label))
    rows = score_choices(Rigged(tokenizer.convert_tokens_to_ids("w0")), tokenizer, items, batch_size=5)
    summary = summarize_choices(items, rows, samples=200)
    assert summary["accuracy"] == summary["accuracy_norm"] == 1.0
    assert summary["correct"] == summary["correct_norm"] == summary["items"] == 12
    assert summary["accuracy_ci"] == (1.0, 1.0)


def test_summary_counts_and_intervals(rng):
    items = [ChoiceItem(str(i), "w1", ["w2", "w3"] if i % 3 else ["w2", "w3", "w4", "w5"], i % 2) for i in range(60)]
    right = [rng.random() < 0.7 for _ in items]
    rows = [
        {
            "id": item.id,
            "prediction": item.label if ok else 1 - item.label,
            "prediction_norm": item.label,
            "truncated": 0,
        }
        for item, ok in zip(items, right, strict=True)
    ]
    summary = summarize_choices(items, rows, samples=500, seed=1)
    assert summary["correct"] == sum(right) and summary["items"] == 60
    assert summary["accuracy"] == pytest.approx(sum(right) / 60)
    low, high = summary["accuracy_ci"]
    assert low < summary["accuracy"] < high
    # Binomial standard error: the 95% interval spans about 4 of them.
    assert high - low == pytest.approx(4 * math.sqrt(summary["accuracy"] * (1 - summary["accuracy"]) / 60), rel=0.3)
    assert summary["accuracy_norm"] == 1.0 and summary["accuracy_norm_ci"] == (1.0, 1.0)
    assert summary["labels"] == {"0": 30, "1": 30} and summary["majority"] == 0.5
    assert summary["chance"] == pytest.approx((20 * 0.25 + 40 * 0.5) / 60)
    with pytest.raises(ValueError, match="predictions"):
        summarize_choices(items, rows[:-1])


def test_items_are_checked_before_scoring():
    tokenizer = make_tokenizer(bos=False)
    model = Rigged(favourite=4)
    for item, message in [
        (ChoiceItem("a", "w1", ["w2"], 0), "two or more"),
        (ChoiceItem("b", "w1", ["w2", "w3"], 2), "label 2"),
        (ChoiceItem("c", "", ["w2", "w3"], 0), "empty context"),
        (ChoiceItem("d", "w1 ", ["w2", " ".join(["w3"] * 70)], 0), "choice 1 alone fills"),
        (ChoiceItem("e", "w1", ["w2", " w3"], 0), "choice 0 adds no token"),  # "w1w2" is one (unknown) word
    ]:
        with pytest.raises(ValueError, match=message):
            score_choices(model, tokenizer, [item], batch_size=2)
    with pytest.raises(ValueError, match=r"eval\.batch_size"):
        score_choices(model, tokenizer, [ChoiceItem("e", "w1", ["w2", "w3"], 0)], batch_size=0)
