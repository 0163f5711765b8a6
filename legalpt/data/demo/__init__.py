"""The built-in demo corpus: deterministic synthetic contracts and court opinions.

THIS IS A DEMO CORPUS, NOT REAL LAW. Every party, judge, docket number, fact, holding and case citation in it is
invented, and nothing in it may be relied on as a statement of law. It exists so that `legalpt-train` runs end to end
with no download, on text shaped like legal documents, which gives a small model real structure to learn:

- contracts: parties with states of incorporation and addresses, recitals (WHEREAS ...), NOW, THEREFORE, numbered
  articles and sections, a definitions article whose quoted terms are used in the body, cross-references to sections
  that exist, schedules and exhibits, and signature blocks;
- court opinions: caption, syllabus, opinion text with full case citations in real reporter formats (abbreviations and
  date ranges from reporters-db, so citation tools such as eyecite parse them as they parse real ones), statute
  citations, and short forms (Id., supra, "347 U.S. at 495") that refer back to earlier citations of the same opinion.

Lengths are log-uniform from about 1.5k to 55k tokens at ~4 characters per token (about 1k to 35k whitespace-separated
words). Document i is drawn by a `random.Random` seeded with (seed, i) as a string (hashed with SHA-512, not with
Python's randomised `hash`), so the corpus is identical in every process. A reporter cite names one case in the whole
corpus, as a real one does: a new case is drawn again while an earlier case holds one of its cites, so document i also
depends on the cites of the documents before it (never on those after it), and `generate_documents(n)` is a prefix of

The phrases live in plain-text files under `phrases/` (package data, read once at import by `templates`); the
modules only choose, fill and arrange them:

- `corpus`: `generate_documents`, the records the data pipeline loads, and `join_documents`, which joins them into
  long documents (`data.synthetic_min_chars`);
- `contracts`, `opinions`, `citations`: the generators of contracts, of opinions, and of an opinion's case citations;
- `names`, `jurisdictions`, `reporters`: invented people and companies, real states and courts, real reporters;
- `templates`: the phrase files, their parser, and how a document fills a template in.
"""

from legalpt.data.demo.corpus import MAX_CHARS, MIN_CHARS, generate_documents, join_documents

__all__ = ["MAX_CHARS", "MIN_CHARS", "generate_documents", "join_documents"]
