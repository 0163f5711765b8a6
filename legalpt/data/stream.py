"""Streaming data: documents read lazily, cleaned, tokenized and packed on the fly, for corpora larger than memory.

`stream_records(cfg)` is a `datasets.IterableDataset` of the records of `cfg.paths` (one shard per file, read by the
same readers as `load_documents`), of `cfg.paths` and `cfg.sources` mixed by weight exactly as the in-memory
pipeline mixes them (one shard; each source read lazily), or of the demo corpus. `PackedStream` turns any such
record stream (local files, or a hub dataset loaded with `streaming=True`) into rows of exactly `seq_len` tokens in
the format of the in-memory pipeline (`pack.pack_documents` makes them), for one rank of a distributed job.
`prepare_stream(cfg, ...)` is what the trainer calls when `data.streaming` is on.

Memory stays flat as the input grows: one file is open at a time, `_BATCH_DOCUMENTS` documents are cleaned and
tokenized together, and the packer holds at most one row and one document's tokens.

Splits: a document belongs to the held-out split when a hash of its raw text (and `seed`) falls below
`heldout_fraction`, a rule that needs no pass over the corpus and gives every rank the same answer.

Sharding: rank r of W keeps a disjoint share of the documents (`datasets.distributed.split_dataset_by_node`: whole
files when W divides their number, else every W-th record), and packs them into its own rows, so no document is seen
twice or lost across ranks. Ranks' row counts differ slightly; the stream repeats endlessly (`epochs=None`), so every
rank always has a next batch.

Resume: `state_dict()` is the position after the last row yielded: the record stream's own state before the
document that row ended in, and how many of that document's tokens (with its bos/eos) were already packed. A full row
always ends with an empty packer, so that pair is the whole packing state: `load_state_dict` continues with the next
unseen row, in the order of an uninterrupted run (the resumed remainder is handed to the packer with its `overlap`
tokens of context before it, and the first row marks them as context, as the uninterrupted packer would have).

Deduplication is off in streaming mode: an exact-dedup hash set grows with the corpus and would have to be saved with
every checkpoint for a resumed run to drop the same documents; deduplicate upstream, or use the in-memory pipeline.
What cannot become a document is counted by reason in `PackedStream.skipped`, as in `load_documents`.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import datasets
import torch
from datasets.distributed import split_dataset_by_node
from transformers import PreTrainedTokenizerFast

from legalpt.config import CleanConfig, DataConfig
from legalpt.data.clean import clean_text
from legalpt.data.pack import ROW_FEATURES, check_packing, collate_packed, pack_documents
from legalpt.data.pipeline import encode_batch
from legalpt.data.readers import MAX_LINE_BYTES, read_files
from legalpt.data.readers.rows import FEATURES, SkipReport
from legalpt.data.sources import FILES, data_sources, find_files, mixed_rows, open_source
from legalpt.data.tokenizer import get_tokenizer

SPLITS = ("train", "heldout")
RECORD_FEATURES = datasets.Features({**FEATURES, "skip": datasets.Value("string")})  # skip: reason, "" = a document
_BATCH_DOCUMENTS = 64  # documents cleaned and tokenized together (the Rust tokenizer encodes a batch at once)
_TOKENIZER_SAMPLE_BYTES = 20 * 10**6  # text of the first training documents a new BPE is trained on


def stream_records(cfg: DataConfig) -> datasets.IterableDataset:
    """Records `{id, text, source, kind, meta, skip}` of `cfg.paths` and `cfg.sources` (or the demo corpus), read
    lazily: plain files one shard per file; several sources mixed by weight in one shard, in the order the
    in-memory pipeline mixes them (`sources.mixed_rows`)."""
    sources = data_sources(cfg)
    if not sources:
        if cfg.synthetic_documents < 1:
            raise ValueError(f"data.synthetic_documents: expected at least 1 document, got {cfg.synthetic_documents}")
        kwargs = {"num_documents": cfg.synthetic_documents, "seed": cfg.seed, "min_chars": cfg.synthetic_min_chars}
        return datasets.IterableDataset.from_generator(_demo_records, features=RECORD_FEATURES, gen_kwargs=kwargs)
    if list(sources) == [FILES] and not (sources[FILES].kind or sources[FILES].max_documents):
        return _file_records(cfg.paths, cfg.text_field)
    # One shard: resuming replays the (deterministic) mixture up to the saved record.
    return datasets.IterableDataset.from_generator(_mixed_records, features=RECORD_FEATURES, gen_kwargs={"cfg": cfg})


def _file_records(paths: list[str], text_field: str) -> datasets.IterableDataset:
    kwargs = {"files": find_files(paths), "text_field": text_field, "max_line_bytes": MAX_LINE_BYTES}
    return datasets.IterableDataset.from_generator(read_files, features=RECORD_FEATURES, gen_kwargs=kwargs)


def _mixed_records(cfg: DataConfig) -> Iterator[dict[str, str]]:
    """The mixture of `cfg`'s sources, each read lazily: local files by legalpt's readers, datasets as configured."""
    sources = data_sources(cfg)
    inputs = {
        name: _file_records(source.paths, source.text_field) if source.paths else open_source(name, source, cfg)
        for name, source in sources.items()
    }
    yield from mixed_rows(sources, inputs)


def in_heldout(text: str, fraction: float, seed: int) -> bool:
    """Whether a document belongs to the held-out split: a seeded hash of its text, read as a number in [0, 1)."""
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8, key=seed.to_bytes(8, "little"))
    return int.from_bytes(digest.digest(), "little") / 2**64 < fraction


class PackedStream(torch.utils.data.IterableDataset):
    """Packed rows `{input_ids, seq_lens, num_pad}` of one split of a record stream, for rank `rank` of `world_size`.

    `records` is a `datasets.IterableDataset` with a `text` column (and optionally `id` and `skip`); `epochs=None`
    repeats it endlessly (each epoch ends with one padded row, like a split of the in-memory pipeline). `bos`, `eos`
    and `overlap` are the packing options of `pack_documents` (data.bos, data.eos, data.chunk_overlap)."""

    def __init__(
        self,
        records: datasets.IterableDataset,
        tokenizer: PreTrainedTokenizerFast,
        seq_len: int,
        clean: CleanConfig | None = None,
        split: str = "train",
        heldout_fraction: float = 0.0,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        epochs: int | None = None,
        bos: bool = False,
        eos: bool = True,
        overlap: int = 0,
    ) -> None:
        super().__init__()
        if not isinstance(records, datasets.IterableDataset):
            raise TypeError(f"records: expected a datasets.IterableDataset, got {type(records).__name__}")
        check_packing(seq_len, overlap)
        if bos and tokenizer.bos_token_id is None:
            raise ValueError(f"bos: tokenizer {tokenizer.name_or_path!r} has no bos token to start documents with")
        if split not in SPLITS:
            raise ValueError(f"split: expected one of {SPLITS}, got {split!r}")
        if not 0 <= heldout_fraction < 1:
            raise ValueError(f"heldout_fraction: expected a value in [0, 1), got {heldout_fraction}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank, world_size: expected 0 <= rank < world_size, got {rank}, {world_size}")
        if epochs is not None and epochs < 1:
            raise ValueError(f"epochs: expected None (endless) or at least 1, got {epochs}")
        # Always a new dataset object (also for one rank): its epoch and resume state are this stream's own.
        self.records = split_dataset_by_node(records, rank, world_size)
        self.tokenizer, self.seq_len, self.clean = tokenizer, seq_len, clean or CleanConfig(enabled=False)
        self.split, self.heldout_fraction, self.seed, self.epochs = split, heldout_fraction, seed, epochs
        self.affixes = ([tokenizer.bos_token_id] if bos else [], [tokenizer.eos_token_id] if eos else [])
        self.overlap = overlap
        # A copy of the Rust tokenizer, because `encode_batch` changes one of its settings.
        self._backend = copy.deepcopy(tokenizer.backend_tokenizer)
        self._position: dict[str, Any] = {"epoch": 0, "documents": None, "offset": 0}
        self.skipped = SkipReport()
        self.counts = {"documents": 0, "rows": 0}  # packed by this rank so far, over all epochs

    def state_dict(self) -> dict[str, Any]:
        """The position after the last row yielded (JSON-serialisable), with the skip report and counts so far."""
        skipped = {"counts": self.skipped.counts, "examples": self.skipped.examples}
        return copy.deepcopy({**self._position, "skipped": skipped, "counts": self.counts})

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue, on the next iteration, with the row after the one `state` was saved at."""
        missing = {"epoch", "documents", "offset", "skipped", "counts"} - set(state)
        if missing:
            raise ValueError(f"state: not a PackedStream state, missing {sorted(missing)}")
        state = copy.deepcopy(state)
        self._position = {key: state[key] for key in ("epoch", "documents", "offset")}
        self.skipped = SkipReport(state["skipped"]["counts"], state["skipped"]["examples"])
        self.counts = state["counts"]

    def __iter__(self) -> Iterator[dict]:
        while self.epochs is None or self._position["epoch"] < self.epochs:
            yield from self._epoch()

    def _epoch(self) -> Iterator[dict]:
        """The rows of the rest of the current epoch, from `_position`; the position moves with every row."""
        epoch, start_state, start_offset = (self._position[key] for key in ("epoch", "documents", "offset"))
        current = {"documents": start_state, "origin": -start_offset}  # the document being packed, and where
        fed = 0  # new tokens (documents with their bos/eos) handed to the packer since this call began
        context = 0  # tokens of the resumed document before the position, handed over again as the row's context

        def documents() -> Iterator[list[int]]:
            nonlocal fed, context
            for state_before, ids, skip in self._documents(epoch, start_state, start_offset):
                tokens = [*self.affixes[0], *ids, *self.affixes[1]]  # added here, so a resumed remainder has none
                if skip >= len(tokens):  # packed whole before the position
                    continue
                start = skip - min(self.overlap, skip)  # the resumed document's remainder starts with its context
                if skip:  # set once: the row the remainder starts may pull more documents before it is full
                    context = skip - start
                current["documents"], current["origin"] = state_before, fed - skip
                fed += len(tokens) - skip
                self.counts["documents"] += skip == 0
                yield tokens[start:]

        consumed = 0  # new tokens in the rows yielded since this call began
        pad = self.tokenizer.pad_token_id
        for row in pack_documents(documents(), self.seq_len, None, pad, None, self.overlap):
            if context:  # the packer took the resumed document's context for new tokens: it is context, as before
                row["context_lens"][0], context = context, 0
            consumed += self.seq_len - row["num_pad"] - sum(row["context_lens"])
            self.counts["rows"] += 1
            if row["num_pad"]:  # the epoch's last row: what follows is the next epoch
                self._position = {"epoch": epoch + 1, "documents": None, "offset": 0}
            else:
                self._position = {
                    "epoch": epoch,
                    "documents": current["documents"],
                    "offset": consumed - current["origin"],
                }
            yield row
        self._position = {"epoch": epoch + 1, "documents": None, "offset": 0}

    def _documents(self, epoch: int, start_state: dict | None, start_offset: int) -> Iterator[tuple[dict, list, int]]:
        """(record-stream state before the document, its token ids, how many of its tokens with bos/eos were packed
        before the position) for each document of this split, in order, from `start_state`: `start_offset` for the
        first, 0 for the others."""
        self.records.set_epoch(epoch)  # epochs after the first read the shards in another, fixed, order
        self.records.load_state_dict(start_state)  # None: from the start of the epoch
        records = _with_states(self.records, start_state)
        first = True
        while batch := list(itertools.islice(records, _BATCH_DOCUMENTS)):
            verdicts = [document_text(record, self.split, self.clean, self.heldout_fraction, self.seed)
                        for _, record in batch]  # fmt: skip
            texts = [text for text, _ in verdicts if text]
            encoded = iter(encode_batch({"text": texts}, self._backend)["input_ids"] if texts else [])
            # Skips are counted in order, as the packer reaches them, so that the report saved with a position
            # holds exactly the records before it.
            for (before, record), (text, reason) in zip(batch, verdicts, strict=True):
                if reason:
                    self.skipped.add(reason, str(record.get("id") or "?"))
                if not text:
                    continue
                yield before, next(encoded), start_offset if first else 0
                first = False


