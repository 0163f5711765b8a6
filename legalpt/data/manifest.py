"""The training-documents manifest of a run: which documents its weights were trained on, so that evaluation can keep
them out.

`write_manifest` (the trainer's main process) writes `<run>/training_documents.jsonl`: a header line, then one line
`{"id", "hash"}` per document of the training split. The hash is a BLAKE2b-128 of the cleaned text with whitespace
runs collapsed, so a document is recognized whatever folder or file name it is read from. A streamed run trains on
every document its hash rule does not hold out (`stream.in_heldout`), a set known only by reading the whole stream:
its manifest records the rule (held-out fraction and seed) instead of a list. Resuming a run adds to its manifest.

`TrainingDocuments.find` locates the manifest of a checkpoint given as its run folder or its HF export folder;
`TrainingDocuments.trained` tells whether a document is one of them.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import datasets

from legalpt.config import DataConfig
from legalpt.data.stream import in_heldout
from legalpt.runtime import EXPORT_DIR

MANIFEST = "training_documents.jsonl"
FORMAT = "legalpt-training-documents"
_HASH = "blake2b-128 of the cleaned text, whitespace runs collapsed to one space"
_BATCH = 1024  # documents read from the dataset at a time while hashing


def document_hash(text: str) -> str:
    """The identity of a document's content: line breaks and spacing aside, the same text gives the same hash."""
    normalized = " ".join(text.split())
    return hashlib.blake2b(normalized.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


@dataclass
class TrainingDocuments:
    """The documents one or more checkpoints were trained on: content hashes (-> document id) and the hash rules of
    streamed runs, with the manifests they came from and the cleaning settings their texts were hashed after."""

    hashes: dict[str, str] = field(default_factory=dict)  # document_hash -> id
    stream_rules: list[tuple[float, int]] = field(default_factory=list)  # (heldout_fraction, seed) of streamed runs
    cleans: list[dict[str, Any]] = field(default_factory=list)  # data.clean of each run that hashed documents
    paths: list[str] = field(default_factory=list)  # the manifests read

    @staticmethod
    def find(checkpoint: str) -> Path | None:
        """The manifest of `checkpoint`, a run folder or its HF export; None for a hub id or a folder without one."""
        folder = Path(checkpoint).expanduser()
        candidates = [folder / MANIFEST] + ([folder.parent / MANIFEST] if folder.name == EXPORT_DIR else [])
        return next((path for path in candidates if path.is_file()), None)

    @classmethod
    def load(cls, paths: Iterable[Path]) -> TrainingDocuments:
        """The union of the manifests at `paths`."""
        union = cls()
        for path in paths:
            header, documents = _read(path)
            union.hashes.update((digest, doc["id"]) for digest, doc in documents.items())
            union.stream_rules += [(rule["heldout_fraction"], rule["seed"]) for rule in header["stream_rules"]]
            if header["documents"]:
                union.cleans.append(header["clean"])
            union.paths.append(str(path))
        return union

    @property
    def needs_raw_text(self) -> bool:
        """Whether `trained` needs a document's text as read (a stream's hash rule splits before cleaning)."""
        return bool(self.stream_rules)

    def trained(self, text: str, raw: str | None = None) -> bool:
        """Whether the document with cleaned text `text` (and text as read, `raw`) was trained on."""
        if document_hash(text) in self.hashes:
            return True
        if self.stream_rules and raw is None:
            raise ValueError("raw: a streamed run's documents are told by their text as read; got only cleaned text")
        return any(not in_heldout(raw, fraction, seed) for fraction, seed in self.stream_rules)


def write_manifest(run_dir: Path, cfg: DataConfig, train_documents: datasets.Dataset | None) -> Path:
    """Record the training documents of the run in `run_dir`: `train_documents` (columns id, text: the train split
    of the in-memory pipeline), or for a streamed run (`cfg.streaming`, None) its hash rule. What a manifest already
    holds (a resumed run) is kept; the file is replaced whole, so it is never half written."""
    path = run_dir / MANIFEST
    header, documents = _read(path) if path.is_file() else (_header(cfg), {})
    if cfg.streaming:
        rule = {"heldout_fraction": cfg.heldout_fraction, "seed": cfg.seed}
        if rule not in header["stream_rules"]:
            header["stream_rules"].append(rule)
    elif train_documents is None:
        raise ValueError("train_documents: expected the train split's documents (id, text) of an in-memory run")
    else:
        documents.update((doc["hash"], doc) for doc in _hashed(train_documents))
    header["documents"] = len(documents)
    partial = path.with_name(f".{MANIFEST}.partial-{os.getpid()}")
    with partial.open("w") as f:
        f.write(json.dumps(header) + "\n")
        f.writelines(json.dumps(doc) + "\n" for doc in documents.values())
    partial.replace(path)
    return path


def _header(cfg: DataConfig) -> dict[str, Any]:
    return {"format": FORMAT, "hash": _HASH, "documents": 0, "stream_rules": [], "clean": asdict(cfg.clean)}


def _hashed(documents: datasets.Dataset) -> Iterator[dict[str, str]]:
    for batch in documents.select_columns(["id", "text"]).iter(batch_size=_BATCH):
        for doc_id, text in zip(batch["id"], batch["text"], strict=True):
            yield {"id": doc_id, "hash": document_hash(text)}


def _read(path: Path) -> tuple[dict[str, Any], dict[str, dict[str, str]]]:
    """A manifest's header and its documents by hash; a file that is none is named with what was expected."""
    lines = path.read_text().splitlines()
    try:
        header = json.loads(lines[0]) if lines else {}
        documents = [json.loads(line) for line in lines[1:] if line.strip()]
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not a training-documents manifest (line {error.lineno}: not JSON)") from None
    if header.get("format") != FORMAT or any(not {"id", "hash"} <= doc.keys() for doc in documents):
        raise ValueError(f"{path}: not a training-documents manifest (expected a {FORMAT!r} header, id/hash lines)")
    return header, {doc["hash"]: doc for doc in documents}
