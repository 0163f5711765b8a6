"""Packing: tokenized documents into rows of exactly `seq_len` ids that keep their document boundaries.

Each document is its tokens, after a bos and before an eos where the run asks for them (by default eos only).
Documents are laid end to end, greedily, into rows; a document longer than the space left in a row continues at the
start of the next, so nothing is truncated or dropped. Such a continuation may start with the last `overlap` tokens
packed before it, repeated as context: they are attended to but carry no loss, so every token is a training target
once. A row records the lengths of its segments (a document, or one chunk of a document) in `seq_lens`, the context
tokens that start each segment in `context_lens`, and the final row is filled with pad ids that form a segment of
their own (`num_pad` of them). `collate_packed` turns rows into one flattened batch with per-segment `position_ids`
and `cu_seq_lens_*`, the keyword arguments HF models pass to varlen attention, so no token attends across documents.

Fine-tuning examples (`pack_examples`) are never split: each is one segment of a row, placed first fit among the rows
still open, and carries a per-token `loss_mask` (1 on the response tokens it trains on); the rows of pretraining
have no such column, and every token of theirs that is not context or padding is a target.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass

import datasets
import pyarrow.compute as pc
import torch
import torch.nn.functional as F

IGNORE_INDEX = -100  # label of tokens that carry no loss (the loss functions of transformers skip it)
ROW_FEATURES = datasets.Features(
    {
        "input_ids": datasets.List(datasets.Value("int32")),  # (seq_len,)
        "seq_lens": datasets.List(datasets.Value("int32")),  # segment lengths, summing to seq_len
        "context_lens": datasets.List(datasets.Value("int32")),  # per segment: leading tokens that are context only
        "num_pad": datasets.Value("int32"),  # pad ids at the end of the row (only the final row has any)
    }
)
# Rows of fine-tuning examples: any row may end in padding, and only tokens whose loss_mask is 1 are targets
EXAMPLE_ROW_FEATURES = datasets.Features({**ROW_FEATURES, "loss_mask": datasets.List(datasets.Value("int8"))})
OPEN_ROWS = 64  # rows pack_examples keeps open for first fit: more fill rows tighter, each example scans them all


@dataclass
class PackStats:
    """What packing one split produced. `tokens` counts document tokens plus the bos/eos added to each document;
    `context_tokens` the tokens repeated as context at the start of continued chunks."""

    documents: int
    tokens: int
    rows: int
    pad_tokens: int
    longest_document: int  # in tokens, without bos/eos
    context_tokens: int = 0

    @property
    def padding_pct(self) -> float:
        return 100.0 * self.pad_tokens / max(1, self.tokens + self.context_tokens + self.pad_tokens)

    def to_dict(self) -> dict[str, int | float]:
        return {**asdict(self), "padding_pct": self.padding_pct}


def pack_documents(
    documents: Iterable[Sequence[int]],
    seq_len: int,
    eos_id: int | None,
    pad_id: int,
    bos_id: int | None = None,
    overlap: int = 0,
) -> Iterator[dict]:
    """Rows `{input_ids, seq_lens, context_lens, num_pad}` holding every document once, in order, as
    [bos_id] + document + [eos_id] (None = no such token). A document continued in a new row starts it with its last
    `overlap` tokens packed so far (fewer when it has fewer), as context."""
    check_packing(seq_len, overlap)
    row: list[int] = []
    seq_lens: list[int] = []
    context_lens: list[int] = []
    affixes = ([bos_id] if bos_id is not None else [], [eos_id] if eos_id is not None else [])
    for document in documents:
        tokens = [*affixes[0], *document, *affixes[1]]
        start = 0
        while start < len(tokens):
            context = tokens[max(0, start - overlap) : start]  # empty unless this continues the document
            take = min(seq_len - len(row) - len(context), len(tokens) - start)
            row.extend(context + tokens[start : start + take])
            seq_lens.append(len(context) + take)
            context_lens.append(len(context))
            start += take
            if len(row) == seq_len:
                yield {"input_ids": row, "seq_lens": seq_lens, "context_lens": context_lens, "num_pad": 0}
                row, seq_lens, context_lens = [], [], []
    if row:
        num_pad = seq_len - len(row)
        yield {
            "input_ids": row + [pad_id] * num_pad,
            "seq_lens": [*seq_lens, num_pad],
            "context_lens": [*context_lens, 0],
            "num_pad": num_pad,
        }


def check_packing(seq_len: int, overlap: int) -> None:
    """A row holds at least two tokens, and a continued chunk at least one new token after its context."""
    if seq_len < 2:
        raise ValueError(f"seq_len: expected at least 2 tokens per row, got {seq_len}")
    if not 0 <= overlap < seq_len:
        raise ValueError(f"chunk_overlap: expected 0 <= overlap < seq_len = {seq_len}, got {overlap}")


def pack_dataset(
    tokenized: datasets.Dataset,
    seq_len: int,
    eos_id: int | None,
    pad_id: int,
    cache_dir: str,
    bos_id: int | None = None,
    overlap: int = 0,
) -> tuple[datasets.Dataset, PackStats]:
    """Pack the `input_ids` column of `tokenized` into a dataset of rows (written under `cache_dir`), and its stats."""
    check_packing(seq_len, overlap)
    if tokenized.num_rows == 0:  # from_generator() cannot write an empty dataset
        empty = datasets.Dataset.from_dict({name: [] for name in ROW_FEATURES}, features=ROW_FEATURES)
        return empty, PackStats(documents=0, tokens=0, rows=0, pad_tokens=0, longest_document=0)
    lengths = pc.list_value_length(tokenized.with_format("arrow")["input_ids"])  # (documents,)
    options = {"seq_len": seq_len, "eos_id": eos_id, "pad_id": pad_id, "bos_id": bos_id, "overlap": overlap}
    rows = datasets.Dataset.from_generator(
        _rows,
        features=ROW_FEATURES,
        cache_dir=cache_dir,
        gen_kwargs={"tokenized": tokenized, **options},
        fingerprint=tokenized._fingerprint + "-pack-" + "-".join(f"{k}={v}" for k, v in options.items()),
    )
    arrow = rows.with_format("arrow")
    affixes = (bos_id is not None) + (eos_id is not None)
    stats = PackStats(
        documents=len(lengths),
        tokens=(pc.sum(lengths).as_py() or 0) + affixes * len(lengths),
        rows=rows.num_rows,
        pad_tokens=pc.sum(arrow["num_pad"]).as_py() or 0,
        longest_document=pc.max(lengths).as_py() or 0,
        context_tokens=pc.sum(pc.list_flatten(arrow["context_lens"])).as_py() or 0,
    )
    return rows, stats


def _rows(
    tokenized: datasets.Dataset, seq_len: int, eos_id: int | None, pad_id: int, bos_id: int | None, overlap: int
) -> Iterator[dict]:
    documents = (ids for batch in tokenized.iter(batch_size=64) for ids in batch["input_ids"])
    yield from pack_documents(documents, seq_len, eos_id, pad_id, bos_id, overlap)


def pack_examples(
    examples: Iterable[tuple[Sequence[int], Sequence[int]]], seq_len: int, pad_id: int, open_rows: int = OPEN_ROWS
) -> Iterator[dict]:
    """Rows `{input_ids, seq_lens, context_lens, num_pad, loss_mask}` of `seq_len` tokens holding every example
    `(input_ids, loss_mask)` once, whole, as a segment of its own.

    First fit: an example goes into the oldest open row it fits in, else opens a new row; a row is closed (padded)
    when it is full, or when it is the oldest of more than `open_rows`. An example longer than `seq_len` is an error
    (the caller counts and skips those first)."""
    check_packing(seq_len, 0)
    rows: list[dict] = []  # open rows, oldest first
    for number, (ids, mask) in enumerate(examples):
        if not 0 < len(ids) <= seq_len or len(mask) != len(ids):
            raise ValueError(f"examples[{number}]: expected 1 to {seq_len} ids with one loss_mask value each, "
                             f"got {len(ids)} ids and {len(mask)} mask values")  # fmt: skip
        row = next((row for row in rows if len(row["input_ids"]) + len(ids) <= seq_len), None)
        if row is None:
            row = {"input_ids": [], "seq_lens": [], "loss_mask": []}
            rows.append(row)
            if len(rows) > open_rows:
                yield _closed(rows.pop(0), seq_len, pad_id)
        row["input_ids"].extend(ids)
        row["loss_mask"].extend(mask)
        row["seq_lens"].append(len(ids))
        if len(row["input_ids"]) == seq_len:
            rows.remove(row)
            yield _closed(row, seq_len, pad_id)
    for row in rows:
        yield _closed(row, seq_len, pad_id)


def pack_example_dataset(
    encoded: datasets.Dataset, seq_len: int, pad_id: int, cache_dir: str
) -> tuple[datasets.Dataset, PackStats]:
    """Pack the `input_ids` and `loss_mask` columns of `encoded` (examples of at most `seq_len` tokens) into a
    dataset of rows (written under `cache_dir`), and its stats (`documents` counting examples)."""
    check_packing(seq_len, 0)
    if encoded.num_rows == 0:  # from_generator() cannot write an empty dataset
        empty = datasets.Dataset.from_dict({name: [] for name in EXAMPLE_ROW_FEATURES}, features=EXAMPLE_ROW_FEATURES)
        return empty, PackStats(documents=0, tokens=0, rows=0, pad_tokens=0, longest_document=0)
    rows = datasets.Dataset.from_generator(
        _example_rows,
        features=EXAMPLE_ROW_FEATURES,
        cache_dir=cache_dir,
        gen_kwargs={"encoded": encoded, "seq_len": seq_len, "pad_id": pad_id},
        fingerprint=f"{encoded._fingerprint}-pack-examples-seq_len={seq_len}-pad_id={pad_id}",
    )
    lengths = pc.list_value_length(encoded.with_format("arrow")["input_ids"])  # (examples,)
    stats = PackStats(
        documents=len(lengths),
        tokens=pc.sum(lengths).as_py() or 0,
        rows=rows.num_rows,
        pad_tokens=pc.sum(rows.with_format("arrow")["num_pad"]).as_py() or 0,
        longest_document=pc.max(lengths).as_py() or 0,
    )
    return rows, stats


def _example_rows(encoded: datasets.Dataset, seq_len: int, pad_id: int) -> Iterator[dict]:
    batches = encoded.select_columns(["input_ids", "loss_mask"]).iter(batch_size=256)
    examples = (example for batch in batches for example in zip(batch["input_ids"], batch["loss_mask"], strict=True))
    yield from pack_examples(examples, seq_len, pad_id)


def _closed(row: dict, seq_len: int, pad_id: int) -> dict:
    """An open row of pack_examples filled to `seq_len` with pad ids, which form a segment of their own."""
    num_pad = seq_len - len(row["input_ids"])
    seq_lens = row["seq_lens"] + ([num_pad] if num_pad else [])
    return {
        "input_ids": row["input_ids"] + [pad_id] * num_pad,
        "seq_lens": seq_lens,
        "context_lens": [0] * len(seq_lens),
        "num_pad": num_pad,
        "loss_mask": row["loss_mask"] + [0] * num_pad,
    }


def collate_packed(rows: list[dict]) -> dict[str, torch.Tensor | int]:
    """Flatten B packed rows of S tokens into one sequence, like transformers' DataCollatorWithFlattening.

    Returns input_ids, labels and position_ids of shape (1, B*S), int64; labels are IGNORE_INDEX at the first token of
    every segment (nothing before it may predict it), at a segment's context tokens (trained in the chunk before; a
    row without `context_lens` has none), at pad tokens, and where a row's `loss_mask` (rows of fine-tuning examples)
    is 0; position_ids restart at 0 at every segment;
    cu_seq_lens_q/k (n_segments + 1,) int32 are the segment offsets, and max_length_q/k the longest segment.
    """
    if not rows:
        raise ValueError("rows: expected at least one packed row")
    input_ids = [torch.as_tensor(row["input_ids"], dtype=torch.long) for row in rows]
    seq_lens = [torch.as_tensor(row["seq_lens"], dtype=torch.long) for row in rows]
    context_lens = [
        torch.as_tensor(row.get("context_lens", torch.zeros_like(lens)), dtype=torch.long)
        for row, lens in zip(rows, seq_lens, strict=True)
    ]
    for i, (ids, lens, context) in enumerate(zip(input_ids, seq_lens, context_lens, strict=True)):
        if int(lens.sum()) != ids.numel():
            raise ValueError(f"rows[{i}]: seq_lens sum to {int(lens.sum())}, but the row holds {ids.numel()} tokens")
        if context.shape != lens.shape or bool((context >= lens.clamp(min=1)).any()):
            raise ValueError(f"rows[{i}]: expected one context length per segment, each shorter than its segment")
    flat = torch.cat(input_ids)  # (B*S,)
    lens = torch.cat(seq_lens)  # (n_segments,)
    cu_seq_lens = F.pad(lens.cumsum(0), (1, 0))  # (n_segments + 1,)
    position_ids = torch.arange(flat.numel()) - cu_seq_lens[:-1].repeat_interleave(lens)  # (B*S,)
    labels = flat.clone()
    unlabelled = torch.cat(context_lens).clamp(min=1)  # (n_segments,) leading tokens of each segment with no label
    labels[position_ids < unlabelled.repeat_interleave(lens)] = IGNORE_INDEX
    row_ends = torch.tensor([ids.numel() for ids in input_ids]).cumsum(0)
    for end, row in zip(row_ends.tolist(), rows, strict=True):
        labels[end - int(row["num_pad"]) : end] = IGNORE_INDEX
    if (masked := _loss_mask(rows, input_ids)) is not None:
        labels[~masked] = IGNORE_INDEX
    cu_seq_lens = cu_seq_lens.to(torch.int32)
    max_length = int(lens.max())
    return {
        "input_ids": flat[None],
        "labels": labels[None],
        "position_ids": position_ids[None],
        "cu_seq_lens_q": cu_seq_lens,
        "cu_seq_lens_k": cu_seq_lens,
        "max_length_q": max_length,
        "max_length_k": max_length,
    }


def _loss_mask(rows: list[dict], input_ids: list[torch.Tensor]) -> torch.Tensor | None:
    """(B*S,) bool: the rows' `loss_mask`es joined; None when no row has one (rows of documents)."""
    have = ["loss_mask" in row for row in rows]
    if not any(have):
        return None
    if not all(have):
        raise ValueError("rows: expected a loss_mask in every row or in none (rows of examples and of documents mixed)")
    masks = [torch.as_tensor(row["loss_mask"], dtype=torch.bool) for row in rows]
    for i, (mask, ids) in enumerate(zip(masks, input_ids, strict=True)):
        if mask.shape != ids.shape:
            raise ValueError(f"rows[{i}]: loss_mask holds {mask.numel()} values for {ids.numel()} tokens")
    return torch.cat(masks)
