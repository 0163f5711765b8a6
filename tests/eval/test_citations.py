"""Citation evaluation: items against a direct eyecite pass and against the citations the demo generator inserted,
oracle and broken "models", fabricated and misattributed citations, sampling, the eval-set round trip, the
citation-set task and the summaries; on generated opinions and, when present, on real ones (../shared/data)."""

import json
import math
import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import reporters_db
from eyecite import get_citations, resolve_citations
from eyecite.models import FullCaseCitation, IdCitation, ShortCaseCitation, SupraCitation

from legalpt.config import DataConfig
from legalpt.data.demo import generate_documents
from legalpt.data.sources import load_documents
from legalpt.data.tokenizer import train_bpe
from legalpt.eval.citations import (
    CITATION_METRICS,
    CitationIndex,
    CitationItem,
    SetItem,
    build_citation_items,
    fabrication_reason,
    same_case_name,
    score_citation,
    score_citation_set,
    set_items,
    summarize_citation_set,
    summarize_citations,
)

OPINIONS = Path(__file__).resolve().parents[3] / "shared" / "data" / "opinions"
FORMS = {FullCaseCitation: "full", ShortCaseCitation: "short", SupraCitation: "supra", IdCitation: "id"}
PLAIN = {"id": "plain", "text": "The parties agree to the terms below. " * 40, "kind": "contract"}


@pytest.fixture(scope="module")
def rng():
    seed = random.randrange(2**31)
    print(f"seed={seed}")
    return random.Random(seed)


@pytest.fixture(scope="module")
def synthetic(rng):
    """The shortest generated opinions that use every short form, one contract, and a text without citations."""
    docs = generate_documents(40, rng.randrange(1000))
    opinions = [d for d in docs if d["kind"] == "opinion" and all(d["meta"]["short_forms"].values())]
    contract = min((d for d in docs if d["kind"] == "contract"), key=lambda d: len(d["text"]))
    return [*sorted(opinions, key=lambda d: len(d["text"]))[:3], contract, PLAIN]


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    if not OPINIONS.is_dir():
        pytest.skip(f"no real opinions at {OPINIONS}")
    smallest = sorted(OPINIONS.glob("*.json"), key=lambda p: p.stat().st_size)[:3]
    cfg = DataConfig(paths=[str(p) for p in smallest], cache_dir=str(tmp_path_factory.mktemp("cache")))
    documents, skipped = load_documents(cfg)
    assert skipped.total == 0
    return [dict(doc) for doc in documents]


@pytest.fixture(scope="module")
def tokenizer(synthetic):
    return train_bpe([d["text"] for d in synthetic], 800)


@pytest.fixture(scope="module")
def built(synthetic, tokenizer, rng):
    prompt_tokens = rng.randint(24, 96)
    items, stats = build_citation_items(synthetic, tokenizer, prompt_tokens)
    return items, stats, CitationIndex.from_documents(synthetic), prompt_tokens


@pytest.fixture(scope="module")
def built_real(real, tokenizer):
    items, stats = build_citation_items(real, tokenizer, 64)
    return items, stats, CitationIndex.from_documents(real)


def eyecite_pass(text: str) -> tuple[dict[int, tuple[str, tuple, int]], Counter, list[tuple[int, int]]]:
    """Directly from eyecite: citation start -> (form, key of the full citation it refers to, start of its full
    span) for every case citation that resolves to a full citation with a page, the forms found, and the extent of
    every citation from its case name to the end of its reporter cite."""
    citations = get_citations(text)
    owner = {id(c): r.citation for r, group in resolve_citations(citations).items() for c in group}
    gold, found = {}, Counter()
    for c in citations:
        form = FORMS.get(type(c))
        if form is None:
            continue
        found[form] += 1
        full = c if form == "full" else owner.get(id(c))
        if isinstance(full, FullCaseCitation) and full.groups.get("page") and text[: c.span()[0]].strip():
            key = (full.groups.get("volume"), full.corrected_reporter(), full.groups["page"])
            gold[c.span()[0]] = (form, key, c.full_span()[0])
    return gold, found, [(c.full_span()[0], c.span()[1]) for c in citations]


