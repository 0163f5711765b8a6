"""prepare(): determinism, caching, disjoint and complete splits, config errors, the demo and the real corpus."""

import dataclasses
import json
import random
from pathlib import Path

import pytest

from legalpt.config import DataConfig
from legalpt.data.clean import clean_text
from legalpt.data.pipeline import format_stats, prepare, split_documents
from legalpt.data.sources import load_documents

SHARED_DATA = Path(__file__).resolve().parents[3] / "shared" / "data"


@pytest.fixture
def corpus(tmp_path) -> tuple[Path, list[str]]:
    """A folder of 30 random documents of 20 to 400 words, in a .jsonl and some .txt files."""
    seed = random.randrange(2**32)
    print(f"seed={seed}")
    rng = random.Random(seed)
    words = ["".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(2, 9))) for _ in range(300)]
    texts = [f"Document {i}. " + " ".join(rng.choices(words, k=rng.randint(20, 400))) for i in range(30)]
    texts[rng.randrange(30)] += " A document may quote <|endoftext|> or <|pad|> without ending."
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "records.jsonl").write_text("\n".join(json.dumps({"text": t}) for t in texts[:20]))
    for i, text in enumerate(texts[20:]):
        (folder / f"doc {i}.txt").write_text(text)
    return folder, texts


def config(tmp_path, folder, **overrides) -> DataConfig:
    fields = {"paths": [str(folder)], "cache_dir": str(tmp_path / "cache"), "vocab_size": 400, "seq_len": 64}
    return DataConfig(**{**fields, "heldout_fraction": 0.1, **overrides})


def rows_of(dataset) -> list[dict]:
    return dataset.to_list()


def documents_in(rows: list[dict], tokenizer) -> list[str]:
    """The texts packed in `rows`, read back through eos: independent of seq_lens."""
    texts, current = [], []
    for row in rows:
        for token in row["input_ids"][: len(row["input_ids"]) - row["num_pad"]]:
            if token == tokenizer.eos_token_id:
                texts.append(tokenizer.decode(current))
                current = []
            else:
                current.append(token)
    assert current == [], "a document without its eos"
    return texts


def test_splits_are_disjoint_complete_and_lossless(tmp_path, corpus):
    folder, texts = corpus
    data = prepare(config(tmp_path, folder))
    train = documents_in(rows_of(data.train), data.tokenizer)
    heldout = documents_in(rows_of(data.heldout), data.tokenizer)
    assert len(heldout) == 3 and len(train) == 27
    assert not set(train) & set(heldout)
    assert sorted(train + heldout) == sorted(texts)  # every document, decoded exactly
    assert (data.stats["train"]["documents"], data.stats["heldout"]["documents"]) == (27, 3)
    for split, rows in (("train", data.train), ("heldout", data.heldout)):
        stats = data.stats[split]
        assert stats["rows"] == rows.num_rows and all(len(ids) == 64 for ids in rows["input_ids"])
        assert stats["tokens"] + stats["pad_tokens"] == 64 * rows.num_rows
    assert data.stats["skipped"].total == 0 and not data.stats["cached"]


def test_prepare_is_deterministic_and_cached(tmp_path, corpus):
    folder, _ = corpus
    cfg = config(tmp_path, folder)
    first = prepare(cfg)
    second = prepare(cfg)
    assert second.stats["cached"] and "tokenize" not in second.stats["seconds"]
    assert rows_of(second.train) == rows_of(first.train) and rows_of(second.heldout) == rows_of(first.heldout)

    elsewhere = prepare(dataclasses.replace(cfg, cache_dir=str(tmp_path / "other cache")))
    assert not elsewhere.stats["cached"]
    assert rows_of(elsewhere.train) == rows_of(first.train) and rows_of(elsewhere.heldout) == rows_of(first.heldout)

    reseeded = prepare(dataclasses.replace(cfg, seed=cfg.seed + 1))
    held = set(documents_in(rows_of(first.heldout), first.tokenizer))
    assert set(documents_in(rows_of(reseeded.heldout), reseeded.tokenizer)) != held


def test_parallel_tokenization_gives_the_same_rows(tmp_path, corpus):
    folder, _ = corpus
    serial = prepare(config(tmp_path, folder))
    parallel = prepare(config(tmp_path, folder, num_proc=2, cache_dir=str(tmp_path / "parallel")))
    assert rows_of(parallel.train) == rows_of(serial.train) and rows_of(parallel.heldout) == rows_of(serial.heldout)


