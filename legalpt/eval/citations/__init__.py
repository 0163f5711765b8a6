"""Citation accuracy, judged by eyecite: which items are asked, what a continuation scores, and the summaries.

This package owns the citation tasks of `legalpt-eval`, without any model (generations come in as text):

- `items`: citation completion. Every case citation eyecite finds in a document becomes a `CitationItem`, a prompt
  that ends right before the citation (and reaches back far enough to hold the case name) with the gold citation.
  Short forms (short cites, supra, Id.) are resolved to their full citation by eyecite's resolver and scored as
  their own form;
- `scoring`: `score_citation`, the metrics of one continuation, and `CitationIndex`, the full citations of a
  reference corpus, which tells a fabricated citation (no such citation anywhere, or a reporter reporters-db does not
  know) from a misattributed one (a real citation of another case);
- `summary`: `summarize_citations`, micro-averages with bootstrap intervals over documents, per document and broken
  down by reporter, position in the document and prompt length;
- `citation_set`: a continued opinion's citations against those of its real continuation (precision, recall, F1);
- `parsing` (eyecite's reading of a text), `names` (case names) and `checks` (argument checks) serve them.

Citation identity is eyecite's: (volume, reporter as reporters-db normalizes it, page). Case names are compared by
`same_case_name`, fuzzily, since eyecite and authors shorten names.
"""

from legalpt.eval.citations.citation_set import SetItem, score_citation_set, set_items, summarize_citation_set
from legalpt.eval.citations.items import CONTINUATION_CHARS, CitationItem, build_citation_items
from legalpt.eval.citations.names import same_case_name
from legalpt.eval.citations.parsing import FORMS, GoldCitation, Key
from legalpt.eval.citations.scoring import CITATION_METRICS, CitationIndex, fabrication_reason, score_citation
from legalpt.eval.citations.summary import SHORT_FORMS, TOP_REPORTERS, summarize_citations

__all__ = [
    "CITATION_METRICS",
    "CONTINUATION_CHARS",
    "FORMS",
    "SHORT_FORMS",
    "TOP_REPORTERS",
    "CitationIndex",
    "CitationItem",
    "GoldCitation",
    "Key",
    "SetItem",
    "build_citation_items",
    "fabrication_reason",
    "same_case_name",
    "score_citation",
    "score_citation_set",
    "set_items",
    "summarize_citation_set",
    "summarize_citations",
]
