"""Streaming data: rows hold every document once, ranks share documents disjointly, and a resumed stream continues
with the next unseen batch; also a streaming training run interrupted and resumed."""

import itertools
import json
from collections import Counter

import pytest
import torch
from transformers import AutoModelForCausalLM

from legalpt.config import CleanConfig, DataConfig, SourceConfig
from legalpt.data.clean import clean_text
from legalpt.data.pack import pack_documents
from legalpt.data.sources import load_documents
from legalpt.data.stream import PackedStream, in_heldout, prepare_stream, stream_batches, stream_records
from legalpt.data.tokenizer import train_bpe
from legalpt.eval.run import heldout_documents

WORDS = ["the", "court", "held", "that", "plaintiff", "agreement", "shall", "party", "lease", "notice", "breach",
         "appeal", "contract", "section"]  # fmt: skip


def random_text(rng, low: int = 1, high: int = 120) -> str:
    return " ".join(rng.choice(WORDS) + str(rng.randrange(100)) for _ in range(rng.randint(low, high)))


@pytest.fixture(scope="module")
def tokenizer():
    return train_bpe([" ".join(WORDS) + " 0123456789"] * 10, 300)


def write_corpus(folder, rng, files: int, per_file: int) -> list[str]:
    """`files` .jsonl files of random documents, with a record lacking its text and a broken line in the first;
    returns the documents' texts in reading order."""
    folder.mkdir()
    texts = []
    for f in range(files):
        lines = []
        for _ in range(per_file):
            texts.append(random_text(rng))
            lines.append(json.dumps({"id": f"{f}-{len(texts)}", "text": texts[-1]}))
        if f == 0:
            lines[1:1] = [json.dumps({"body": "no text field"}), "{broken"]
        (folder / f"part {f}.jsonl").write_text("\n".join(lines) + "\n")
    return texts


def stream(paths, tokenizer, seq_len: int, **kwargs) -> PackedStream:
    records = stream_records(DataConfig(paths=[str(paths)]))
    return PackedStream(records, tokenizer, seq_len, **kwargs)