@pytest.mark.parametrize(
    ("n", "fraction", "heldout"), [(1, 0.5, 0), (2, 0.0, 1), (10, 0.5, 5), (3, 0.99, 2), (40, 0.05, 2), (41, 0.01, 1)]
)
def test_split_sizes(tmp_path, n, fraction, heldout):
    for i in range(n):
        (tmp_path / f"{i}.txt").write_text(f"document {i}")
    documents, _ = load_documents(DataConfig(paths=[str(tmp_path / "*.txt")], cache_dir=str(tmp_path / "cache")))
    train, held = split_documents(documents, fraction, seed=7)
    assert held.num_rows == heldout and train.num_rows == n - heldout
    assert not set(train["id"]) & set(held["id"])
    again_train, again_held = split_documents(documents, fraction, seed=7)
    assert list(again_held["id"]) == list(held["id"]) and list(again_train["id"]) == list(train["id"])


def test_single_document_has_an_empty_heldout_split(tmp_path):
    (tmp_path / "only.txt").write_text("The only document. " * 50)
    data = prepare(config(tmp_path, tmp_path / "only.txt"))
    assert data.heldout.num_rows == 0 and data.stats["heldout"]["documents"] == 0
    only = clean_text((tmp_path / "only.txt").read_text(), DataConfig().clean)  # whole, as cleaning left it
    assert documents_in(rows_of(data.train), data.tokenizer) == [only]


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ({"seq_len": 1}, "seq_len"),
        ({"heldout_fraction": 1.0}, "heldout_fraction"),
        ({"heldout_fraction": -0.1}, "heldout_fraction"),
        ({"num_proc": 0}, "num_proc"),
        ({"vocab_size": 100}, "vocab_size"),
        ({"streaming": True}, "streaming"),  # legalpt-prepare has nothing to write for a streamed corpus
    ],
)
def test_bad_config_fails_before_loading(tmp_path, override, key):
    # The path does not exist: a ValueError naming the key shows that nothing was loaded first.
    with pytest.raises(ValueError, match=rf"data\.{key}"):
        prepare(config(tmp_path, tmp_path / "missing", **override))


def test_nothing_loadable_is_an_error(tmp_path):
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "scan.pdf").write_bytes(b"%PDF")
    with pytest.raises(ValueError, match=r"no document could be loaded.*empty file"):
        prepare(config(tmp_path, tmp_path / "*.*"))


def test_format_stats(tmp_path, corpus):
    folder, _ = corpus
    (folder / "broken.jsonl").write_text("{not json\n")
    data = prepare(config(tmp_path, folder))
    report = format_stats(data.stats)
    train = data.stats["train"]
    assert "27 train, 3 held-out" in report and "1 invalid json" in report
    assert f"{train['tokens']:,} tokens in {train['rows']:,} rows of 64" in report
    assert "from cache" not in report and "from cache" in format_stats(prepare(config(tmp_path, folder)).stats)


def test_demo_corpus(tmp_path):
    pytest.importorskip("legalpt.data.demo")
    cfg = DataConfig(synthetic_documents=6, seq_len=128, vocab_size=1024, cache_dir=str(tmp_path / "cache"))
    data = prepare(cfg)
    documents, _ = load_documents(cfg)
    restored = documents_in(rows_of(data.train) + rows_of(data.heldout), data.tokenizer)
    # Every document arrives whole, as cleaning left it.
    assert sorted(restored) == sorted(clean_text(text, cfg.clean) for text in documents["text"])
    assert data.stats["heldout"]["documents"] == 1
    # No file was read: the input is the generated text.
    assert data.stats["input_bytes"] == sum(len(text.encode()) for text in documents["text"])


@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="the shared sample documents are absent")
def test_real_opinions_and_contracts(tmp_path):
    contracts = sorted((SHARED_DATA / "contracts").glob("*.txt"))[:6]
    cfg = config(tmp_path, SHARED_DATA / "opinions", seq_len=512, vocab_size=2048, heldout_fraction=0.25)
    cfg.paths += [str(p) for p in contracts]
    data = prepare(cfg)
    documents, _ = load_documents(cfg)
    restored = documents_in(rows_of(data.train) + rows_of(data.heldout), data.tokenizer)
    # Every document arrives whole, as cleaning left it.
    assert sorted(restored) == sorted(clean_text(text, cfg.clean) for text in documents["text"])
    assert data.stats["heldout"]["documents"] == 3 and data.stats["train"]["longest_document"] > 512 * 3


