"""Demo court opinions: caption, docket, syllabus and holding, the opinion of the court in numbered parts (facts and
procedural history, then analysis lettered into subparts in a long opinion, then the conclusion), and in some long
opinions a dissent; case citations come from `citations.Citations`, statute citations from the topic's pool.

The phrase file `phrases/opinions.txt` holds the groups: "opinion" (the pools every opinion draws from) and one
group per topic, "name | caption style", whose pools (its statutes, the questions, rules, holdings, facts and
arguments its reasoning is built from) take precedence over the generic ones. In a template, {P} is the party that
sued (or the defendant of a criminal case), {R} the other side, {cite} a citation and {string_cite} several.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from legalpt.data.demo.citations import Citations
from legalpt.data.demo.jurisdictions import CIRCUITS, DISTRICTS, STATES, State
from legalpt.data.demo.names import WORDS, Parties, case_parties, person
from legalpt.data.demo.templates import COUNTS, Filler, Lazy, date_in, dollars, load_phrases, roman

_OPINION = load_phrases("opinions")
_TOPICS = {key.split(" | ")[0]: (key.split(" | ")[1], pools) for key, pools in _OPINION.items() if key != "opinion"}


@dataclass(frozen=True)
class _Court:
    kind: str  # scotus | circuit | district | state
    caption: str  # the court's name as printed at the top of the opinion
    lower: str  # the court whose decision is reviewed, as the opinion calls it
    author: str  # the line that introduces the opinion
    dissent: str  # the line that introduces a dissent; "" = this court has none
    ending: str


def _court(rng: random.Random, kind: str, state: State, circuit: str) -> _Court:
    judges = [name.upper() for name in rng.sample(WORDS["last"], 3)]
    if kind == "scotus":
        return _Court(
            kind,
            "SUPREME COURT OF THE UNITED STATES",
            "Court of Appeals",
            f"JUSTICE {judges[0]} delivered the opinion of the Court.",
            f"JUSTICE {judges[1]}, with whom JUSTICE {judges[2]} joins, dissenting.",
            "It is so ordered.",
        )
    if kind == "circuit":
        return _Court(
            kind,
            f"UNITED STATES COURT OF APPEALS FOR THE {circuit.upper()} CIRCUIT",
            "district court",
            f"{judges[0]}, Circuit Judge:",
            f"{judges[1]}, Circuit Judge, dissenting:",
            rng.choice(("AFFIRMED.", "REVERSED and REMANDED.", "AFFIRMED in part, REVERSED in part.")),
        )
    if kind == "district":
        district = rng.choice(DISTRICTS)[0].upper()
        return _Court(
            kind,
            f"UNITED STATES DISTRICT COURT FOR THE {district}",
            "magistrate judge",
            f"{person(rng).upper()}, United States District Judge.",
            "",
            "IT IS SO ORDERED.",
        )
    name = (state.high_court or f"Supreme Court of {state.name}").upper()
    return _Court(
        kind,
        name,
        "Court of Appeals",
        f"Justice {judges[0].title()} delivered the opinion of the Court.",
        f"Justice {judges[1].title()}, dissenting.",
        "The judgment of the Court of Appeals is affirmed.",
    )


def _caption(parties: Parties, kind: str, criminal: bool) -> tuple[str, str]:
    """The case name, and the caption block that gives each party's role."""
    first, second = parties.first, parties.second
    if criminal:
        if kind == "scotus":  # the convicted defendant petitions: "Castellanos v. United States"
            first, second = second, first
        roles = {"scotus": ("Petitioner", "Respondent"), "circuit": ("Plaintiff-Appellee", "Defendant-Appellant"),
                 "district": ("Plaintiff", "Defendant"), "state": ("Respondent", "Appellant")}[kind]  # fmt: skip
    else:
        roles = {"scotus": ("Petitioner", "Respondent"), "circuit": ("Plaintiff-Appellant", "Defendant-Appellee"),
                 "district": ("Plaintiff", "Defendant"), "state": ("Petitioner", "Respondent")}[kind]  # fmt: skip
    return f"{first} v. {second}", f"{first.upper()}, {roles[0]},\nv.\n{second.upper()}, {roles[1]}."


