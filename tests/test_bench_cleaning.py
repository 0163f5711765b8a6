"""scripts/bench_cleaning.py on a reduced labelled set: the furniture targets, EDGAR footers and page numbers gone,
signature blocks kept, no citation made by cleaning; and its record."""

import json

import pytest

from legalpt.config import CleanConfig


@pytest.fixture
def bench(load_script):
    return load_script("bench_cleaning")


def test_synthetic_pages_meet_the_furniture_targets_and_keep_citations(bench):
    args = bench.parse_args(["--real", "0", "--demo", "6", "--seed", "3"])
    docs = [doc for doc in bench.labelled_set(args) if doc.kind == "synthetic"]
    assert {doc.name.split(":")[0] for doc in docs} == set(bench.STYLES)
    scored = bench.score(docs)
    assert scored["precision"] >= bench.TARGETS["precision"] and scored["recall"] >= bench.TARGETS["recall"], scored
    cases = scored["cases"]
    for case in ("edgar_footer", "page_number", "running_header", "running_footer"):
        assert cases[f"synthetic/furniture:{case}"].get("kept", 0) == 0, case
    for case in ("signature", "list_item", "toc", "split_sentence"):
        assert cases[f"synthetic/{case}"].get("dropped", 0) == 0, case
    cited = bench.citations(docs, CleanConfig())
    assert cited["added"] == [] and cited["kept"] >= bench.TARGETS["citations_kept"] * cited["before"] > 0


def test_real_documents_meet_the_targets(bench):
    args = bench.parse_args(["--real", "12", "--demo", "0"])
    if not args.data.is_dir():
        pytest.skip(f"{args.data} is absent")
    docs = bench.labelled_set(args)
    scored = bench.score(docs)
    assert scored["precision"] >= bench.TARGETS["precision"] and scored["recall"] >= bench.TARGETS["recall"], scored
    assert scored["cases"]["contract/furniture:edgar_footer"].get("kept", 0) == 0
    cited = bench.citations([doc for doc in docs if doc.kind != "synthetic"], CleanConfig())
    assert cited["added"] == [] and cited["kept"] >= bench.TARGETS["citations_kept"] * cited["before"] > 0


def test_the_script_writes_one_record(bench, tmp_path):
    assert bench.main(["--real", "0", "--demo", "2", "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("cleaning-cpu*-*.json")
    result = json.loads(path.read_text())
    assert result["header"]["benchmark"] == "cleaning" and result["targets"] == bench.TARGETS
    assert result["furniture"]["all"]["lines"] > 0 and "synthetic" in result["citations"]


def test_bad_counts_are_refused(bench, capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(["--demo", "-1"])
    assert "--demo must be >= 0" in capsys.readouterr().err
