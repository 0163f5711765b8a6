"""Loading documents from local paths: folders, globs and odd names, missing paths, reloading edited files, the corpus
fingerprint, and the demo corpus."""

import json

import pytest
from data_helpers import load, random_text

from legalpt.config import DataConfig
from legalpt.data.sources import corpus_fingerprint, find_files, load_documents


def test_folders_globs_and_spaces(tmp_path, rng):
    files = [tmp_path / "corpus" / "a file.txt", tmp_path / "corpus" / "sub dir" / "b [v2].txt", tmp_path / "c.txt"]
    texts = {}
    for path in files:
        path.parent.mkdir(parents=True, exist_ok=True)
        texts[str(path)] = random_text(rng)
        path.write_text(texts[str(path)])

    # A folder, a recursive glob and a literal name with glob characters, overlapping: each file is loaded once.
    documents, report = load(tmp_path, tmp_path / "corpus", str(tmp_path / "**" / "*.txt"), files[1])
    assert report.total == 0
    assert sorted(d["source"] for d in documents) == sorted(texts)
    assert all(texts[d["source"]] == d["text"] for d in documents)
    assert find_files([str(tmp_path / "corpus" / "*.txt")]) == [str(files[0])]


def test_edited_file_is_reloaded(tmp_path, rng):
    path = tmp_path / "doc.txt"
    first, second = random_text(rng), random_text(rng, words=60)
    path.write_text(first)
    assert [d["text"] for d in load(tmp_path, path)[0]] == [first]
    path.write_text(second)
    assert [d["text"] for d in load(tmp_path, path)[0]] == [second]


def test_missing_paths_raise(tmp_path):
    (tmp_path / "empty folder").mkdir()
    with pytest.raises(FileNotFoundError, match=r"nope\.txt"):
        load(tmp_path, tmp_path / "nope.txt")
    with pytest.raises(FileNotFoundError, match=r"\*\.jsonl"):
        load(tmp_path, tmp_path / "*.jsonl")
    with pytest.raises(FileNotFoundError, match="empty folder"):
        load(tmp_path, tmp_path / "empty folder")
    with pytest.raises(TypeError, match=r"data\.paths"):
        find_files(str(tmp_path))


def test_corpus_fingerprint_follows_content(tmp_path, rng):
    texts = [random_text(rng) for _ in range(3)]
    for i, text in enumerate(texts):
        (tmp_path / f"{i}.txt").write_text(text)
    documents = load_documents(DataConfig(paths=[str(tmp_path / "*.txt")], cache_dir=str(tmp_path / "cache")))[0]
    assert corpus_fingerprint(documents) == corpus_fingerprint(texts)
    assert corpus_fingerprint([*texts[:2], texts[2] + " "]) != corpus_fingerprint(texts)
    assert corpus_fingerprint(texts[::-1]) != corpus_fingerprint(texts)


def test_demo_corpus(tmp_path):
    pytest.importorskip("legalpt.data.demo")
    documents, report = load(tmp_path, synthetic_documents=4, seed=3)
    assert len(documents) == 4 and report.total == 0
    assert {d["source"] for d in documents} == {"synthetic"}
    assert {d["kind"] for d in documents} <= {"contract", "opinion"}
    assert all(d["text"].strip() and isinstance(json.loads(d["meta"]), dict) for d in documents)
    with pytest.raises(ValueError, match="synthetic_documents"):
        load(tmp_path, synthetic_documents=0)