def documents_of(rows: list[dict], eos: int) -> list[list[int]]:
    """The documents packed in `rows` (without their eos), rebuilt from the segments, chunks joined."""
    documents, current = [], []
    for row in rows:
        start = 0
        for length in row["seq_lens"]:
            segment = row["input_ids"][start : start + length]
            start += length
            if start > len(row["input_ids"]) - row["num_pad"]:
                break  # the padding segment
            current += segment
            if segment[-1] == eos:
                documents.append(current[:-1])
                current = []
    assert current == []
    return documents


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_rows_hold_every_document_once_in_order(tmp_path, tokenizer, rng):
    seq_len = rng.choice([16, 48, 100])
    texts = write_corpus(tmp_path / "corpus", rng, files=2, per_file=rng.randint(5, 30))
    packed = stream(tmp_path / "corpus", tokenizer, seq_len, epochs=1)
    rows = list(packed)

    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    assert all(len(row["input_ids"]) == seq_len and sum(row["seq_lens"]) == seq_len for row in rows)
    assert [row["num_pad"] > 0 for row in rows[:-1]] == [False] * (len(rows) - 1)
    assert rows[-1]["input_ids"][seq_len - rows[-1]["num_pad"] :] == [pad] * rows[-1]["num_pad"]
    flat = [i for row in rows for i in row["input_ids"][: seq_len - row["num_pad"]]]
    assert flat == [i for text in texts for i in [*encode(tokenizer, text), eos]]
    assert documents_of(rows, eos) == [encode(tokenizer, text) for text in texts]
    assert packed.skipped.counts == {"missing text field": 1, "invalid json": 1}
    assert packed.state_dict()["counts"] == {"documents": len(texts), "rows": len(rows)}
    # The other packing options give the rows of the in-memory pipeline's packer.
    bos, eos_on, overlap = rng.random() < 0.5, rng.random() < 0.5, rng.randrange(seq_len // 2)
    options = {"bos": bos, "eos": eos_on, "overlap": overlap}
    reference = pack_documents((encode(tokenizer, t) for t in texts), seq_len, eos if eos_on else None, pad,
                               tokenizer.bos_token_id if bos else None, overlap)  # fmt: skip
    assert list(stream(tmp_path / "corpus", tokenizer, seq_len, epochs=1, **options)) == list(reference)


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_ranks_get_disjoint_shares_of_every_document(tmp_path, tokenizer, rng, world_size):
    # 2 files: whole files per rank for 1 and 2 ranks, every third record for 3.
    texts = write_corpus(tmp_path / "corpus", rng, files=2, per_file=rng.randint(4, 20))
    eos = tokenizer.eos_token_id
    shares = [
        documents_of(list(stream(tmp_path / "corpus", tokenizer, 32, rank=r, world_size=world_size, epochs=1)), eos)
        for r in range(world_size)
    ]
    every = Counter(tuple(encode(tokenizer, text)) for text in texts)
    assert sum((Counter(map(tuple, share)) for share in shares), Counter()) == every
    assert sum(len(share) for share in shares) == len(texts)
    if world_size > 1:
        assert all(share for share in shares)


@pytest.mark.parametrize("world_size", [1, 2, 3])  # 2 files: whole files per rank, or every third record
@pytest.mark.parametrize("packing", ["eos", "bos+overlap"])
def test_resumed_stream_continues_with_the_next_unseen_batch(tmp_path, tokenizer, rng, world_size, packing):
    write_corpus(tmp_path / "corpus", rng, files=2, per_file=rng.randint(4, 10))
    seq_len, batch_size = rng.choice([24, 40]), rng.choice([2, 3])
    options = {"bos": True, "eos": rng.random() < 0.5, "overlap": rng.randrange(1, 12)} if packing != "eos" else {}
    clean = CleanConfig()

    def batches_of(rank: int) -> PackedStream:
        return stream(tmp_path / "corpus", tokenizer, seq_len, clean=clean, rank=rank, world_size=world_size,
                      epochs=2, **options)  # fmt: skip

    for rank in range(world_size):
        uninterrupted = batches_of(rank)
        straight = list(stream_batches(uninterrupted, batch_size))
        k = rng.randrange(1, len(straight))  # two epochs: k may fall in either
        first = batches_of(rank)
        head = list(itertools.islice(stream_batches(first, batch_size), k))
        state = json.loads(json.dumps(first.state_dict()))  # as saved in a checkpoint
        resumed = batches_of(rank)
        resumed.load_state_dict(state)
        tail = list(stream_batches(resumed, batch_size))
        assert len(head) + len(tail) == len(straight)
        for expected, got in zip(straight, head + tail, strict=True):
            assert expected.keys() == got.keys()
            for key, value in expected.items():
                assert torch.equal(value, got[key]) if torch.is_tensor(value) else value == got[key], key
        # Skips and counts carried over: nothing counted twice or lost.
        assert resumed.state_dict() == uninterrupted.state_dict()
        # Row by row from more positions (cheaper than batches).
        rows = list(batches_of(rank))
        for k in rng.sample(range(1, len(rows)), min(8, len(rows) - 1)):
            first = batches_of(rank)
            head = list(itertools.islice(iter(first), k))
            resumed = batches_of(rank)
            resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
            assert head + list(resumed) == rows, k


def test_a_hub_style_record_stream_resumes_too(tmp_path, tokenizer, rng):
    """Records from `datasets.load_dataset(..., streaming=True)` (Arrow batches inside, as for hub datasets)."""
    import datasets

    texts = [random_text(rng) for _ in range(rng.randint(10, 30))]
    files = []
    for f in range(3):
        files.append(tmp_path / f"part-{f}.jsonl")
        files[-1].write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[f::3]))

    def packed(rank: int) -> PackedStream:
        records = datasets.load_dataset("json", data_files=[str(f) for f in files], streaming=True, split="train")
        return PackedStream(records, tokenizer, 24, rank=rank, world_size=2, epochs=2)

    for rank in range(2):
        straight = list(packed(rank))
        first, k = packed(rank), rng.randrange(1, len(straight))
        head = list(itertools.islice(iter(first), k))
        resumed = packed(rank)
        resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
        assert head + list(resumed) == straight