def offset(item: CitationItem) -> int:
    return int(item.id.rsplit(":", 1)[1])


def check_gold_set(documents, items, stats):
    expected, found, empty = {}, Counter(), 0
    for doc in documents:
        gold, forms, _ = eyecite_pass(doc["text"])
        expected.update({(doc["id"], start): (form, key) for start, (form, key, _) in gold.items()})
        found += forms
        empty += not forms
    assert {(i.doc_id, offset(i)): (i.form, i.gold.key) for i in items} == expected
    assert stats["documents"] == len(documents)
    assert stats["documents_without_citations"] == empty
    assert stats["found"] == dict(found)
    parts = ("items", "not_sampled", "unresolved", "skipped")
    assert sum(found.values()) == sum(sum(stats[part].values()) for part in parts)


def check_prompts(documents, items, tokenizer, prompt_tokens):
    texts = {d["id"]: d["text"] for d in documents}
    passes = {d["id"]: eyecite_pass(d["text"]) for d in documents}
    for item in items:
        text, start = texts[item.doc_id], offset(item)
        gap = len(text[:start]) - len(text[:start].rstrip())  # whitespace before the citation goes to the continuation
        cut = start - gap
        assert text[cut - len(item.prompt) : cut] == item.prompt  # ends right before the citation and its whitespace
        assert item.prompt == item.prompt.rstrip() and item.continuation.startswith(text[cut:start])
        assert text[cut : cut + len(item.continuation)] == item.continuation
        assert len(item.continuation) > 100 or start + len(item.continuation) == len(text)
        assert item.position == pytest.approx(start / len(text))
        assert item.prompt_tokens == len(tokenizer(item.prompt, add_special_tokens=False)["input_ids"])
        at_start = len(item.prompt) == cut
        assert at_start or item.prompt_tokens >= prompt_tokens - 2  # the window, up to merges at its edges
        gold, _, extents = passes[item.doc_id]
        name = text[gold[start][2] : start]  # "Okafor v. Redwood Medical L.P., " or "Okafor, "
        assert item.prompt.endswith(name.rstrip())
        begin = cut - len(item.prompt)  # the window cuts no citation: a cut one's tail reads as another citation
        assert not any(first < begin < last for first, last in extents), item.prompt[:80]


def check_oracle(items, index):
    scores = [score_citation(item, item.continuation, index) for item in items]
    for item, score in zip(items, scores, strict=True):
        assert (score["well_formed"], score["exact"], score["fabricated"]) == (1.0, 1.0, 0.0), (item, score)
        assert score["misattributed"] != 1.0
    summary = summarize_citations(items, scores, samples=100)
    for group in ("full", "short_forms"):
        assert summary[group]["items"] > 0
        assert summary[group]["metrics"]["exact"]["mean"] == 1.0
        assert summary[group]["metrics"]["fabricated"]["mean"] == 0.0
    assert summary["full"]["items"] + summary["short_forms"]["items"] == len(items)


def test_gold_set_is_what_eyecite_finds(synthetic, built):
    items, stats, _, _ = built
    check_gold_set(synthetic, items, stats)
    assert stats["documents_without_citations"] >= 1  # at least the plain text
    assert set(stats["items"]) == {"full", "short", "supra", "id"}


def test_gold_matches_the_generators_citations(synthetic, built):
    """Independent of eyecite: every citation the generator inserted is a full item with its year, behind its name."""
    items, _, _, _ = built
    for doc in synthetic[:3]:
        full = {item.gold.key: item for item in items if item.doc_id == doc["id"] and item.form == "full"}
        previous = None
        for cited in doc["meta"]["citations"]:
            item = full[(str(cited["volume"]), cited["reporter"], str(cited["page"]))]
            assert item.gold.year == cited["year"]
            assert same_case_name(item.gold.case_name, cited["case_name"])
            assert f"{cited['case_name']}," in item.prompt
            parallel = previous is not None and previous["case_name"] == cited["case_name"]
            assert parallel or item.prompt.endswith(f"{cited['case_name']},")  # a parallel cite follows the first
            previous = cited