def skip_reason(record: dict) -> str:
    """Why a record cannot become a document ("" when it can)."""
    return record.get("skip") or ("" if isinstance(record.get("text"), str) else "missing text field")


def document_text(
    record: dict, split: str, clean: CleanConfig, heldout_fraction: float, seed: int
) -> tuple[str | None, str]:
    """(cleaned text, "") for a document of `split`; (None, reason) for a record to count as skipped (in the train
    split only, so that each is counted once); (None, "") for a document of the other split."""
    reason, text = skip_reason(record), record.get("text")
    if reason:
        return None, reason if split == "train" else ""
    if in_heldout(text, heldout_fraction, seed) != (split == "heldout"):
        return None, ""
    cleaned = clean_text(text, clean)
    return (cleaned, "") if cleaned else (None, "emptied by cleaning")


def _with_states(records: datasets.IterableDataset, start: dict | None) -> Iterator[tuple[dict | None, dict]]:
    """Each record of an iteration over `records`, with the stream's state before it."""
    before = start
    for record in records:
        yield before, record
        before = records.state_dict()


def _demo_records(num_documents: int, seed: int, min_chars: int) -> Iterator[dict[str, str]]:
    from legalpt.data.demo import generate_documents, join_documents  # only the demo corpus needs the generator

    documents = generate_documents(num_documents, seed)
    for doc in join_documents(documents, min_chars) if min_chars else documents:
        meta = json.dumps(doc["meta"], default=str)
        yield {"id": str(doc["id"]), "text": doc["text"], "source": doc["source"], "kind": doc["kind"], "meta": meta,
               "skip": ""}  # fmt: skip


