"""Packing: tokenized documents into rows of exactly `seq_len` ids that keep their document boundaries.

Each document is its tokens plus eos. Documents are laid end to end, greedily, into rows; a document longer than the
space left in a row continues at the start of the next, so nothing is truncated or dropped. A row records the
lengths of its segments (a document, or one chunk of a document) in `seq_lens`, and the final row is filled with pad
ids that form a segment of their own (`num_pad` of them). `collate_packed` turns rows into one flattened batch with
per-segment `position_ids` and `cu_seq_lens_*`, the keyword arguments HF models pass to varlen attention, so no
token attends across documents.
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
        "num_pad": datasets.Value("int32"),  # pad ids at the end of the row (only the final row has any)
    }
)


@dataclass
class PackStats:
    """What packing one split produced. `tokens` counts document tokens plus one eos per document."""

    documents: int
    tokens: int
    rows: int
    pad_tokens: int
    longest_document: int  # in tokens, without its eos

    @property
    def padding_pct(self) -> float:
        return 100.0 * self.pad_tokens / max(1, self.tokens + self.pad_tokens)

    def to_dict(self) -> dict[str, int | float]:
        return {**asdict(self), "padding_pct": self.padding_pct}


def pack_documents(documents: Iterable[Sequence[int]], seq_len: int, eos_id: int, pad_id: int) -> Iterator[dict]:
    """Rows `{input_ids, seq_lens, num_pad}` holding every document (plus its eos) once, in order."""
    if seq_len < 2:
        raise ValueError(f"seq_len: expected at least 2 tokens per row, got {seq_len}")
    row: list[int] = []
    seq_lens: list[int] = []
    for document in documents:
        tokens = [*document, eos_id]
        start = 0
        while start < len(tokens):
            take = min(seq_len - len(row), len(tokens) - start)
            row.extend(tokens[start : start + take])
            seq_lens.append(take)
            start += take
            if len(row) == seq_len:
                yield {"input_ids": row, "seq_lens": seq_lens, "num_pad": 0}
                row, seq_lens = [], []
    if row:
        num_pad = seq_len - len(row)
        yield {"input_ids": row + [pad_id] * num_pad, "seq_lens": [*seq_lens, num_pad], "num_pad": num_pad}


def pack_dataset(
    tokenized: datasets.Dataset, seq_len: int, eos_id: int, pad_id: int, cache_dir: str
) -> tuple[datasets.Dataset, PackStats]:
    """Pack the `input_ids` column of `tokenized` into a dataset of rows (written under `cache_dir`), and its stats."""
    if tokenized.num_rows == 0:  # from_generator() cannot write an empty dataset
        empty = datasets.Dataset.from_dict({name: [] for name in ROW_FEATURES}, features=ROW_FEATURES)
        return empty, PackStats(documents=0, tokens=0, rows=0, pad_tokens=0, longest_document=0)
    lengths = pc.list_value_length(tokenized.with_format("arrow")["input_ids"])  # (documents,)
    rows = datasets.Dataset.from_generator(
        _rows,
        features=ROW_FEATURES,
        cache_dir=cache_dir,
        gen_kwargs={"tokenized": tokenized, "seq_len": seq_len, "eos_id": eos_id, "pad_id": pad_id},
        fingerprint=tokenized._fingerprint + f"-pack-{seq_len}-{eos_id}-{pad_id}",
    )
    stats = PackStats(
        documents=len(lengths),
        tokens=(pc.sum(lengths).as_py() or 0) + len(lengths),
        rows=rows.num_rows,
        pad_tokens=pc.sum(rows.with_format("arrow")["num_pad"]).as_py() or 0,
        longest_document=pc.max(lengths).as_py() or 0,
    )
    return rows, stats


def _rows(tokenized: datasets.Dataset, seq_len: int, eos_id: int, pad_id: int) -> Iterator[dict]:
    documents = (ids for batch in tokenized.iter(batch_size=64) for ids in batch["input_ids"])
    yield from pack_documents(documents, seq_len, eos_id, pad_id)


def collate_packed(rows: list[dict]) -> dict[str, torch.Tensor | int]:
    """Flatten B packed rows of S tokens into one sequence, like transformers' DataCollatorWithFlattening.

    Returns input_ids, labels and position_ids of shape (1, B*S), int64; labels are IGNORE_INDEX at the first token of
    every segment (nothing before it may predict it) and at pad tokens; position_ids restart at 0 at every segment;
    cu_seq_lens_q/k (n_segments + 1,) int32 are the segment offsets, and max_length_q/k the longest segment.
    """
    if not rows:
        raise ValueError("rows: expected at least one packed row")
    input_ids = [torch.as_tensor(row["input_ids"], dtype=torch.long) for row in rows]
    seq_lens = [torch.as_tensor(row["seq_lens"], dtype=torch.long) for row in rows]
    for i, (ids, lens) in enumerate(zip(input_ids, seq_lens, strict=True)):
        if int(lens.sum()) != ids.numel():
            raise ValueError(f"rows[{i}]: seq_lens sum to {int(lens.sum())}, but the row holds {ids.numel()} tokens")
    flat = torch.cat(input_ids)  # (B*S,)
    lens = torch.cat(seq_lens)  # (n_segments,)
    cu_seq_lens = F.pad(lens.cumsum(0), (1, 0))  # (n_segments + 1,)
    starts = cu_seq_lens[:-1]
    position_ids = torch.arange(flat.numel()) - starts.repeat_interleave(lens)  # (B*S,)
    labels = flat.clone()
    labels[starts] = IGNORE_INDEX
    row_ends = torch.tensor([ids.numel() for ids in input_ids]).cumsum(0)
    for end, row in zip(row_ends.tolist(), rows, strict=True):
        labels[end - int(row["num_pad"]) : end] = IGNORE_INDEX
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
