"""The document-kind guess: statutes and plain text, the demo corpus, short-header opinions (attorney discipline, per
curiam, orders) against contracts that look like them, and real contracts and opinions, whole and body only."""

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


# Opinions whose header is a line or two: no caption with "v.", no "delivered the opinion".
SHORT_HEADER_OPINIONS = [
    "PER CURIAM.\nRespondent was admitted to the practice of law in this State in 1998. The Board of Professional "
    "Responsibility found that respondent converted client funds held in trust and failed to answer the disciplinary "
    "complaint, in violation of Rules 1.15 and 8.1(b) of the Rules of Professional Conduct, and recommends "
    "disbarment. Respondent filed no exceptions. Upon review of the record, we adopt the Board's findings. "
    "Respondent is disbarred, effective immediately.",
    "In re Disciplinary Proceedings Against Mary L. Roe.\nORDER\nThe Office of Disciplinary Counsel filed a "
    "complaint alleging that respondent neglected two client matters and made false statements to a tribunal. "
    "Respondent stipulated to the misconduct and consented to a public reprimand. Having considered the stipulation, "
    "IT IS ORDERED that Mary L. Roe is publicly reprimanded. IT IS FURTHER ORDERED that she pay the costs of the "
    "proceeding within sixty days.",
    "ORDER OF SUSPENSION\nUpon consideration of the Joint Petition for Indefinite Suspension by Consent filed by the "
    "Attorney Grievance Commission and Respondent, it is ORDERED, by the Court of Appeals, that Respondent be, and he "
    "hereby is, indefinitely suspended from the practice of law, and the Clerk shall strike his name from the roll "
    "of attorneys.",
    "HOLLOWAY, J.\nThe defendant appeals from the judgment of conviction of burglary in the second degree, claiming "
    "that the trial court erred in denying his motion to suppress the statements he gave the police. We disagree and "
    "affirm. The jury reasonably could have found that the defendant entered the dwelling at night; the officers "
    "testified that he was advised of his rights before he spoke. The judgment is affirmed.",
    "Before KESSLER, ORTIZ, and WEN, Circuit Judges.\nPER CURIAM:\nThe petition for rehearing is DENIED. The full "
    "court has been advised of the petition for rehearing en banc, and no judge has requested a vote on whether to "
    "rehear the matter en banc. Fed. R. App. P. 35. The petition for rehearing en banc is DENIED.",
    "MEMORANDUM OPINION\nThis matter is before the Court on the respondent's motion to dismiss the petition for a "
    "writ of habeas corpus as untimely. The petitioner was sentenced in 2011 and did not seek review in the state "
    "supreme court. For the reasons that follow, the motion is granted and the petition is dismissed. See Day v. "
    "McDonough, 547 U.S. 198, 209 (2006). Id. at 210. SO ORDERED.",
    "Opinion\nMARSH, P. J.\nPlaintiff sued the county for injuries she suffered in a fall on a public sidewalk. The "
    "trial court granted summary judgment for the county, finding no evidence that it had notice of the defect. We "
    "conclude the evidence raised a triable issue and reverse. (Gov. Code, § 835; Bonanno v. Central Contra Costa "
    "Transit Authority (2003) 30 Cal.4th 139, 146 [132 Cal.Rptr.2d 341].)",
]
# Contracts with an opinion's words: a court order form, a settlement, a purchase order.
CONTRACT_LOOKALIKES = [
    "PURCHASE ORDER\nThis Purchase Order is issued by Buyer to Supplier under the Master Supply Agreement dated "
    'March 1, 2019 (the "Agreement"). Supplier agrees to deliver the goods listed below by the Delivery Date. Any '
    "terms of Supplier's acknowledgment that conflict with the Agreement are hereby rejected. Buyer may terminate "
    "this order for convenience on written notice.",
    "SETTLEMENT AGREEMENT AND RELEASE\nThis Settlement Agreement is entered into by and between Plaintiff John Doe and "
    'Defendant Acme Corp. (together, the "Parties"). WHEREAS Plaintiff filed an action in the United States District '
    "Court, and WHEREAS the Parties wish to resolve it, NOW, THEREFORE, the Parties agree that Defendant shall pay "
    "the Settlement Amount and Plaintiff shall file a stipulation of dismissal with prejudice, which the Court may "
    "so order. IN WITNESS WHEREOF the Parties have executed this Agreement.\nBy: John Doe\nBy: Acme Corp.",
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


def test_short_header_opinions_are_opinions_and_lookalike_contracts_contracts():
    assert [guess_kind(t) for t in SHORT_HEADER_OPINIONS] == ["opinion"] * len(SHORT_HEADER_OPINIONS)
    assert [guess_kind(t) for t in CONTRACT_LOOKALIKES] == ["contract"] * len(CONTRACT_LOOKALIKES)


def without_header(text: str) -> str:
    """The body of an opinion: its leading short lines ("Opinion", "BIRD, C. J.", "concurring.") dropped."""
    lines = text.split("\n")
    while lines and len(lines[0]) < 60:
        lines.pop(0)
    return "\n".join(lines)


@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="the shared sample documents are absent")
def test_kind_guess_on_real_documents():
    """From the text alone (the file names would give contracts away). Measured: 42/42 contracts and 6/6 whole cases
    (head matter and opinions); each opinion alone (majority, concurrences, dissents) 10/10, and 10/10 without its
    byline; no contract read from its 3000th character on is taken for an opinion (39/42 contracts, 3 other)."""
    contracts = [p.read_text(encoding="utf-8") for p in sorted((SHARED_DATA / "contracts").glob("*.txt"))]
    cases, opinions = [], []
    for path in sorted((SHARED_DATA / "opinions").glob("*.json")):
        data = json.loads(path.read_text())["casebody"]["data"]
        cases.append("\n\n".join([data.get("head_matter") or "", *(op["text"] for op in data["opinions"])]))
        opinions += [op["text"] for op in data["opinions"]]
    right = sum(guess_kind(t) == "contract" for t in contracts) + sum(guess_kind(t) == "opinion" for t in cases)
    assert right >= 0.95 * (len(contracts) + len(cases))
    assert [guess_kind(t) for t in opinions] == ["opinion"] * len(opinions)
    assert [guess_kind(without_header(t)) for t in opinions] == ["opinion"] * len(opinions)
    assert "opinion" not in {guess_kind(t[3000:]) for t in contracts}