def stream_batches(
    stream: PackedStream,
    batch_size: int,
    device: torch.device | str = "cpu",
    collate: Callable[[list[dict]], dict] = collate_packed,
) -> Iterator[dict]:
    """Collated batches (`collate`: `collate_packed`, or a context-parallel share) of `batch_size` rows on `device`,
    each pulled from the stream only when asked for: after the k-th batch, `stream.state_dict()` is the position
    right after it."""
    if batch_size < 1:
        raise ValueError(f"batch_size: expected at least 1 row, got {batch_size}")
    rows = iter(stream)
    cuda = torch.device(device).type == "cuda"  # pinned and not blocking the host, as the trainer's loader copies
    while batch := list(itertools.islice(rows, batch_size)):
        yield {key: _to(value, device, cuda) for key, value in collate(batch).items()}


def _to(value, device: torch.device | str, cuda: bool):
    """A batch value on `device`: a tensor through pinned memory on CUDA; anything else with a `to` (a context
    parallel share's RingPlan) by its own."""
    if isinstance(value, torch.Tensor) and cuda:
        return value.pin_memory().to(device, non_blocking=True)
    return value.to(device) if hasattr(value, "to") else value


@dataclass
class StreamedData:
    """The training stream of one rank, a held-out set for evaluation (rows from the start of the held-out stream),
    their tokenizer, and a short description."""

    train: PackedStream
    heldout: datasets.Dataset
    tokenizer: PreTrainedTokenizerFast
    stats: dict[str, Any]  # streaming, rank, world_size, shards, seq_len, tokenizer, vocab_size, heldout_rows, dedup


