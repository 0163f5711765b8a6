"""scripts/ab_attention.py as a CPU dry run: one commit twice (exported, and as a worktree), and its argument checks."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "ab_attention.py"
GIT = shutil.which("git") is not None and (ROOT / ".git").exists()
needs_git = pytest.mark.skipif(not GIT, reason="needs a git checkout")
BENCH = ["--device", "cpu", "--masks", "causal", "--head-dims", "64", "--impls", "reference", "--modes", "fwd"]


@pytest.fixture
def ab(load_script):
    return load_script("ab_attention")


def _worktrees() -> list[str]:
    listed = subprocess.run(["git", "-C", str(ROOT), "worktree", "list"], capture_output=True, text=True)
    return listed.stdout.splitlines()


@needs_git
def test_one_commit_twice_as_export_and_worktree(ab, tmp_path, capsys):
    before = _worktrees()
    assert ab.main(["--commits", "HEAD", "--export", str(tmp_path / "ab")]) == 0
    [exported] = (tmp_path / "ab").iterdir()
    assert (exported / "legalpt" / "attention" / "kernels.py").is_file() and (exported / "csrc").is_dir()
    argv = ["--commits", str(exported), "HEAD", "--work", str(tmp_path / "work"), "--", *BENCH, "--kernel-times", "1"]
    assert ab.main(argv) == 0
    runs = sorted((tmp_path / "work" / "runs").iterdir())
    assert [r.name for r in runs] == [f"0-{exported.name}", f"1-{exported.name}"]  # the export is named by its sha
    assert all(len(list(r.glob("attention-*.json"))) == 1 for r in runs)
    codes = [json.loads(next(r.glob("attention-*.json")).read_text())["header"]["code"] for r in runs]
    assert codes == [f"code of {exported.name} (scripts/ab_attention.py)"] * 2  # not the checkout's commit
    table = capsys.readouterr().out.split("ratios: the first commit's ms over each one's")[1]
    rows = [line for line in table.splitlines() if line.startswith("reference")]
    # the causal sweep's three seqlens and the GQA sweep's two, the first run against itself
    assert len(rows) == 5 and all("(1.000x)" in row for row in rows)
    assert "legalpt::attention_forward" in table  # each run's longest operators
    assert _worktrees() == before


def test_head_dims_follow_the_benchmark(ab):
    assert ab.head_dims(["--masks", "causal"]) == (64, 128)
    assert ab.head_dims(["--head-dims", "128", "64", "--masks", "causal"]) == (128, 64)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--commits", "HEAD", "--", *BENCH], "two or more"),
        (["--commits", "HEAD", "HEAD", "--", "--out", "x"], "--out is set per commit"),
    ],
)
def test_bad_arguments_say_what_is_expected(ab, argv, message, capsys):
    with pytest.raises(SystemExit):
        ab.parse_args(argv)
    assert message in capsys.readouterr().err


@needs_git
def test_an_unknown_commit_is_named_before_any_worktree(ab, tmp_path):
    before = _worktrees()
    with pytest.raises(SystemExit, match="no-such-commit"):
        ab.main(["--commits", "HEAD", "no-such-commit", "--work", str(tmp_path), "--", *BENCH])
    assert _worktrees() == before
