"""Language-modelling loss: held-out loss over packed batches, and perplexity / bits per byte of whole documents.

`heldout_loss` is the one definition of the trainer's periodic evaluation; `document_perplexity` scores each
held-out document whole (strided windows beyond the context) and reports by document kind. `scored_logprobs` is
the batched log-likelihood that both it and multiple choice use.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from itertools import islice

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase

from legalpt.data.pack import IGNORE_INDEX
from legalpt.eval.stats import bootstrap_ci
from legalpt.runtime import on_local_main_process


@torch.no_grad()
def heldout_loss(
    model: torch.nn.Module,
    batches: Iterable[dict],
    max_batches: int = 0,
    reduce_sum: Callable[[torch.Tensor], torch.Tensor] = lambda t: t,
    progress: bool | None = None,
) -> dict[str, float]:
    """Mean next-token cross-entropy (nats) and perplexity over `batches` (0 = all of them).

    Each batch is a packed batch with `labels`; HF shifts labels inside the model, so a token counts when the label
    after it is not IGNORE_INDEX. `reduce_sum` sums across processes (accelerate's reduce) so every rank agrees.
    A progress bar counts the batches: `progress` None shows it on the local main process only (LOCAL_RANK unset or
    0, as launchers set it), like the training loop's.
    """
    if progress is None:
        progress = on_local_main_process()
    try:
        length = len(batches)  # type: ignore[arg-type]
    except TypeError:  # a generator, or a loader over a stream, does not know its length
        length = None
    total = min(n for n in (max_batches, length) if n) if max_batches or length else None
    was_training = model.training
    model.eval()
    nll = torch.zeros((), dtype=torch.float64)
    tokens = torch.zeros((), dtype=torch.float64)
    with tqdm(total=total, desc="eval", unit="batch", leave=False, disable=not progress) as bar:
        for batch in islice(batches, max_batches or None):
            # num_items_in_batch=1 makes HF return the summed NLL: a batch without targets adds 0 (a mean: NaN).
            nll += model(**batch, num_items_in_batch=1).loss.double().cpu()
            tokens += (batch["labels"][:, 1:] != IGNORE_INDEX).sum().cpu()
            bar.update()
    model.train(was_training)
    device = next(model.parameters()).device
    nll, tokens = reduce_sum(nll.to(device)), reduce_sum(tokens.to(device))
    if tokens.item() == 0:
        raise ValueError("held-out evaluation saw no predicted tokens: the held-out split is empty")
    mean = (nll / tokens).item()
    return {"loss": mean, "perplexity": math.exp(mean), "tokens": int(tokens.item())}


def resolve_window(model: torch.nn.Module, context: int, stride: int) -> tuple[int, int]:
    """`eval.perplexity_context` and `eval.perplexity_stride` with their 0 defaults resolved, checked.

    context 0 = the model's `max_position_embeddings`; stride 0 = half the context. Windows longer than the model's
    positions, and strides that leave a token unscored (stride >= context), are rejected.
    """
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if context == 0:
        if limit is None:
            raise ValueError("eval.perplexity_context: 0 means the model's max_position_embeddings, which it lacks")
        context = limit
    if context < 2:
        raise ValueError(f"eval.perplexity_context: expected at least 2 tokens per window, got {context}")
    if limit is not None and context > limit:
        raise ValueError(
            f"eval.perplexity_context: expected at most the model's max_position_embeddings ({limit}), got {context}"
        )
    stride = stride or context // 2
    if not 1 <= stride < context:
        raise ValueError(
            f"eval.perplexity_stride: expected 1 <= stride < eval.perplexity_context ({context}), got {stride}"
        )
    return context, stride


def stride_windows(length: int, context: int, stride: int) -> list[tuple[int, int, int]]:
    """Windows `(begin, end, first)` over a sequence of `length` tokens; tokens first..end-1 are scored in each.

    Windows hold `context` tokens (the last one fewer) and start every `stride` tokens; each one scores the tokens the
    previous one did not reach, so every token but the first (which has nothing to predict it) is scored exactly once,
    in the window that gives it the most left context: at least `context - stride` tokens, or all before it.
    """
    windows = []
    begin, first = 0, 1
    while first < length:
        end = min(begin + context, length)
        windows.append((begin, end, first))
        begin, first = begin + stride, end
    return windows


@torch.no_grad()
def scored_logprobs(model: torch.nn.Module, sequences: list[tuple[list[int], int]], pad_id: int) -> list[torch.Tensor]:
    """Log-probability (float64, CPU) of tokens `first`.. of each `(ids, first)` given the tokens before, one pass.

    Rows are right-padded with an attention mask: causal attention keeps every real token blind to the padding after
    it, and positions still count from 0 in each row. Log-softmax runs in float32 on the scored positions only.
    """
    device = next(model.parameters()).device
    longest = max(len(ids) for ids, _ in sequences)
    input_ids = torch.full((len(sequences), longest), pad_id, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for row, (ids, _) in enumerate(sequences):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        attention_mask[row, : len(ids)] = 1
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits  # (B, L, V)
    result = []
    for row, (ids, first) in enumerate(sequences):
        predicted = logits[row, first - 1 : len(ids) - 1].float()  # (T, V): position t - 1 predicts token t
        targets = input_ids[row, first : len(ids)]  # (T,)
        result.append(-torch.nn.functional.cross_entropy(predicted, targets, reduction="none").double().cpu())
    return result


def adds_bos(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether the tokenizer starts every text with its bos token (Llama-style), as the model saw in training."""
    bos = tokenizer.bos_token_id
    return bos is not None and tokenizer("x", add_special_tokens=True)["input_ids"][:1] == [bos]


def document_perplexity(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    documents: Sequence[dict],
    context: int,
    stride: int,
    batch_size: int,
    samples: int = 1000,
    seed: int = 0,
) -> dict:
    """Loss, perplexity and bits per byte of whole documents, per document kind and over "all" of them.

    `documents` are records with `id`, `text` and `kind`. A document of at most `context` tokens is scored in one
    pass; a longer one by `stride_windows`. Windows are batched `batch_size` at a time, longest document first and
    each document's windows in a row, so that rows of a batch have similar lengths and documents finish one by one.

    The first token of a document is predicted from the bos token when the tokenizer adds one (and then every byte of
    the text is scored); otherwise it has no prediction, and neither it nor its bytes are scored. Bits per byte =
    total nll in bits / UTF-8 bytes of the scored text; its confidence interval resamples documents and recomputes
    that ratio. `context`/`stride` 0 take the defaults of `resolve_window`. Documents with no token to predict are
    counted under "skipped".

    Returns {"context", "stride", "first_token", "by_kind": {kind or "all": metrics}, "per_document": rows, "skipped"}.
    """
    context, stride = resolve_window(model, context, stride)
    _check_documents(documents, batch_size, samples)
    if not tokenizer.is_fast:
        raise TypeError("tokenizer: expected a fast tokenizer, whose offsets give the bytes of the scored text")
    bos = adds_bos(tokenizer)
    encoded = tokenizer(
        [doc["text"] for doc in documents], add_special_tokens=False, return_offsets_mapping=True, verbose=False
    )
    rows, windows, skipped = [], [], Counter()
    for doc, ids, offsets in zip(documents, encoded["input_ids"], encoded["offset_mapping"], strict=True):
        ids = [tokenizer.bos_token_id, *ids] if bos else ids
        if len(ids) < 2:
            skipped["no token to predict (empty, or one token and no bos)"] += 1
            continue
        scored_text = doc["text"] if bos else doc["text"][offsets[0][1] :]
        rows.append({"id": doc["id"], "kind": doc["kind"], "tokens": len(ids) - 1, "bytes": len(scored_text.encode())})
        windows += [
            (len(rows) - 1, ids[begin:end], first - begin)
            for begin, end, first in stride_windows(len(ids), context, stride)
        ]
    if not rows:
        raise ValueError(f"documents: none of the {len(documents)} documents has a token to predict")
    nll = _score_windows(model, tokenizer, windows, [row["tokens"] for row in rows], batch_size)
    for row, total in zip(rows, nll, strict=True):
        row["nll"] = total
        row["bits_per_byte"] = _bits_per_byte(total, row["bytes"])
    kinds = {"all": rows}
    for row in rows:
        kinds.setdefault(row["kind"], []).append(row)
    return {
        "context": context,
        "stride": stride,
        "first_token": "predicted from bos" if bos else "not scored",
        "by_kind": {kind: _summary(group, samples, seed) for kind, group in kinds.items()},
        "per_document": rows,
        "skipped": dict(skipped),
    }


def _check_documents(documents: Sequence[dict], batch_size: int, samples: int) -> None:
    if batch_size < 1:
        raise ValueError(f"eval.batch_size: expected at least 1 sequence per forward pass, got {batch_size}")
    if samples < 0:
        raise ValueError(f"eval.bootstrap: expected 0 or more resamples, got {samples}")
    for index, doc in enumerate(documents):
        if not isinstance(doc, dict) or not {"id", "text", "kind"} <= doc.keys():
            raise ValueError(f"documents[{index}]: expected a dict with id, text and kind, got {doc!r:.200}")
        if not isinstance(doc["text"], str):
            raise TypeError(f"documents[{index}]['text']: expected a string, got {type(doc['text']).__name__}")
        if doc["kind"] == "all":
            raise ValueError(f"documents[{index}]['kind']: 'all' is reserved for the summary over every document")


def _score_windows(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    windows: list[tuple[int, list[int], int]],
    lengths: list[int],
    batch_size: int,
) -> list[float]:
    """Summed nll (nats) per document of its `(document, ids, first)` windows; `lengths` are the documents' tokens."""
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0  # padded slots are masked out
    remaining = Counter(doc for doc, _, _ in windows)
    nll = [0.0] * len(lengths)
    was_training = model.training
    model.eval()
    ordered = sorted(windows, key=lambda window: lengths[window[0]], reverse=True)  # stable: windows stay in order
    with tqdm(total=len(lengths), desc="perplexity", unit="doc", disable=not on_local_main_process()) as bar:
        for start in range(0, len(ordered), batch_size):
            batch = ordered[start : start + batch_size]
            logprobs = scored_logprobs(model, [(ids, first) for _, ids, first in batch], pad_id)
            for (doc, _, _), scores in zip(batch, logprobs, strict=True):
                nll[doc] -= scores.sum().item()
                remaining[doc] -= 1
                if remaining[doc] == 0:
                    bar.update()
    model.train(was_training)
    return nll


def _summary(rows: list[dict], samples: int, seed: int) -> dict:
    """Token-weighted loss and byte-weighted bits per byte of a group of scored documents."""
    nll = np.array([row["nll"] for row in rows])
    num_bytes = np.array([row["bytes"] for row in rows])
    tokens = sum(row["tokens"] for row in rows)
    loss = float(nll.sum()) / tokens
    return {
        "loss": loss,
        "perplexity": math.exp(loss),
        "bits_per_byte": _bits_per_byte(float(nll.sum()), int(num_bytes.sum())),
        "bits_per_byte_ci": bootstrap_ci(nll / math.log(2), samples=samples, seed=seed, weights=num_bytes)[1:],
        "tokens": tokens,
        "bytes": int(num_bytes.sum()),
        "documents": len(rows),
    }


def _bits_per_byte(nll: float, num_bytes: int) -> float:
    # No bytes: a document that is one multi-byte character split into tokens, its first token unscored.
    return nll / math.log(2) / num_bytes if num_bytes else float("nan")
