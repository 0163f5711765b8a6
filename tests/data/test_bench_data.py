"""scripts/bench_data.py end to end on a tiny corpus: the JSON record's header, rows, and their consistency."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

from legalpt.data.demo import generate_documents

ROOT = Path(__file__).resolve().parents[2]
HEADER_FIELDS = {"machine", "python", "torch", "datasets", "tokenizers", "commit", "date", "command"}


def expected_corpus(mb: float, seed: int) -> tuple[int, int]:
    """(documents, bytes) of the first demo documents, 64 per seed from `seed` on, that reach `mb` MB."""
    documents, size = 0, 0
    while True:
        for document in generate_documents(64, seed):
            documents, size = documents + 1, size + len(document["text"].encode())
            if size >= mb * 10**6:
                return documents, size
        seed += 1


def test_bench_data_writes_a_consistent_record(tmp_path, rng):
    seed, seq_len = rng.randrange(1000), rng.choice([64, 128, 256])
    command = [sys.executable, str(ROOT / "scripts" / "bench_data.py"), "--mb", "0.2", "--repeats", "1"]
    command += ["--seed", str(seed), "--seq-len", str(seq_len), "--vocab-size", "300", "--out", str(tmp_path)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LEGALPT_COMMIT": "test-commit"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    [path] = tmp_path.glob("data-*.json")
    record = json.loads(path.read_text())

    header = record["header"]
    assert set(header) >= HEADER_FIELDS and header["commit"] == "test-commit"
    assert header["benchmark"] == "data" and path.name.startswith(f"data-{header['gpu']}-")
    assert header["machine"]["cpu_count"] == os.cpu_count() and "--mb 0.2" in header["command"]
    documents, raw_bytes = expected_corpus(0.2, seed)
    assert (header["corpus"]["documents"], header["corpus"]["raw_bytes"]) == (documents, raw_bytes)

    rows = {row["variant"]: row for row in record["rows"]}
    assert set(rows) == {"ours_full", "ours_tok_pack", "baseline"}
    baseline = rows["baseline"]
    for row in rows.values():
        assert len(row["seconds"]) == 1 and row["median_s"] == row["seconds"][0] > 0
        assert math.isclose(row["mb_per_s"], raw_bytes / 1e6 / row["median_s"], rel_tol=0.01)
        assert math.isclose(row["over_baseline"], row["median_s"] / baseline["median_s"], rel_tol=0.01)
        assert row["documents"] == documents  # distinct documents: dedup removes none
    assert rows["ours_full"]["met"] == (rows["ours_full"]["over_baseline"] <= 1.5)
    # Two tokenization paths, the same tokens. The baseline drops the remainder of each worker's share (at most
    # num_proc of them, each shorter than a block); we pad the tails of two splits.
    tokens, num_proc = baseline["tokens"], header["settings"]["num_proc"]
    assert rows["ours_tok_pack"]["tokens"] == tokens
    assert tokens // seq_len - (num_proc - 1) <= baseline["rows"] <= tokens // seq_len
    packed = math.ceil((tokens + documents) / seq_len)
    assert packed <= rows["ours_tok_pack"]["rows"] <= packed + 1
