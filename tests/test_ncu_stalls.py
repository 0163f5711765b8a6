"""scripts/ncu_stalls.py on a small table in the layout of ncu's source page (CSV)."""

import csv
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "ncu_stalls.py"
HEADER = [
    "Address",
    "Source",
    "Warp Stall Sampling (All Samples)",
    "Warp Stall Sampling (Not-issued Samples)",
    "Instructions Executed",
    "stall_wait",
    "stall_barrier",
    "stall_wait (Not Issued)",
    "stall_barrier (Not Issued)",
]
# (sass, samples, executed, wait, barrier): a loop whose second stretch, ended by the barrier, holds most samples
ROWS = [
    ("FFMA R1, R2, R3, R4", 10, 100, 10, 0),
    ("HGMMA.64x64x16.F32.BF16 R8, gdesc[UR4], R8", 5, 100, 5, 0),
    ("MUFU.EX2 R1, R1", 30, 100, 30, 0),
    ("BAR.SYNC.DEFER_BLOCKING 0x1, 0x100", 55, 100, 0, 55),
]


@pytest.fixture
def ncu_stalls(load_script):
    return load_script("ncu_stalls")


@pytest.fixture
def table(tmp_path):
    path = tmp_path / "k-sass.csv"
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["Kernel Name", "void k(int)"])
        out.writerow(HEADER)
        for k, (sass, samples, executed, wait, barrier) in enumerate(ROWS):
            out.writerow([hex(k * 16), f"      {sass}", samples, samples, executed, wait, barrier, wait, barrier])
    return path


def test_reads_the_samples_and_reasons(ncu_stalls, table):
    kernel, instructions = ncu_stalls.read(table)
    assert kernel == "void k(int)"
    assert [i.samples for i in instructions] == [10, 5, 30, 55]
    assert instructions[3].reasons == {"barrier": 55}  # the "(Not Issued)" columns are not counted twice
    lines = ncu_stalls.summary(instructions, top=2)
    assert lines[0] == "4 instructions, 100 samples"
    assert lines[1].startswith("by reason: barrier 55.00 wait 45.00")
    assert lines[2].startswith("#3") and "BAR.SYNC" in lines[2] and lines[3].startswith("#2")


def test_stretches_end_at_landmarks(ncu_stalls, table):
    _, instructions = ncu_stalls.read(table)
    lines = ncu_stalls.stretches(instructions, min_share=0.0)
    assert [line.split()[0] for line in lines] == ["0-1", "2-3"]
    assert "15.00%" in lines[0] and "85.00%" in lines[1]
    assert ncu_stalls.stretches(instructions, min_share=20.0) == lines[1:]


def test_main_prints_both_views(ncu_stalls, table, capsys):
    assert ncu_stalls.main([str(table), "--top", "1", "--stretches"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "## void k(int)" and out[3].startswith("#3") and out[5].startswith("    0-1")


def test_rejects_another_table(ncu_stalls, tmp_path):
    path = tmp_path / "other.csv"
    path.write_text("a,b\n1,2\n3,4\n")
    with pytest.raises(SystemExit, match="not ncu's source page"):
        ncu_stalls.read(path)
