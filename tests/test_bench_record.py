"""scripts/benchmarking/record.py: every benchmark record's header, its name, and one current record per benchmark
and GPU."""

import importlib
import json
import os
from pathlib import Path

import pytest
import torch

import legalpt

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


@pytest.fixture
def record(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))
    return importlib.import_module("benchmarking.record")


def test_the_header_names_machine_versions_commit_date_and_command(record, monkeypatch):
    monkeypatch.setenv("LEGALPT_COMMIT", "abc1234-dirty")
    head = record.header("data", "cpu", SCRIPTS / "bench_data.py", ["--mb", "0.2"], seq_len=64)
    assert head["benchmark"] == "data" and head["gpu"] == f"cpu{os.cpu_count()}" and head["gpu_count"] == 0
    assert (head["torch"], head["cuda"]) == (torch.__version__, torch.version.cuda)
    assert head["legalpt"] == legalpt.__version__
    assert head["transformers"] and head["commit"] == "abc1234-dirty" and head["seq_len"] == 64
    assert head["date"].endswith("+00:00")  # UTC, ISO 8601
    assert head["command"].split()[1:] == ["scripts/bench_data.py", "--mb", "0.2"]


def test_a_record_replaces_the_older_ones_of_its_benchmark_and_gpu(record, tmp_path):
    keep = ["generate-cpu2-20200101.json", "data-cpu4-20200101.json", "data-cpu2-20200101-other.json"]
    gone = ["data-cpu2-20200101.json", "data-cpu2-20200101.png", "data-cpu2-20210101.json"]
    for name in keep + gone:
        (tmp_path / name).write_text("{}")
    head = {"benchmark": "data", "gpu": "cpu2", "date": "2024-03-05T10:00:00+00:00"}
    path = record.write(tmp_path, {"header": head, "rows": [1]})
    assert path == tmp_path / "data-cpu2-20240305.json" and json.loads(path.read_text())["rows"] == [1]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*keep, path.name])
    assert record.current(tmp_path, "data", "cpu2") == path


def test_a_gpu_name_becomes_a_file_name(record, tmp_path):
    head = {"benchmark": "attention", "gpu": "NVIDIA H200", "date": "2024-03-05T10:00:00+00:00"}
    assert record.path_of(tmp_path, head).name == "attention-NVIDIA-H200-20240305.json"
    assert record.current(tmp_path, "attention", "NVIDIA H200") is None


def test_a_merged_record_keeps_every_runs_command_commit_and_date(record):
    """Rows merged from runs at other commits keep where each came from, in order, however many merges in."""
    first = {"command": "a", "commit": "1111111", "date": "2026-12-05T10:00:00+00:00"}
    second = {"command": "b", "commit": "2222222-dirty", "date": "2026-12-07T10:00:00+00:00"}
    third = {"command": "c", "commit": "3333333", "date": "2026-12-08T10:00:00+00:00"}
    merged = {**second, **record.parts(first, second)}
    again = record.parts(merged, third)
    assert again["parts"] == ["a", "b", "c"]
    assert again["part_provenance"] == [
        "commit 1111111, 2026-12-05", "commit 2222222-dirty, 2026-12-07", "commit 3333333, 2026-12-08"
    ]  # fmt: skip


def test_a_record_merged_before_provenance_was_kept_names_its_last_part(record, load_script):
    older = {"parts": ["a", "b"], "command": "b", "commit": "1111111", "date": "2026-12-05T10:00:00+00:00"}
    new = {"command": "c", "commit": "2222222", "date": "2026-12-07T10:00:00+00:00"}
    merged = record.parts(older, new)
    assert merged["parts"] == ["a", "b", "c"]
    assert merged["part_provenance"] == ["", "commit 1111111, 2026-12-05", "commit 2222222, 2026-12-07"]
    lines = load_script("performance_table").commands({**new, **merged})
    assert lines[1:4] == ["a  # commit unknown", "b  # commit 1111111, 2026-12-05", "c  # commit 2222222, 2026-12-07"]