def write_opinion(rng: random.Random, target: int, taken: set[tuple[int, str, int]]) -> tuple[str, dict]:
    """An opinion of about `target` characters whose new cases take cites that are not in `taken` (and add them)."""
    topic = rng.choice(tuple(_TOPICS))
    style, topic_pools = _TOPICS[topic]
    kind = rng.choices(("scotus", "circuit", "district", "state"), (0.3, 0.3, 0.2, 0.2))[0]
    state = rng.choice(STATES)
    circuit = rng.choice(CIRCUITS)
    court = _court(rng, kind, state, circuit[0])
    year = rng.randint(1995, 2023)
    decided = date_in(rng, year)
    parties = case_parties(rng, style, state.prosecutor if kind == "state" else "United States")
    statutes: list[str] = []

    def statute(_: str) -> str:
        statutes.append(rng.choice(topic_pools["statute"]))
        return statutes[-1]

    filler = Filler(
        rng, {**COUNTS, **_OPINION["opinion"], **topic_pools},
        P=parties.actor, R=parties.other, lower=court.lower, statute=Lazy(statute),
        town=rng.choice(WORDS["town"]), city=rng.choice(state.cities), other_state=rng.choice(STATES).name,
        fact_year=str(year - rng.randint(2, 6)), fact_date=date_in(rng, year - rng.randint(2, 6)),
        amount=dollars(rng, 5, 8),
    )  # fmt: skip
    citations = Citations(rng, kind, year, state, circuit[1], lambda: filler.fill("{rule}"), taken)
    filler["cite"] = Lazy(citations.cite)
    filler["string_cite"] = Lazy(citations.string_cite)

    docket = {
        "scotus": f"No. {year % 100:02d}-{rng.randint(100, 1999)}",
        "circuit": f"No. {(year - 1) % 100:02d}-{rng.randint(10000, 99999)}",
        "district": f"Case No. {rng.randint(1, 4)}:{(year - 2) % 100:02d}-cv-{rng.randint(100, 9999):05d}",
        "state": f"No. S{rng.randint(100000, 299999)}",
    }[kind]
    title, caption = _caption(parties, kind, style == "criminal")
    syllabus = " ".join(filler.sentence(f + ".") for f in _facts(filler, 1, 2))
    syllabus += " " + filler.sentence("{claim}. The {lower} {lower_ruling}.")
    head = [court.caption, docket, caption, f"Decided {decided}", "Syllabus", syllabus,
            filler.sentence("Held: {Holding}."), court.author]  # fmt: skip
    text = "\n\n".join(head)

    dissent = bool(court.dissent) and target > 40_000 and rng.random() < 0.6
    text += "\n\n" + _majority(filler, court, target * 0.7 if dissent else target, len(text))
    if dissent:
        citations.last = None  # a separate opinion starts its own chain of "Id."
        paragraphs = [court.dissent, filler.sentence(_OPINION["opinion"]["dissent"][0])]
        while len(text) + sum(len(p) + 2 for p in paragraphs) < target:
            paragraphs.append(_paragraph(filler, ("dissent", "analysis", "canon")))
        text += "\n\n" + "\n\n".join(paragraphs)
    meta = {
        "title": title,
        "court": court.caption,
        "docket": docket,
        "date": decided,
        "topic": topic,
        "citations": citations.full,
        "statutes": statutes,
        "short_forms": citations.counts,
    }
    return text, meta


def _facts(filler: Filler, low: int, high: int) -> list[str]:
    """From `low` to `high` different facts of the case, in the order the topic tells them."""
    pool = filler.pools["fact"]
    picked = sorted(filler.rng.sample(range(len(pool)), filler.rng.randint(low, min(high, len(pool)))))
    return [filler.fill(pool[i]) for i in picked]


def _paragraph(filler: Filler, pools: tuple[str, ...], sentences: int = 0) -> str:
    """A paragraph of `sentences` (default 3 to 7) different sentences drawn from the named pools."""
    rng = filler.rng
    templates = [t for name in pools for t in filler.pools[name]]
    count = min(len(templates), sentences or rng.randint(3, 7))
    return " ".join(filler.sentence(t) for t in rng.sample(templates, count))


def _majority(filler: Filler, court: _Court, budget: float, used: int) -> str:
    """The opinion of the court after its caption (`used` characters): Part I tells the facts and the procedural
    history, analysis parts follow until about `budget` characters (lettered into subparts in a long opinion, with
    longer parts the longer the opinion), then the conclusion."""
    rng = filler.rng
    facts = _facts(filler, 3, 99)
    split = rng.randint(1, len(facts) - 1)
    blocks = ["I", *(" ".join(filler.sentence(f + ".") for f in chunk) for chunk in (facts[:split], facts[split:])),
              _paragraph(filler, ("procedure",), rng.randint(3, 5))]  # fmt: skip
    size = used + sum(len(b) + 2 for b in blocks)
    number = 2
    while size < budget - 1500:
        part = [roman(number)]
        letters = rng.randint(2, 4) if budget > 30_000 else 1
        for letter in range(letters):
            if letters > 1:
                part.append(chr(ord("A") + letter))
            paragraphs = rng.randint(2, 3 + int(budget) // 25_000)
            part += [_paragraph(filler, ("analysis", "canon")) for _ in range(paragraphs)]
        blocks += part
        size += sum(len(b) + 2 for b in part)
        number += 1
    blocks += [roman(number), filler.sentence("For the foregoing reasons, we conclude that {holding}."), court.ending]
    return "\n\n".join(blocks)