def test_prompts_end_before_the_citation_and_hold_its_name(synthetic, built, tokenizer):
    items, _, _, prompt_tokens = built
    check_prompts(synthetic, items, tokenizer, prompt_tokens)


def test_oracle_scores_perfectly(built):
    items, _, index, _ = built
    check_oracle(items, index)


def test_model_writing_the_generators_citation_scores_every_field(synthetic, built):
    """A continuation written from the generator's record (not from the text) scores exact, year and case name."""
    items, _, index, _ = built
    by_key = {item.gold.key: item for item in items if item.form == "full"}
    for doc in synthetic[:3]:
        for cited in doc["meta"]["citations"]:
            item = by_key[(str(cited["volume"]), cited["reporter"], str(cited["page"]))]
            pin = f", {cited['pin']}" if cited["pin"] else ""
            court = f"{cited['court']} " if cited["court"] else ""
            generation = f"{cited['volume']} {cited['reporter']} {cited['page']}{pin} ({court}{cited['year']}). The"
            score = score_citation(item, generation, index)
            assert {m: score[m] for m in ("exact", "year", "case_name", "fabricated")} == {
                "exact": 1.0,
                "year": 1.0,
                "case_name": 1.0,
                "fabricated": 0.0,
            }, (generation, item.gold)


@pytest.mark.parametrize(
    "generation",
    ["", "  \n", "the court held that the claim fails.", "See 42 U.S.C. § 1983.", "F.3d 412 (1999)", "on 12 Jan. 2020"],
)
def test_empty_or_malformed_generations_score_zero_and_are_counted(built, generation):
    items, _, index, _ = built
    scores = [score_citation(item, generation, index) for item in items]
    for item, score in zip(items, scores, strict=True):
        assert set(score) == set(CITATION_METRICS)
        for metric, value in score.items():
            applies = not (
                (metric == "year" and item.gold.year is None)
                or (metric in ("case_name", "misattributed") and item.gold.case_name is None)
            )
            assert value == 0.0 if applies else math.isnan(value), (metric, item.gold)
    summary = summarize_citations(items, scores, samples=50)
    assert summary["full"]["items"] + summary["short_forms"]["items"] == len(items)
    assert summary["full"]["metrics"]["well_formed"]["n"] == summary["full"]["items"]
    assert summary["short_forms"]["metrics"]["exact"]["mean"] == 0.0
    for group in ("full", "short_forms"):
        assert summary[group]["outcomes"] == {
            "malformed": summary[group]["items"],
            "fabricated_unknown_reporter": 0,
            "fabricated_not_in_corpus": 0,
        }


def test_short_form_where_a_full_citation_is_due_is_malformed(built):
    # Generations start with the space the prompt leaves out, as a model continuing "..., Inc.," writes it.
    items, _, index, _ = built
    item = next(i for i in items if i.form == "full")
    assert score_citation(item, " Id. at 5.", index)["well_formed"] == 0.0
    short = next(i for i in items if i.form == "id")
    assert score_citation(short, " Id.", index)["well_formed"] == 1.0


def test_fabricated_and_misattributed_citations(built, rng):
    """A well-formed citation found nowhere is fabricated; a real citation of another case is misattributed, whether
    it is due in full or as a short form."""
    items, _, index, _ = built
    short = rng.choice([i for i in items if i.form == "short" and i.gold.case_name])
    item = next(i for i in items if i.form == "full" and i.gold.key == short.gold.key)
    while True:
        volume, page = str(rng.randint(1, 999)), str(rng.randint(1, 1999))
        if (volume, item.gold.reporter, page) not in index:
            break
    fabricated = score_citation(item, f" {volume} {item.gold.reporter} {page} (2001). The court", index)
    assert fabricated["well_formed"] == fabricated["fabricated"] == fabricated["reporter"] == 1.0
    assert fabricated["exact"] == fabricated["misattributed"] == fabricated["case_name"] == 0.0
    assert fabricated["unknown_reporter"] == 0.0 and fabrication_reason(fabricated) == "not in the reference corpus"

    others = [i.gold for i in items if not any(same_case_name(n, item.gold.case_name) for n in index.names(i.gold.key))]
    other = rng.choice(others)
    for target in (item, short):
        score = score_citation(target, f" {' '.join(other.key)} ({other.year}). The", index)
        assert score["well_formed"] == score["misattributed"] == 1.0, (target.form, score)
        assert score["exact"] == score["fabricated"] == score["case_name"] == 0.0