def test_cleaning_and_dedup_run_inside_prepare_and_are_counted(tmp_path):
    """Markup is cleaned, a document that cleaning empties is counted, a duplicate file is removed and counted."""
    folder = tmp_path / "docs"
    folder.mkdir()
    body = " ".join(f"Section {i}. The Licensee shall pay the fees set forth in Schedule {i}." for i in range(60))
    (folder / "a.txt").write_text(f"<p>{body}</p>")
    (folder / "b.txt").write_text(body)  # the same document once a's markup is gone
    (folder / "c.txt").write_text("Plaintiff v. Defendant, 347 U.S. 483 (1954). " * 40)
    (folder / "d.txt").write_text("<p></p>")  # nothing left after cleaning
    (folder / "e.txt").write_text("")  # skipped when loading
    cfg = DataConfig(paths=[str(folder)], vocab_size=300, seq_len=64, cache_dir=str(tmp_path / "cache"))
    data = prepare(cfg)
    assert data.stats["clean"]["emptied"] == 1
    assert data.stats["clean"]["characters_out"] < data.stats["clean"]["characters_in"]
    assert data.stats["dedup"]["exact_duplicates"] == 1 and data.stats["dedup"]["kept"] == 2
    assert data.stats["train"]["documents"] + data.stats["heldout"]["documents"] == 2
    text = data.tokenizer.decode(data.train[0]["input_ids"] + data.heldout[0]["input_ids"])
    assert "<p>" not in text
    report = format_stats(data.stats)
    assert "dedup      1 exact, 0 near and 0 contained" in report and "(exact, similarity 1.00)" in report

    # Every prepare run leaves its report and a length histogram next to the rows; every document is accounted for.
    saved = json.loads((Path(data.stats["rows_dir"]) / "report.json").read_text())
    docs = saved["documents"]
    assert docs["read"] == 5 and docs["skipped"] == {"empty file": 1}
    removed = docs["exact_duplicates"] + docs["near_duplicates"] + docs["containment_duplicates"]
    assert docs["read"] - sum(docs["skipped"].values()) - docs["emptied_by_cleaning"] - removed == 2
    assert docs["kept"] == 2 and saved["characters"] > 0
    assert (Path(data.stats["rows_dir"]) / "lengths.png").stat().st_size > 1000

    # Throughput is the input read (the files' bytes, markup and all) per second of the whole prepare.
    assert saved["input_bytes"] == sum(path.stat().st_size for path in folder.iterdir())
    assert saved["wall_s"] >= sum(saved["seconds"].values())
    assert saved["mb_per_s"] == pytest.approx(saved["input_bytes"] / 1e6 / saved["wall_s"])
    assert f"all {saved['wall_s']:.2f} ({saved['mb_per_s']:.2f} MB/s read)" in report


def test_a_document_contained_in_another_is_removed_and_counted(tmp_path):
    folder = tmp_path / "docs"
    folder.mkdir()
    rng = random.Random(0)
    words = [f"term{i}" for i in range(400)]
    agreement = " ".join(rng.choice(words) for _ in range(1500))
    exhibit = " ".join(rng.choice(words) for _ in range(1500))
    (folder / "agreement.txt").write_text(agreement)
    (folder / "filing.txt").write_text(f"{agreement}\n\nEXHIBIT A\n\n{exhibit}")  # the agreement plus an exhibit
    (folder / "other.txt").write_text(" ".join(rng.choice(words) for _ in range(1500)))
    cfg = DataConfig(paths=[str(folder)], vocab_size=300, seq_len=64, cache_dir=str(tmp_path / "cache"))
    data = prepare(cfg)
    docs = json.loads((Path(data.stats["rows_dir"]) / "report.json").read_text())["documents"]
    assert docs["containment_duplicates"] == 1 and docs["exact_duplicates"] + docs["near_duplicates"] == 0
    assert docs["read"] - docs["containment_duplicates"] == docs["kept"] == 2
    summary = format_stats(data.stats)
    assert "0 near and 1 contained duplicates removed" in summary
    assert f"{folder / 'agreement.txt'} duplicates {folder / 'filing.txt'} (containment, similarity 1.00)" in summary