def test_heldout_split_is_disjoint_from_training(tmp_path, tokenizer, rng):
    texts = write_corpus(tmp_path / "corpus", rng, files=1, per_file=40)
    fraction, seed, eos = 0.3, rng.randrange(100), tokenizer.eos_token_id
    splits = {
        split: documents_of(
            list(
                stream(tmp_path / "corpus", tokenizer, 24, split=split, heldout_fraction=fraction, seed=seed, epochs=1)
            ),
            eos,
        )
        for split in ("train", "heldout")
    }
    expected = {split: [encode(tokenizer, t) for t in texts if in_heldout(t, fraction, seed) == (split == "heldout")]
                for split in ("train", "heldout")}  # fmt: skip
    assert splits == expected
    assert 0 < len(splits["heldout"]) < len(texts)


@pytest.mark.parametrize("world_size", [1, 2])
def test_streamed_sources_mix_like_the_in_memory_pipeline_and_resume(tmp_path, tokenizer, rng, world_size):
    write_corpus(tmp_path / "corpus", rng, files=2, per_file=12)
    extra = tmp_path / "extra.jsonl"
    extra.write_text("".join(json.dumps({"body": random_text(rng, 40, 200)}) + "\n" for _ in range(10)))
    source = SourceConfig(name="json", data_files=[str(extra)], text_field="body", kind="opinion", weight=0.5)
    cfg = DataConfig(paths=[str(tmp_path / "corpus")], sources={"extra": source}, cache_dir=str(tmp_path / "cache"))
    in_memory, _ = load_documents(cfg)
    streamed = [record for record in stream_records(cfg) if not record["skip"]]
    assert [(r["id"], r["text"], r["kind"]) for r in streamed] == list(
        zip(in_memory["id"], in_memory["text"], in_memory["kind"], strict=True)
    )
    assert {r["source"] for r in streamed} == {"extra", str(tmp_path / "corpus" / "part 0.jsonl"),
                                               str(tmp_path / "corpus" / "part 1.jsonl")}  # fmt: skip
    for rank in range(world_size):
        rows = list(PackedStream(stream_records(cfg), tokenizer, 32, rank=rank, world_size=world_size, epochs=1))
        k = rng.randrange(1, len(rows))
        first = PackedStream(stream_records(cfg), tokenizer, 32, rank=rank, world_size=world_size, epochs=1)
        head = list(itertools.islice(iter(first), k))
        resumed = PackedStream(stream_records(cfg), tokenizer, 32, rank=rank, world_size=world_size, epochs=1)
        resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
        assert head + list(resumed) == rows


def test_eval_of_a_streamed_run_scores_the_streaming_heldout_split(tmp_path, rng):
    """legalpt-eval on a data.streaming config: the documents held out by the hash rule, never trained on."""
    texts = write_corpus(tmp_path / "corpus", rng, files=2, per_file=30)
    cfg = DataConfig(paths=[str(tmp_path / "corpus")], streaming=True, heldout_fraction=0.3, seed=rng.randrange(100))
    documents, info = heldout_documents(cfg, max_documents=0)
    expected = [t for t in texts if in_heldout(t, cfg.heldout_fraction, cfg.seed)]
    assert [d["text"] for d in documents] == [clean_text(t, cfg.clean) for t in expected]
    assert 0 < info["documents"] < len(texts) and "missing text field" in info["skipped"]
    assert [d["text"] for d in heldout_documents(cfg, max_documents=2)[0]] == [d["text"] for d in documents[:2]]


def test_bad_arguments_are_named(tmp_path, tokenizer, rng):
    write_corpus(tmp_path / "corpus", rng, files=1, per_file=2)
    records = stream_records(DataConfig(paths=[str(tmp_path / "corpus")]))
    with pytest.raises(TypeError, match="records"):
        PackedStream([{"text": "a"}], tokenizer, 8)
    for kwargs, name in [({"seq_len": 1}, "seq_len"), ({"rank": 2, "world_size": 2}, "rank"),
                         ({"split": "test"}, "split"), ({"epochs": 0}, "epochs")]:  # fmt: skip
        with pytest.raises(ValueError, match=name):
            PackedStream(records, tokenizer, **{"seq_len": 8, **kwargs})
    with pytest.raises(ValueError, match="state"):
        PackedStream(records, tokenizer, 8).load_state_dict({"epoch": 0})
    with pytest.raises(ValueError, match=r"data\.paths"):
        prepare_stream(DataConfig(paths=[str(tmp_path / "corpus")], heldout_fraction=0.999999))
    with pytest.raises(ValueError, match="stream_heldout_rows"):
        prepare_stream(DataConfig(paths=[str(tmp_path / "corpus")], stream_heldout_rows=-1))


