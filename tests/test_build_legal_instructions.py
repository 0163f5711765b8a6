"""scripts/build_legal_instructions.py: the questions of a small written contract and opinion, each response quoted
from its source, skips counted by reason, documents split whole and the same way every time; and on the real
documents of ../shared/data."""

import json

import pytest
from instruction_helpers import CONTRACT, OPINION, write_documents


@pytest.fixture
def builder(load_script):
    return load_script("build_legal_instructions")


def test_a_contract_gives_its_sections_parties_term_and_law(builder):
    examples, skipped = builder.contract_examples("ACME_05_01_2020-EX-10.1-SUPPLY AGREEMENT.txt", CONTRACT)
    subject = "the Supply Agreement of ACME"
    term = "This Agreement shall commence on the Effective Date and continue for three (3) years."
    law = "This Agreement shall be governed by the laws of the State of Texas."
    assert [(e.kind, e.prompt, e.response) for e in examples] == [
        ("contract_section", f"What does section 1 (Definitions) of {subject} provide?",
         "Capitalized terms have the meanings given in this Section."),
        ("contract_section", f"What does section 2.1 (Term) of {subject} provide?", term),
        ("contract_section", f"What does section 2.2 (Price) of {subject} provide?",
         "Buyer shall pay the prices in Exhibit A."),
        ("contract_section", f"What does section 10.4 (Governing Law) of {subject} provide?", law),
        ("contract_term", f"What is the term of {subject}?", term),
        ("governing_law", f"Which law governs {subject}?", law),
        ("contract_parties", f"Who are the parties to {subject}?", "Acme Widgets, Inc. and Beta Stores LLC"),
    ]  # fmt: skip
    assert not skipped


def test_an_opinion_gives_its_citation_and_the_cases_it_cites(builder):
    examples, skipped = builder.opinion_examples("smith.json", OPINION)
    assert [(e.kind, e.prompt, e.response) for e in examples] == [
        ("case_citation", "Give the citation for Smith v. Jones.", "123 F.3d 456"),
        ("cited_case", "Give the citation for Baker v. Selden.", "101 U.S. 99"),
    ]
    assert skipped == {
        "cited case: IdCitation, not a full case citation": 1,
        "cited case: FullLawCitation, not a full case citation": 1,
    }


def test_what_gives_no_question_is_counted_by_reason(builder):
    text = "CONSULTING AGREEMENT\nThe consultant shall advise the company.\n3.1 Fees. Each " + "word " * 200 + "end."
    examples, skipped = builder.contract_examples("x.txt", text)
    assert examples == []
    assert skipped == {
        "section: no sentence end within 600 characters": 1,
        "term: no Term section or sentence": 1,
        "governing law: no governing-law sentence": 1,
        "parties: no 'between' in the opening": 1,
    }


def test_documents_are_split_whole_and_reproducibly(builder, tmp_path):
    write_documents(tmp_path / "data", contracts=10, opinions=3)
    examples, report = builder.build(tmp_path / "data", fraction=0.2, seed=3)
    assert len(report["documents"]["heldout"]) == 3  # 2 of 10 contracts, 1 of 3 opinions
    sources = {part: {e.source for e in examples[part]} for part in examples}
    assert not sources["train"] & sources["heldout"]
    # Every contract asks its own questions; the held-out opinion asks what a train opinion asks, so it is counted.
    assert report["examples"]["heldout"] == {"contract_section": 8, "contract_term": 2, "governing_law": 2,
                                             "contract_parties": 2}  # fmt: skip
    assert report["skipped"]["held-out question also asked in the train split"] == 2
    assert report["skipped"]["question asked before in its split"] == 2  # the second train opinion's two
    assert builder.build(tmp_path / "data", fraction=0.2, seed=3) == (examples, report)
    assert builder.build(tmp_path / "data", fraction=0.2, seed=4)[1]["documents"] != report["documents"]


def test_the_script_writes_both_splits_and_the_report(builder, tmp_path):
    write_documents(tmp_path / "data", contracts=4, opinions=2)
    assert builder.main(["--data", str(tmp_path / "data"), "--out", str(tmp_path / "out")]) == 0
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    for part in ("train", "heldout"):
        rows = [json.loads(line) for line in (tmp_path / "out" / f"{part}.jsonl").read_text().splitlines()]
        kinds = {kind: sum(row["kind"] == kind for row in rows) for kind in report["examples"][part]}
        assert kinds == report["examples"][part] and sum(kinds.values()) == len(rows) > 0
        assert all(row["prompt"] and row["response"] for row in rows)


def test_real_documents_give_every_kind_each_response_quoted_from_its_source(builder):
    data = builder.DATA
    if not data.is_dir():
        pytest.skip(f"{data} is absent")
    examples, report = builder.build(data, fraction=0.2, seed=0)
    sources = {path.name: " ".join(path.read_text(encoding="utf-8").split()) for path in data.glob("contracts/*")}
    for path in data.glob("opinions/*.json"):
        sources[path.name] = " ".join(" ".join(_strings(json.loads(path.read_text()))).split())
    for example in (e for part in examples.values() for e in part):
        assert all(span in sources[example.source] for span in example.evidence), example
        rest = example.response
        for span in example.evidence:
            rest = rest.replace(span, "", 1)
        assert rest.strip() in ("", "and"), example  # the response is its evidence, joined by "and"
    split = {part: {e.source for e in examples[part]} for part in examples}
    assert not split["train"] & split["heldout"]
    assert not {e.prompt for e in examples["train"]} & {e.prompt for e in examples["heldout"]}
    for part in ("train", "heldout"):
        assert set(report["examples"][part]) == set(builder.KINDS), part


def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict | list):
        for item in value.values() if isinstance(value, dict) else value:
            yield from _strings(item)
