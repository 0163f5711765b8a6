"""Multiple choice by log-likelihood: CaseHOLD- and LegalBench-style items, their scores, and accuracy.

Data (`eval.choice_data`) is a local .csv/.tsv/.jsonl/.json file, or a hub dataset `name` or `name:config` read at
`eval.choice_split`. Two formats, told apart by their columns:

- casehold: `citing_prompt` (with "<HOLDING>" where the holding was cited), `holding_0`..`holding_4`, `label` 0-4;
  LexGLUE's copy (`context`, `endings`, `label`) reads the same way. The context is the prompt up to "<HOLDING>" and
  each holding is scored in its place. The text after "<HOLDING>" is not scored: under a left-to-right model it cannot
  inform the choice, and its likelihood given each holding would only add noise.
- legalbench (citation classification): `text`, `citation`, `answer` Yes/No, asked through `LEGALBENCH_PROMPT` with
  the choices " Yes" and " No".

A choice's score is the summed log-likelihood of its tokens given the context; the length-normalised score divides
it by the UTF-8 bytes of the continuation, so that long choices are not penalised for their length alone.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import datasets
import torch
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase

from legalpt.config import CHOICE_FORMATS
from legalpt.eval.perplexity import adds_bos, scored_logprobs
from legalpt.eval.stats import bootstrap_ci

HOLDING = "<HOLDING>"  # where CaseHOLD's citing prompt held the holding
CASEHOLD = ("citing_prompt", *(f"holding_{i}" for i in range(5)), "label")
LEXGLUE = ("context", "endings", "label")  # coastalcph/lex_glue:case_hold
LEGALBENCH = ("text", "citation", "answer")
LAYOUTS = {"casehold": (CASEHOLD, LEXGLUE), "legalbench": (LEGALBENCH,)}  # the columns of each CHOICE_FORMATS name
LEGALBENCH_PROMPT = (
    "Text: {text}\nCitation: {citation}\nQuestion: Does the cited case support the text? Answer Yes or No.\nAnswer:"
)
YES_NO = [" Yes", " No"]
LOCAL = {".csv": ("csv", {}), ".tsv": ("csv", {"delimiter": "\t"}), ".jsonl": ("json", {}), ".json": ("json", {})}
ID_COLUMNS = ("id", "idx", "example_id")  # the first one present names the items; else the row number


@dataclass
class ChoiceItem:
    """A context and the choices that may continue it; `label` is the index of the right one.

    The text scored is `context + choice` as written, so a separating space belongs at the end of the context or the
    start of each choice (" Yes"); none is needed after an opening parenthesis, as in CaseHOLD.
    """

    id: str
    context: str
    choices: list[str]
    label: int


def load_choice_items(source: str, format: str = "auto", split: str = "test") -> list[ChoiceItem]:
    """The items of a local file or hub dataset in CaseHOLD or LegalBench format ("auto": told by the columns)."""
    if format not in CHOICE_FORMATS:
        raise ValueError(f"eval.choice_format: expected one of {', '.join(CHOICE_FORMATS)}; got {format!r}")
    table = _load_table(source, split)
    columns = set(table.column_names)
    if format == "auto":
        format = next((name for name, layouts in LAYOUTS.items() if any(set(c) <= columns for c in layouts)), None)
        if format is None:
            raise ValueError(
                f"eval.choice_data={source!r}: columns {sorted(columns)} match no format; expected "
                + " or ".join(", ".join(c) for layouts in LAYOUTS.values() for c in layouts)
            )
    layout = next((c for c in LAYOUTS[format] if set(c) <= columns), None)
    if layout is None:
        expected = " or ".join(", ".join(c) for c in LAYOUTS[format])
        raise ValueError(f"eval.choice_data={source!r}: {format} data needs columns {expected}; got {sorted(columns)}")
    id_column = next((c for c in ID_COLUMNS if c in columns), None)
    items = []
    for index, row in enumerate(table):
        where = f"eval.choice_data={source!r}, row {index}"
        item_id = str(row[id_column]) if id_column else str(index)
        items.append(_legalbench(row, item_id, where) if format == "legalbench" else _casehold(row, item_id, where))
    return items


def score_choices(
    model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, items: Sequence[ChoiceItem], batch_size: int
) -> list[dict]:
    """Per item: log-likelihood of each choice given the context, summed and per byte, and the argmax of each.

    Whitespace that ends the context moves to the start of each continuation, since tokenizers attach a space to the
    word after it. Context and choice are tokenized together and the choice's tokens are those past the context's own
    tokens. A sequence longer than the model's `max_position_embeddings` loses context tokens from the left (after
    the bos token); `truncated` counts them.
    """
    _check_items(items, batch_size)
    bos = [tokenizer.bos_token_id] if adds_bos(tokenizer) else []
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    contexts = [item.context.rstrip() for item in items]
    continuations = [
        [item.context[len(context) :] + choice for choice in item.choices]
        for item, context in zip(items, contexts, strict=True)
    ]
    context_ids = _encode(tokenizer, contexts)
    whole_ids = _encode(tokenizer, [c + x for c, xs in zip(contexts, continuations, strict=True) for x in xs])
    sequences, rows = [], []
    for index, (item, prefix) in enumerate(zip(items, context_ids, strict=True)):
        where = f"items[{index}] ({item.id})"
        if not bos and not prefix:
            raise ValueError(f"{where}: empty context and no bos token, so nothing predicts a choice's first token")
        row = {"id": item.id, "label": item.label, "choice_tokens": [], "truncated": 0}
        for choice in range(len(item.choices)):
            ids, first, cut = _fit(bos + whole_ids[len(sequences)], len(bos) + len(prefix), len(bos), limit)
            if first >= len(ids):
                raise ValueError(f"{where}: choice {choice} adds no token to the context")
            if first < 1:
                raise ValueError(f"{where}: choice {choice} alone fills the model's {limit} positions")
            sequences.append((index, choice, ids, first))
            row["choice_tokens"].append(len(ids) - first)
            row["truncated"] = max(row["truncated"], cut)
        rows.append(row)
    loglik = _score(model, tokenizer, sequences, batch_size)
    for index, (row, item) in enumerate(zip(rows, items, strict=True)):
        row["loglik"] = [loglik[index, c] for c in range(len(item.choices))]
        row["loglik_norm"] = [s / len(x.encode()) for s, x in zip(row["loglik"], continuations[index], strict=True)]
        row["prediction"] = max(range(len(item.choices)), key=row["loglik"].__getitem__)
        row["prediction_norm"] = max(range(len(item.choices)), key=row["loglik_norm"].__getitem__)
    return rows


def summarize_choices(
    items: Sequence[ChoiceItem], predictions: Sequence[dict], samples: int = 1000, seed: int = 0
) -> dict:
    """Accuracy and length-normalised accuracy with bootstrap intervals over items, and the counts behind them.

    `predictions` are `score_choices` rows, in item order. `chance` is the mean of 1 / number of choices, `majority`
    the accuracy of always answering the most frequent label: the baselines an accuracy has to beat.
    """
    if not items:
        raise ValueError("items: expected at least one multiple-choice item")
    if [p["id"] for p in predictions] != [item.id for item in items]:
        raise ValueError("predictions: expected one score_choices row per item, in the order of the items")
    labels = Counter(item.label for item in items)
    summary = {"items": len(items)}
    for key, suffix in (("prediction", ""), ("prediction_norm", "_norm")):
        correct = [float(p[key] == item.label) for p, item in zip(predictions, items, strict=True)]
        accuracy, low, high = bootstrap_ci(correct, samples=samples, seed=seed)
        summary |= {f"correct{suffix}": int(sum(correct)), f"accuracy{suffix}": accuracy}
        summary[f"accuracy{suffix}_ci"] = (low, high)
    return summary | {
        "chance": sum(1 / len(item.choices) for item in items) / len(items),
        "majority": max(labels.values()) / len(items),
        "labels": {str(label): count for label, count in sorted(labels.items())},
        "truncated": sum(p["truncated"] > 0 for p in predictions),
    }


def _load_table(source: str, split: str) -> datasets.Dataset:
    """A local file by its suffix (every row; `split` does not apply), else a hub dataset `name[:config]`."""
    path = Path(source).expanduser()
    suffix = path.suffix.lower()
    if suffix in LOCAL:
        if not path.is_file():
            raise FileNotFoundError(f"eval.choice_data: no such file {source!r}")
        builder, options = LOCAL[suffix]
        return datasets.load_dataset(builder, data_files=str(path), split="train", **options)
    if path.is_file():
        raise ValueError(f"eval.choice_data={source!r}: expected a {', '.join(LOCAL)} file or a hub dataset name")
    name, _, config = source.partition(":")
    return datasets.load_dataset(name, config or None, split=split)


def _casehold(row: dict, item_id: str, where: str) -> ChoiceItem:
    if "citing_prompt" in row:
        prompt, holdings = row["citing_prompt"], [row[f"holding_{i}"] for i in range(5)]
    else:
        prompt, holdings = row["context"], list(row["endings"] or [])
    if not isinstance(prompt, str) or prompt.count(HOLDING) != 1:
        raise ValueError(f"{where}: expected a citing prompt with {HOLDING} once, got {prompt!r:.200}")
    if len(holdings) < 2 or not all(isinstance(h, str) and h.strip() for h in holdings):
        raise ValueError(f"{where}: expected two or more non-empty holdings, got {holdings!r:.200}")
    return ChoiceItem(item_id, prompt.split(HOLDING)[0], holdings, _label(row["label"], len(holdings), where))


def _legalbench(row: dict, item_id: str, where: str) -> ChoiceItem:
    text, citation, answer = row["text"], row["citation"], row["answer"]
    if not (isinstance(text, str) and text.strip() and isinstance(citation, str) and citation.strip()):
        raise ValueError(f"{where}: expected non-empty text and citation, got {text!r:.100} and {citation!r:.100}")
    answer = str(answer).strip().lower()
    if answer not in ("yes", "no"):
        raise ValueError(f"{where}: expected answer Yes or No, got {row['answer']!r}")
    context = LEGALBENCH_PROMPT.format(text=text.strip(), citation=citation.strip())
    return ChoiceItem(item_id, context, list(YES_NO), 0 if answer == "yes" else 1)


def _label(value: object, choices: int, where: str) -> int:
    """An integer label in [0, choices); csv and json files may hold it as text."""
    try:
        label = int(str(value).strip())
    except ValueError:
        raise ValueError(f"{where}: expected an integer label, got {value!r}") from None
    if not 0 <= label < choices:
        raise ValueError(f"{where}: expected a label in [0, {choices}), got {label}")
    return label


def _check_items(items: Sequence[ChoiceItem], batch_size: int) -> None:
    if batch_size < 1:
        raise ValueError(f"eval.batch_size: expected at least 1 sequence per forward pass, got {batch_size}")
    if not items:
        raise ValueError("items: expected at least one multiple-choice item")
    for index, item in enumerate(items):
        if len(item.choices) < 2 or not all(isinstance(c, str) and c for c in item.choices):
            raise ValueError(f"items[{index}] ({item.id}): expected two or more non-empty choices")
        if not 0 <= item.label < len(item.choices):
            raise ValueError(f"items[{index}] ({item.id}): label {item.label} is not a choice index")


def _fit(ids: list[int], first: int, keep: int, limit: int | None) -> tuple[list[int], int, int]:
    """`ids` cut to `limit` tokens by dropping context tokens after the first `keep` (the bos); new `first`, cut."""
    cut = max(0, len(ids) - limit) if limit else 0
    return ids[:keep] + ids[keep + cut :], first - cut, cut


def _encode(tokenizer: PreTrainedTokenizerBase, texts: list[str]) -> list[list[int]]:
    return tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]


def _score(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    sequences: list[tuple[int, int, list[int], int]],
    batch_size: int,
) -> dict[tuple[int, int], float]:
    """Summed log-likelihood per (item, choice), batched longest first."""
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0  # padded slots are masked out
    ordered = sorted(sequences, key=lambda s: len(s[2]), reverse=True)
    loglik = {}
    was_training = model.training
    model.eval()
    for start in tqdm(range(0, len(ordered), batch_size), desc="multiple choice", unit="batch"):
        batch = ordered[start : start + batch_size]
        scores = scored_logprobs(model, [(ids, first) for _, _, ids, first in batch], pad_id)
        for (item, choice, _, _), logprobs in zip(batch, scores, strict=True):
            loglik[item, choice] = logprobs.sum().item()
    model.train(was_training)
    return loglik