def test_streaming_training_resumes_like_an_uninterrupted_run(tmp_path, train_until_first_checkpoint):
    import legalpt.train.trainer as trainer
    from legalpt.config import compose
    from legalpt.train.checkpoint import latest_checkpoint

    def overrides(run: str) -> list[str]:
        return ["model=tiny", "data.streaming=true", "data.synthetic_documents=4", "data.seq_len=64",
                "data.vocab_size=300", "data.heldout_fraction=0.3", "data.stream_heldout_rows=2",
                f"data.cache_dir={tmp_path / 'cache'}", "train.steps=4", "train.batch_size=2", "train.warmup_steps=1",
                "train.eval_every=4", "train.eval_batches=1", "train.save_every=2", "train.log_every=2", "logger=none",
                f"train.output_dir={tmp_path / run}"]  # fmt: skip

    straight = trainer.train(compose("train", overrides("a")))

    train_until_first_checkpoint(compose("train", overrides("b")))
    checkpoint = latest_checkpoint(tmp_path / "b")
    assert checkpoint.name == "step_000002" and (checkpoint / "data_state_rank0.json").is_file()

    resumed = trainer.train(compose("train", overrides("b")))
    assert resumed.eval_losses[-1] == straight.eval_losses[-1]
    a = AutoModelForCausalLM.from_pretrained(straight.export_dir)
    b = AutoModelForCausalLM.from_pretrained(resumed.export_dir)
    for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        torch.testing.assert_close(pa, pb, rtol=0, atol=0, msg=name)


def test_streaming_memory_benchmark_adds_its_record(tmp_path, rng):
    import os
    import subprocess
    import sys
    from datetime import datetime, timezone
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    path = tmp_path / f"data-cpu{os.cpu_count()}-{datetime.now(timezone.utc):%Y%m%d}.json"  # this machine's record
    path.write_text(json.dumps({"rows": ["kept"]}))  # a record of the same day, written by the throughput mode
    seq_len = rng.choice([128, 256])
    command = [sys.executable, str(root / "scripts" / "bench_data.py"), "--streaming-memory", "--sizes-mb", "0.2",
               "0.4", "--shards", "1", "--seq-len", str(seq_len), "--vocab-size", "300", "--tokenizer-mb", "0.1",
               "--out", str(tmp_path)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(root), "LEGALPT_COMMIT": "test-commit"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads(path.read_text())
    assert record["rows"] == ["kept"]
    result = record["streaming_memory"]
    assert result["header"]["commit"] == "test-commit" and "--streaming-memory" in result["header"]["command"]
    rows = result["rows"]
    assert [row["mb"] for row in rows] == [0.2, 0.4]
    for row in rows:
        assert row["raw_bytes"] >= row["mb"] * 1e6 and row["documents"] == row["input_documents"] > 0
        assert row["rows"] >= row["raw_bytes"] / 8 / seq_len  # a BPE of 300 tokens: far fewer than 8 bytes a token
        assert row["peak_rss_mib"] >= row["rss_after_imports_mib"] > 0 and row["skipped"] == 0
    peaks = [row["peak_rss_mib"] for row in rows]
    assert result["peak_ratio"] == pytest.approx(max(peaks) / min(peaks), abs=1e-3)
    assert result["met"] == (max(peaks) <= 1.2 * min(peaks))


def test_stream_batches_move_every_value_that_can_move(tmp_path, tokenizer, rng):
    """Tensors go to the device, and so does a value with its own `to` (a context-parallel share's RingPlan)."""

    class Plan:
        def __init__(self, where="cpu"):
            self.where = where

        def to(self, device):
            return Plan(str(device))

    write_corpus(tmp_path / "corpus", rng, files=1, per_file=4)
    packed = stream(tmp_path / "corpus", tokenizer, 32, epochs=1)

    def collate(rows):
        return {"input_ids": torch.tensor([r["input_ids"] for r in rows]), "plan": Plan(), "name": "rows"}

    batch = next(stream_batches(packed, 2, device="meta", collate=collate))
    assert batch["input_ids"].device.type == "meta" and batch["plan"].where == "meta" and batch["name"] == "rows"