@pytest.mark.parametrize(
    ("written", "reporter"),
    [("123 Fake Rptr. 456", "Fake Rptr."), ("17 Foo. 3", "Foo."), ("88 N.W. 9th 12", "N.W. 9th")],
)
def test_invented_reporter_is_fabricated_not_malformed(built, rng, written, reporter):
    """A citation-shaped generation whose reporter reporters-db does not know is fabricated (for that reason), not
    malformed, for full and short-form items alike; its volume and page are still compared with gold's."""
    items, _, index, _ = built
    assert reporter not in reporters_db.EDITIONS and reporter not in reporters_db.VARIATIONS_ONLY
    picked = [rng.choice([i for i in items if i.form == form]) for form in ("full", "short", "id")]
    scores = [score_citation(item, f" {written} (2001). The court", index) for item in picked]
    for item, score in zip(picked, scores, strict=True):
        assert score["well_formed"] == score["fabricated"] == score["unknown_reporter"] == 1.0, (item.form, score)
        assert score["reporter"] == score["exact"] == score["misattributed"] == 0.0
        volume, page = written.split()[0], written.split()[-1]
        assert score["volume"] == float(volume == item.gold.volume) and score["page"] == float(page == item.gold.page)
        assert fabrication_reason(score) == "unknown reporter"
    summary = summarize_citations(picked, scores, samples=20)
    outcomes = [summary[group]["outcomes"] for group in ("full", "short_forms")]
    assert outcomes == [
        {"malformed": 0, "fabricated_unknown_reporter": 1, "fabricated_not_in_corpus": 0},
        {"malformed": 0, "fabricated_unknown_reporter": 2, "fabricated_not_in_corpus": 0},
    ]


def test_invented_reporter_after_a_real_citation_does_not_count(built):
    """The first citation counts: a real citation written first is scored as such, the invented one after it not."""
    items, _, index, _ = built
    item = next(i for i in items if i.form == "full")
    score = score_citation(item, f" {' '.join(p for p in item.gold.key if p)}; 123 Fake Rptr. 456.", index)
    assert score["exact"] == 1.0 and score["fabricated"] == score["unknown_reporter"] == 0.0
    assert fabrication_reason(score) is None


def test_sampling_is_deterministic_even_and_keeps_every_form(synthetic, tokenizer, built, rng):
    every, _, _, prompt_tokens = built
    max_items, seed = rng.randint(8, 16), rng.randrange(1000)
    items, stats = build_citation_items(synthetic, tokenizer, prompt_tokens, max_items, seed)
    again, _ = build_citation_items(synthetic, tokenizer, prompt_tokens, max_items, seed)
    assert [i.to_dict() for i in items] == [i.to_dict() for i in again]
    assert len(items) == max_items
    assert {i.form for i in items} == {i.form for i in every}
    assert {i.id for i in items} <= {i.id for i in every}
    assert sum(stats["not_sampled"].values()) == len(every) - max_items
    for form in stats["items"]:  # round robin: a document gets one more than another only if the other ran out
        available = Counter(i.doc_id for i in every if i.form == form)
        picked = Counter(i.doc_id for i in items if i.form == form)
        short = [picked[d] for d in available if picked[d] < available[d]]
        assert not short or max(picked.values()) - min(short) <= 1, (form, available, picked)
    draws = {tuple(i.id for i in build_citation_items(synthetic, tokenizer, prompt_tokens, 4, s)[0]) for s in range(4)}
    assert len(draws) > 1


