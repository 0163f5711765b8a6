"""The demo corpus as records: documents alternately a contract and a court opinion, each drawn by its own seeded
random source, with a target length drawn log-uniformly between `MIN_CHARS` and `MAX_CHARS`; and the same documents
joined into long ones (`join_documents`) for long-context runs."""

from __future__ import annotations

import random

from legalpt.data.demo.contracts import write_contract
from legalpt.data.demo.opinions import write_opinion

MIN_CHARS = 6_000  # shortest target length in characters (~1.5k tokens, ~1k words)
MAX_CHARS = 220_000  # longest target length (~55k tokens, ~35k words)


def generate_documents(num_documents: int, seed: int = 0) -> list[dict]:
    """`num_documents` synthetic legal documents, alternately a contract and a court opinion, as records
    `{"id", "text", "source": "synthetic", "kind": "contract" | "opinion", "meta": dict}`. `meta` holds what the
    generator put in the text (an opinion's full citations, a contract's sections and defined terms, ...) and the
    target length in characters; it is JSON-serialisable.

    The same (num_documents, seed) gives the same documents in every process; document i depends only on (seed, i)
    and the documents before it, and a (volume, reporter, page) cite names one case in the whole corpus.
    """
    if isinstance(num_documents, bool) or not isinstance(num_documents, int):
        raise TypeError(f"num_documents must be an int, got {type(num_documents).__name__}")
    if num_documents < 1:
        raise ValueError(f"num_documents must be >= 1, got {num_documents}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    documents = []
    cited: set[tuple[int, str, int]] = set()  # the cites of the cases in the corpus so far
    for index in range(num_documents):
        rng = random.Random(f"legalpt-synthetic/{seed}/{index}")
        target = int(MIN_CHARS * (MAX_CHARS / MIN_CHARS) ** rng.random())  # log-uniform
        kind = "contract" if index % 2 == 0 else "opinion"
        text, meta = write_contract(rng, target) if kind == "contract" else write_opinion(rng, target, cited)
        meta["target_chars"] = target
        record = {"id": f"synthetic-{seed}-{index:05d}", "text": text, "source": "synthetic", "kind": kind}
        documents.append({**record, "meta": meta})
    return documents


def join_documents(documents: list[dict], min_chars: int) -> list[dict]:
    """`documents` joined, per kind and in order, into records of at least `min_chars` characters each: a run of
    consecutive contracts (or opinions) with a blank line between them, so that a long row of tokens holds one long
    document of one kind rather than short ones packed together. A kind's leftover documents join its last record;
    a kind shorter than `min_chars` in all gives one shorter record. The record keeps the first part's id with
    "+<parts - 1>" appended, and `meta` lists the parts' ids; records are ordered by their first part."""
    if isinstance(min_chars, bool) or not isinstance(min_chars, int) or min_chars < 1:
        raise ValueError(f"min_chars must be an int >= 1, got {min_chars!r}")
    runs: dict[str, list[list[int]]] = {}  # kind → runs of document indices, each run one joined record
    chars: dict[str, list[int]] = {}  # kind → characters of each of its runs
    for index, document in enumerate(documents):
        kind = document["kind"]
        if kind not in runs or chars[kind][-1] >= min_chars:
            runs.setdefault(kind, []).append([])
            chars.setdefault(kind, []).append(0)
        runs[kind][-1].append(index)
        chars[kind][-1] += len(document["text"])
    for kind, kind_runs in runs.items():
        if len(kind_runs) > 1 and chars[kind][-1] < min_chars:
            leftovers = kind_runs.pop()
            kind_runs[-1] += leftovers
    joined = sorted(run for kind_runs in runs.values() for run in kind_runs)  # by first part
    return [_joined_record([documents[i] for i in run]) for run in joined]


def _joined_record(parts: list[dict]) -> dict:
    first = parts[0]
    return {
        "id": f"{first['id']}+{len(parts) - 1}",
        "text": "\n\n".join(part["text"] for part in parts),
        "source": first["source"],
        "kind": first["kind"],
        "meta": {"parts": [part["id"] for part in parts]},
    }
