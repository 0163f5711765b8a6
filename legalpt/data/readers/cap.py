"""Caselaw Access Project case JSON: one document per case, its head matter followed by each opinion, with the
case's name, date, court, citations and opinion types as metadata."""

from __future__ import annotations

from legalpt.data.readers.rows import document_row


def is_cap_case(record: dict) -> bool:
    casebody = record.get("casebody")
    data = casebody.get("data") if isinstance(casebody, dict) else None
    return isinstance(data, dict) and isinstance(data.get("opinions"), list)


def from_cap_case(case: dict, where: str, path: str) -> dict[str, str]:
    data = case["casebody"]["data"]
    opinions = [op for op in data["opinions"] if isinstance(op, dict) and isinstance(op.get("text"), str)]
    head = data.get("head_matter") if isinstance(data.get("head_matter"), str) else ""
    text = "\n\n".join(part for part in [head, *(op["text"] for op in opinions)] if part.strip())
    court = case.get("court")
    meta = {
        "name": case.get("name_abbreviation") or case.get("name"),
        "decision_date": case.get("decision_date"),
        "court": court.get("name") if isinstance(court, dict) else court,
        "citations": [c.get("cite") for c in case.get("citations") or [] if isinstance(c, dict)],
        "opinion_types": [op.get("type") for op in opinions],
    }
    doc_id = str(case["id"]) if case.get("id") is not None else where
    return document_row(text, doc_id=doc_id, source=path, kind="opinion", meta=meta, where=where)