def test_eval_set_round_trips_through_jsonl(synthetic, built, tokenizer, tmp_path):
    items, _, _, _ = built
    sets = set_items(synthetic, tokenizer, 2, 32, 32, seed=1)
    path = tmp_path / "eval_set.jsonl"
    path.write_text("".join(json.dumps(x.to_dict()) + "\n" for x in [*items, *sets]))
    records = [json.loads(line) for line in path.read_text().splitlines()]
    back = [CitationItem.from_dict(r) if "form" in r else SetItem.from_dict(r) for r in records]
    assert back == [*items, *sets]
    broken = items[0].to_dict()
    del broken["gold"]["page"]
    with pytest.raises(ValueError, match="gold"):
        CitationItem.from_dict(broken)
    with pytest.raises(ValueError, match="form"):
        CitationItem.from_dict({**items[0].to_dict(), "form": "parallel"})


def test_citation_set_oracle_and_empty_continuations(synthetic, tokenizer, rng):
    seed = rng.randrange(1000)
    prompt_tokens, new_tokens = rng.randint(16, 64), rng.randint(32, 96)
    sets = set_items(synthetic, tokenizer, 3, prompt_tokens, new_tokens, seed)
    assert [s.id for s in sets] == [s.id for s in set_items(synthetic, tokenizer, 3, prompt_tokens, new_tokens, seed)]
    assert len(sets) == 3 and len({s.doc_id for s in sets}) == 3
    texts = {d["id"]: d["text"] for d in synthetic}
    for item in sets:
        start = int(item.id.rsplit(":", 1)[1])
        text = texts[item.doc_id]
        assert text[start - len(item.prompt) : start + len(item.reference)] == item.prompt + item.reference
        keys = {c.span() for c in get_citations(item.reference) if isinstance(c, FullCaseCitation)}
        assert keys, item.reference  # the cut leaves at least one full citation in the real continuation
        assert len(tokenizer(item.reference, add_special_tokens=False)["input_ids"]) <= new_tokens + 1
    oracle = [score_citation_set(s.reference, s.reference) for s in sets]
    assert all(s["tp"] == s["predicted"] == s["relevant"] >= 1 for s in oracle)
    summary = summarize_citation_set(sets, oracle, samples=100)
    assert summary["precision"]["mean"] == summary["recall"]["mean"] == summary["f1"]["mean"] == 1.0
    empty = summarize_citation_set(sets, [score_citation_set("", s.reference) for s in sets], samples=100)
    assert math.isnan(empty["precision"]["mean"]) and empty["recall"]["mean"] == empty["f1"]["mean"] == 0.0


def test_citation_set_summary_is_micro_precision_recall_f1(rng):
    items = [SetItem(id=f"d{i % 5}:{i}", doc_id=f"d{i % 5}", prompt="", reference="") for i in range(12)]
    scores = []
    for _ in items:
        tp = rng.randint(0, 4)
        scores.append({"tp": tp, "predicted": tp + rng.randint(0, 3), "relevant": tp + rng.randint(0, 3)})
    summary = summarize_citation_set(items, scores, samples=200, seed=3)
    tp, predicted, relevant = (sum(s[k] for s in scores) for k in ("tp", "predicted", "relevant"))
    precision, recall = tp / predicted, tp / relevant
    assert summary["precision"]["mean"] == pytest.approx(precision)
    assert summary["recall"]["mean"] == pytest.approx(recall)
    assert summary["f1"]["mean"] == pytest.approx(2 * precision * recall / (precision + recall))
    for name in ("precision", "recall", "f1"):
        assert summary[name]["low"] <= summary[name]["mean"] <= summary[name]["high"]
    assert summary["documents"] == 5