def prepare_stream(cfg: DataConfig, pretrained: str | None = None, rank: int = 0, world_size: int = 1) -> StreamedData:
    """The streaming counterpart of `pipeline.prepare`: nothing is read up front but a tokenizer sample (when a BPE is
    trained: the first `_TOKENIZER_SAMPLE_BYTES` of training text) and `cfg.stream_heldout_rows` held-out rows."""
    if cfg.stream_heldout_rows < 0:
        raise ValueError(f"data.stream_heldout_rows: expected at least 0 rows, got {cfg.stream_heldout_rows}")
    records = stream_records(cfg)
    common = {"clean": cfg.clean, "heldout_fraction": cfg.heldout_fraction, "seed": cfg.seed, "bos": cfg.bos,
              "eos": cfg.eos, "overlap": cfg.chunk_overlap}  # fmt: skip
    sample = [] if cfg.tokenizer or pretrained else _sample_texts(records, cfg)
    if not (cfg.tokenizer or pretrained or sample):
        raise ValueError(f"data.paths: no training document to train a tokenizer on in {list(cfg.paths)}")
    tokenizer = get_tokenizer(cfg, sample, pretrained)
    train = PackedStream(records, tokenizer, cfg.seq_len, split="train", rank=rank, world_size=world_size, **common)
    rows = []
    if cfg.heldout_fraction > 0 and cfg.stream_heldout_rows > 0:  # else the search would read the whole corpus
        heldout = PackedStream(records, tokenizer, cfg.seq_len, split="heldout", epochs=1, **common)
        rows = list(itertools.islice(heldout, cfg.stream_heldout_rows))
    heldout_rows = datasets.Dataset.from_dict({name: [row[name] for row in rows] for name in ROW_FEATURES},
                                              features=ROW_FEATURES)  # fmt: skip
    stats = {
        "streaming": True,
        "rank": rank,
        "world_size": world_size,
        "shards": records.num_shards,
        "seq_len": cfg.seq_len,
        "tokenizer": tokenizer.name_or_path,
        "vocab_size": len(tokenizer),
        "heldout_rows": heldout_rows.num_rows,
        "dedup": "off in streaming mode",
    }
    return StreamedData(train, heldout_rows, tokenizer, stats)


def format_stream_stats(stats: dict[str, Any]) -> str:
    """A short description of `StreamedData.stats` for the terminal."""
    return "\n".join([
        f"streaming  rank {stats['rank']} of {stats['world_size']}, {stats['shards']} shard(s), rows of "
        f"{stats['seq_len']} tokens packed on the fly; dedup {stats['dedup']}",
        f"held-out   {stats['heldout_rows']:,} rows from the start of the held-out stream",
        f"tokenizer  {stats['tokenizer'] or 'trained BPE'} ({stats['vocab_size']:,} tokens)",
    ])  # fmt: skip


def _sample_texts(records: datasets.IterableDataset, cfg: DataConfig) -> list[str]:
    """Cleaned training texts from the start of the stream, up to `_TOKENIZER_SAMPLE_BYTES`, to train a BPE on."""
    texts, size = [], 0
    for record in split_dataset_by_node(records, 0, 1):  # a new dataset object, so `records` keeps no state
        text, _ = document_text(record, "train", cfg.clean, cfg.heldout_fraction, cfg.seed)
        if text:
            texts.append(text)
            size += len(text.encode())
            if size >= _TOKENIZER_SAMPLE_BYTES:
                break
    return texts
