"""The training-documents manifest: what a run records of its train split (or of its stream's hash rule), how a
resumed run adds to it, where eval finds it, and what it refuses to read."""

import json

import pytest

from legalpt.config import DataConfig
from legalpt.data.manifest import MANIFEST, TrainingDocuments, document_hash, write_manifest
from legalpt.data.pipeline import split_corpus
from legalpt.data.stream import in_heldout


def corpus_config(tmp_path, **overrides) -> DataConfig:
    fields = {"synthetic_documents": 8, "heldout_fraction": 0.25, "cache_dir": str(tmp_path / "cache"), **overrides}
    return DataConfig(**fields)


def test_hash_ignores_spacing_and_line_breaks_only(rng):
    words = [f"w{rng.randrange(100)}" for _ in range(30)]
    text = " ".join(words)
    spaced = "\n".join(" \t".join(words[i : i + 5]) for i in range(0, len(words), 5)) + "\n"
    assert document_hash(spaced) == document_hash(text)
    assert document_hash(text.upper()) != document_hash(text)
    assert document_hash(" ".join(words[:-1])) != document_hash(text)


def test_manifest_lists_the_train_split_and_nothing_held_out(tmp_path):
    cfg = corpus_config(tmp_path)
    corpus = split_corpus(cfg)
    path = write_manifest(tmp_path, cfg, corpus.splits["train"])
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert path == tmp_path / MANIFEST and lines[0]["documents"] == corpus.splits["train"].num_rows == len(lines) - 1
    assert sorted(row["id"] for row in lines[1:]) == sorted(corpus.splits["train"]["id"])
    training = TrainingDocuments.load([path])
    assert all(training.trained(text) for text in corpus.splits["train"]["text"])
    assert not any(training.trained(text) for text in corpus.splits["heldout"]["text"])


def test_resumed_run_adds_to_its_manifest(tmp_path):
    """A resumed run that trains on other documents has trained on both: the manifest holds the union."""
    first, second = (split_corpus(corpus_config(tmp_path, seed=seed)).splits["train"] for seed in (0, 1))
    cfg = corpus_config(tmp_path)
    write_manifest(tmp_path, cfg, first)
    write_manifest(tmp_path, cfg, second)
    training = TrainingDocuments.load([tmp_path / MANIFEST])
    expected = {document_hash(text) for text in [*first["text"], *second["text"]]}
    assert set(training.hashes) == expected and len(expected) > first.num_rows
    assert not list(tmp_path.glob(f".{MANIFEST}.partial-*"))


def test_streamed_run_records_its_hash_rule(tmp_path, rng):
    cfg = corpus_config(tmp_path, streaming=True, heldout_fraction=0.3, seed=rng.randrange(100))
    write_manifest(tmp_path, cfg, None)
    training = TrainingDocuments.load([tmp_path / MANIFEST])
    assert training.stream_rules == [(0.3, cfg.seed)] and training.needs_raw_text and not training.hashes
    for _ in range(50):
        raw = " ".join(f"w{rng.randrange(1000)}" for _ in range(20))
        assert training.trained(raw.upper(), raw) == (not in_heldout(raw, 0.3, cfg.seed))
    with pytest.raises(ValueError, match=r"^raw: "):
        training.trained("cleaned text only")


def test_found_from_the_run_folder_or_its_export(tmp_path):
    cfg = corpus_config(tmp_path)
    run = tmp_path / "run"
    (run / "hf").mkdir(parents=True)
    assert TrainingDocuments.find(str(run)) is None
    write_manifest(run, cfg, split_corpus(cfg).splits["train"])
    assert TrainingDocuments.find(str(run)) == TrainingDocuments.find(str(run / "hf")) == run / MANIFEST
    assert TrainingDocuments.find("meta-llama/Llama-3.2-1B") is None
    other = tmp_path / "elsewhere" / "model"
    other.mkdir(parents=True)
    assert TrainingDocuments.find(str(other)) is None


def test_in_memory_run_without_documents_and_foreign_files_are_named(tmp_path):
    with pytest.raises(ValueError, match=r"^train_documents: expected"):
        write_manifest(tmp_path, corpus_config(tmp_path), None)
    for text in ('{"format": "other"}\n', "not json\n", '{"format": "legalpt-training-documents"}\n{"id": "a"}\n'):
        bad = tmp_path / MANIFEST
        bad.write_text(text)
        with pytest.raises(ValueError, match=rf"^{bad}: not a training-documents manifest"):
            TrainingDocuments.load([bad])