def test_summary_averages_and_breakdowns(built, rng):
    items, _, _, _ = built
    scores = []
    for item in items:
        score = {m: float(rng.random() < 0.5) for m in CITATION_METRICS}
        if item.gold.year is None:
            score["year"] = math.nan
        scores.append(score)
    summary = summarize_citations(items, scores, samples=100, seed=1)
    for group, forms in (("full", {"full"}), ("short_forms", {"short", "supra", "id"})):
        part = summary[group]
        picked = [(i, s) for i, s in zip(items, scores, strict=True) if i.form in forms]
        assert part["items"] == len(picked) and part["documents"] == len({i.doc_id for i, _ in picked})
        for metric in CITATION_METRICS:
            assert part["metrics"][metric]["mean"] == pytest.approx(np.nanmean([s[metric] for _, s in picked]))
        for doc, row in part["per_document"].items():
            assert row["exact"] == pytest.approx(np.mean([s["exact"] for i, s in picked if i.doc_id == doc]))
        reporters = Counter(i.gold.reporter for i, _ in picked)
        assert {r["bucket"]: r["items"] for r in part["by_reporter"]} == dict(reporters.most_common(15))
        assert len(part["by_position"]) == 10
        assert sum(r["items"] for r in part["by_position"]) == len(picked)
        assert sum(r["items"] for r in part["by_prompt_tokens"]) == len(picked)
        for row in part["by_position"]:
            inside = [s["exact"] for i, s in picked if int(i.position * 10) == int(float(row["bucket"]) * 10)]
            assert row["items"] == len(inside)
            assert row["mean"] == pytest.approx(np.mean(inside)) if inside else math.isnan(row["mean"])
    json.dumps(summary)  # the report writes it as JSON


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        ("Feist Publications, Inc. v. Rural Telephone Service Co.", "Feist Publications v. Rural Tel. Service", True),
        ("Okafor", "Okafor v. Redwood Medical L.P.", True),
        ("Redwood Medical", "Okafor v. Redwood Medical L.P.", True),
        ("Smith v. Jones", "Smith v. Brown", False),
        ("State v. Smith", "State v. Smithers", False),
        ("Inc.", "Inc.", False),
    ],
)
def test_same_case_name(a, b, same):
    assert same_case_name(a, b) is same
    assert same_case_name(b, a) is same


def test_bad_arguments_are_named(synthetic, tokenizer, built):
    items, _, index, _ = built
    with pytest.raises(ValueError, match="prompt_tokens"):
        build_citation_items(synthetic, tokenizer, 0)
    with pytest.raises(TypeError, match="tokenizer"):
        build_citation_items(synthetic, object(), 8)
    with pytest.raises(TypeError, match="documents"):
        build_citation_items("some text", tokenizer, 8)
    with pytest.raises(ValueError, match=r"documents\[0\]"):
        CitationIndex.from_documents([{"id": "x"}])
    with pytest.raises(TypeError, match="generation"):
        score_citation(items[0], None, index)
    with pytest.raises(ValueError, match="scores"):
        summarize_citations(items, [], samples=10)
    with pytest.raises(ValueError, match="n_documents"):
        set_items(synthetic, tokenizer, -1, 8, 8)


def test_gold_case_names_of_an_html_opinion_hold_no_star_page_labels(tmp_path, tokenizer):
    """Star-page labels inside case names (CourtListener and CAP markup, bracketed) never reach the gold names."""
    page = (
        '<html><body><p><span class="star-pagination">*1006</span>On appeal we follow Feist Publications, Inc. v. '
        'Rural<a class="page-label">*1007</a>Telephone Service Co., 499 U.S. 340 (1991). The rule of Baker v.[*1008]'
        "Selden, 101 U.S. 99 (1880), applies. The judgment is affirmed.</p></body></html>"
    )
    (tmp_path / "opinion.html").write_text(page, encoding="utf-8")
    documents, _ = load_documents(DataConfig(paths=[str(tmp_path / "opinion.html")], cache_dir=str(tmp_path / "c")))
    items, _ = build_citation_items([dict(doc) for doc in documents], tokenizer, 16)
    assert [item.gold.case_name for item in items] == [
        "Feist Publications, Inc. v. Rural Telephone Service Co.",
        "Baker v. Selden",
    ]


def test_real_opinions(real, built_real, tokenizer):
    items, stats, index = built_real
    check_gold_set(real, items, stats)
    check_prompts(real, items, tokenizer, 64)
    check_oracle(items, index)
    sets = set_items(real, tokenizer, 2, 64, 64, seed=0)
    assert all(s["tp"] == s["relevant"] >= 1 for s in (score_citation_set(x.reference, x.reference) for x in sets))
