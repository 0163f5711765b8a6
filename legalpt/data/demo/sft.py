"""The built-in fine-tuning examples (data=sft_example): questions about the opening of each demo document, answered
from the facts the generator put there (a contract's parties and their roles, an opinion's court and decision date).
Synthetic, like the demo corpus; enough to run supervised fine-tuning end to end without any download."""

from __future__ import annotations

from legalpt.data.demo import generate_documents

OPENING_CHARS = 600  # characters of a document shown in its prompt (cut back to a word boundary)


def generate_examples(num_documents: int, seed: int) -> list[dict[str, str]]:
    """One `{prompt, response}` per demo document of `generate_documents(num_documents, seed)`, in order."""
    return [_example(document) for document in generate_documents(num_documents, seed)]


def _example(document: dict) -> dict[str, str]:
    meta, opening = document["meta"], _opening(document["text"])
    if document["kind"] == "contract":
        question = "Who are the parties to this agreement, and in which roles?"
        parties = [f"{party} (the {role})" for party, role in zip(meta["parties"], meta["roles"], strict=True)]
        answer = " and ".join(parties) + "."
    elif document["kind"] == "opinion":
        question = "Which court decided this case, and when?"
        answer = f"The {_title_case(meta['court'])}, on {meta['date']}."
    else:
        question, answer = "What is the title of this document?", f"{meta['title']}."
    return {"prompt": f"{question}\n\n{opening}", "response": answer}


def _title_case(name: str) -> str:
    """A court's name as written in running text: "COURT OF APPEALS FOR THE" → "Court of Appeals for the"."""
    return " ".join(w if w in ("of", "for", "the", "and") else w.capitalize() for w in name.lower().split())


def _opening(text: str) -> str:
    if len(text) <= OPENING_CHARS:
        return text
    cut = text.rfind(" ", 0, OPENING_CHARS)
    return text[: cut if cut > 0 else OPENING_CHARS] + " ..."
