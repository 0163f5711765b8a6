"""Helpers of the instruction-set tests: a small written contract and opinion, and a data folder of copies."""

import json

CONTRACT = """Exhibit 10.1
SUPPLY AGREEMENT
This Supply Agreement (the "Agreement") is made as of May 1, 2020 by and between Acme Widgets, Inc., a Delaware
corporation ("Acme"), and Beta Stores LLC, a Texas limited liability company ("Buyer").
1. Definitions. Capitalized terms have the meanings given in this Section.
2.1 Term. This Agreement shall commence on the Effective Date and continue for three (3) years. It renews yearly.
2.2 Price. Buyer shall pay the prices in Exhibit A.
10.4 Governing Law. This Agreement shall be governed by the laws of the State of Texas.
"""
OPINION = {
    "name": "SMITH v. JONES",
    "name_abbreviation": "Smith v. Jones",
    "decision_date": "1999-01-01",
    "citations": [{"type": "official", "cite": "123 F.3d 456"}],
    "casebody": {
        "data": {
            "opinions": [
                {
                    "type": "majority",
                    "text": "We follow Baker v. Selden, 101 U.S. 99 (1880). Id. at 102. See 17 U.S.C. § 102(b).",
                }
            ]
        }
    },
}


def write_documents(folder, contracts: int, opinions: int) -> None:
    (folder / "contracts").mkdir(parents=True)
    (folder / "opinions").mkdir()
    for i in range(contracts):
        (folder / "contracts" / f"ACME{i}_05_01_2020-EX-10.1-SUPPLY AGREEMENT.txt").write_text(CONTRACT)
    for i in range(opinions):
        (folder / "opinions" / f"smith{i}.json").write_text(json.dumps(OPINION))
