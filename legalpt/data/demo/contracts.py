"""Demo contracts: a commercial agreement between two invented companies, with recitals, a definitions article
whose quoted terms are used in the body, numbered articles and sections whose cross-references point to sections
that exist, signature blocks, and schedules of ordering documents that take up the rest of the target length.

The phrase file `phrases/contracts.txt` holds the groups: "contract" (recitals and the pools of the ordering
documents), "definitions" (one pool per defined term; only the terms the body uses are defined), and one group per
article kind, "kind | TITLE", whose pools are its sections. A section keeps its first sentence, then a sample of the
others in order; its "* " items follow the last sentence, which then ends with a colon and is always kept.
"{ref:kind}" points to the first section of that article, which refers to no other article so that it is always
present. A section whose first sentence or item lead-in refers to an absent article is left out, and any other
sentence that does is dropped.
"""

from __future__ import annotations

import random
import re
from collections.abc import Collection
from dataclasses import dataclass

from legalpt.data.demo.jurisdictions import STATES, State
from legalpt.data.demo.names import Company, address, company, person
from legalpt.data.demo.templates import (
    COUNTS,
    LATEST_YEAR,
    MONTHS,
    Filler,
    Lazy,
    date_in,
    dollars,
    enumerate_items,
    load_phrases,
    roman,
    with_article,
)


@dataclass(frozen=True)
class _Deal:
    """One kind of commercial agreement: who the parties are and what changes hands."""

    title: str
    a: str  # defined role of the party that delivers ("Provider")
    b: str  # defined role of the party that pays ("Customer")
    subject: str  # defined term for what is delivered ("Services")
    verb: str  # what `a` does with the subject ("provide")
    prep: str  # "to" or "for": provide the Services to Customer, perform the Services for Company
    subject_title: str  # title of the article that describes the subject
    subject_definition: str  # the subject's definition, after its quoted term
    business: str  # recital: the business of `a`
    desire: str  # recital: what `b` wants
    order: str  # the ordering document collected in Schedule A ("Statement of Work")


_DEALS = (
    _Deal("MASTER SERVICES AGREEMENT", "Provider", "Customer", "Services", "provide", "to", "SERVICES",
          "means the professional, technical and support services described in each Statement of Work",
          "the business of providing managed technology, integration and support services",
          "engage Provider to perform certain services for its business operations", "Statement of Work"),
    _Deal("SUPPLY AGREEMENT", "Supplier", "Buyer", "Products", "supply", "to", "SUPPLY OF PRODUCTS",
          "means the goods identified in each Purchase Order, together with all related parts and packaging",
          "the business of designing, manufacturing and selling industrial components",
          "purchase certain products from Supplier for use in its manufacturing operations", "Purchase Order"),
    _Deal("SOFTWARE LICENSE AGREEMENT", "Licensor", "Licensee", "Licensed Software", "license", "to",
          "LICENSE GRANT", "means the object code of the software products identified in each Order Form",
          "the business of developing and licensing enterprise software",
          "obtain a license to use certain software products for its internal business purposes", "Order Form"),
    _Deal("DISTRIBUTION AGREEMENT", "Manufacturer", "Distributor", "Products", "sell", "to",
          "APPOINTMENT AND DISTRIBUTION", "means the products listed in each Product Addendum",
          "the business of manufacturing consumer and commercial products",
          "distribute the Products to resellers and end users in the Territory", "Product Addendum"),
    _Deal("CONSULTING AGREEMENT", "Consultant", "Company", "Services", "perform", "for", "CONSULTING SERVICES",
          "means the advisory and consulting services described in each Statement of Work",
          "the business of providing strategic, financial and operational consulting services",
          "retain Consultant to advise it on certain strategic and operational matters", "Statement of Work"),
    _Deal("CLOUD SERVICES AGREEMENT", "Provider", "Subscriber", "Subscription Services", "make available", "to",
          "SUBSCRIPTION SERVICES",
          "means the hosted software applications and related services identified in each Order Form",
          "the business of operating hosted software platforms for business customers",
          "subscribe to certain hosted services for use by its personnel", "Order Form"),
    _Deal("EQUIPMENT LEASE AGREEMENT", "Lessor", "Lessee", "Equipment", "lease", "to", "LEASE OF EQUIPMENT",
          "means the machinery and equipment described in each Equipment Schedule, with all accessions and parts",
          "the business of leasing industrial and commercial equipment",
          "lease certain equipment for use at its facilities", "Equipment Schedule"),
)  # fmt: skip

_CONTRACT = load_phrases("contracts")
_ARTICLES = {key.split(" | ")[0]: (key.partition(" | ")[2], sections) for key, sections in _CONTRACT.items()
             if key not in ("contract", "definitions")}  # fmt: skip
_ARTICLE_ORDER = tuple(_ARTICLES)  # the order in which articles appear in a contract
_MANDATORY_KINDS = ("subject", "term", "general")
_REF = re.compile(r"\{ref:(\w+)\}")


def _plan_articles(rng: random.Random, target: int) -> dict[str, list[str]]:
    """Article kind -> the headings of its sections, decided before any text so that every cross-reference can point
    to a section that exists. Longer targets keep more optional articles and more sections per article; the
    schedules absorb the rest of the length."""
    keep = min(0.95, max(0.1, (target - 5_000) / 40_000))
    kinds = [k for k in _ARTICLE_ORDER if k in _MANDATORY_KINDS or rng.random() < keep]
    per_article = max(1, round(target * 0.5 / 650 / len(kinds)))
    plan = {}
    for kind in kinds:
        headings = [h for h, templates in _ARTICLES[kind][1].items() if _writable(templates, kinds)]
        count = min(len(headings), max(1, per_article + rng.randint(-1, 1)))
        plan[kind] = [headings[0], *sorted(rng.sample(headings[1:], count - 1), key=headings.index)]
    return plan


def _writable(templates: list[str], kinds: Collection[str]) -> bool:
    """Whether a section's first sentence and its item lead-in (its last sentence) refer only to present articles."""
    sentences = [t for t in templates if not t.startswith("* ")]
    return all(kind in kinds for t in (sentences[0], sentences[-1]) for kind in _REF.findall(t))


def _usable(templates: list[str], kinds: Collection[str]) -> list[str]:
    """The templates whose cross-references all point to articles of this contract."""
    return [t for t in templates if all(kind in kinds for kind in _REF.findall(t))]


def _section(filler: Filler, heading: str, templates: list[str], number: str, kinds: Collection[str]) -> str:
    """One section, "Section 4.2 Heading. Sentences ...", then its enumerated items, if any. A sentence that defines
    a term in quotes is always kept, since the definitions article may point to it."""
    rng = filler.rng
    usable = _usable(templates, kinds)
    sentences = [t for t in usable if not t.startswith("* ")]
    items = [t[2:] for t in usable if t.startswith("* ")]
    lead = [sentences.pop()] if items else []
    chosen = [s for i, s in enumerate(sentences) if i == 0 or '"' in s or rng.random() < 0.7] + lead
    text = f"Section {number} {filler.fill(heading)}. " + " ".join(filler.sentence(s) for s in chosen)
    if items:
        picked = sorted(rng.sample(items, rng.randint(2, len(items))), key=items.index)
        text += "\n\n" + enumerate_items([filler.fill(item) for item in picked])
    return text


def write_contract(rng: random.Random, target: int) -> tuple[str, dict]:
    deal = rng.choice(_DEALS)
    year = rng.randint(2005, LATEST_YEAR)
    effective = date_in(rng, year)
    companies = [company(rng), company(rng)]
    while companies[1].short == companies[0].short:
        companies[1] = company(rng)
    states = rng.sample(STATES, 3)
    law_state = states[2] if rng.random() < 0.4 else states[0]
    plan = _plan_articles(rng, target)
    numbers = {kind: number for number, kind in enumerate(plan, start=2)}  # Article I holds the definitions
    schedules = {"scope": "Schedule A"}
    if "payment" in plan:
        schedules["fees"] = "Schedule B"
    if rng.random() < 0.5:
        schedules["sla"] = f"Exhibit {chr(ord('A') + len(schedules))}"
    filler = Filler(
        rng, {**COUNTS, **_CONTRACT["contract"]},
        A=deal.a, B=deal.b, B_UPPER=deal.b.upper(), subject=deal.subject, verb=deal.verb, prep=deal.prep,
        order=deal.order, a_name=companies[0].name, b_name=companies[1].name, effective=effective,
        a_address=address(rng, states[0]), b_address=address(rng, states[1]),
        law_state=law_state.name, law_city=law_state.cities[0], city=rng.choice(states[0].cities),
        prior_date=date_in(rng, year - 1), ref=Lazy(lambda kind: f"{numbers[kind]}.1"),
        sched_scope=schedules["scope"], sched_fees=schedules.get("fees", f"the applicable {deal.order}"),
        sched_sla=schedules.get("sla", f"the applicable {deal.order}"),
        amount=Lazy(lambda _: dollars(rng, 5, 7)), small_amount=Lazy(lambda _: dollars(rng, 2, 4)),
        count=Lazy(lambda _: str(rng.randint(2, 40))),
    )  # fmt: skip

    body = []
    for kind, headings in plan.items():
        title, sections = _ARTICLES[kind]
        body.append(f"ARTICLE {roman(numbers[kind])}\n{title or deal.subject_title}")
        for index, heading in enumerate(headings, start=1):
            body.append(_section(filler, heading, sections[heading], f"{numbers[kind]}.{index}", plan))
    body_text = "\n\n".join(body)

    definitions = {deal.subject: deal.subject_definition, **{t: d[0] for t, d in _CONTRACT["definitions"].items()}}
    defined = sorted(t for t in definitions if re.search(rf"\b{re.escape(t)}\b", body_text))
    text = "\n\n".join(
        [
            _contract_head(filler, deal, companies, states, effective),
            "ARTICLE I\nDEFINITIONS",
            "Section 1.1 Definitions. As used in this Agreement, the following terms have the meanings set forth "
            "below:",
            *(f'"{term}" {filler.fill(definitions[term])}.' for term in defined),
            "Section 1.2 Interpretation. The headings in this Agreement are for convenience only. The words "
            '"include" and "including" shall be deemed to be followed by "without limitation," and references to '
            "Articles, Sections and Schedules are to those of this Agreement unless otherwise stated.",
            body_text,
            _signature_blocks(rng, companies, effective),
        ]
    )
    text += "\n\n" + _schedules(filler, deal, schedules, plan, target - len(text))
    meta = {
        "title": deal.title,
        "parties": [c.name for c in companies],
        "roles": [deal.a, deal.b],
        "effective_date": effective,
        "governing_law": law_state.name,
        "sections": ["1.1", "1.2", *(f"{numbers[k]}.{i}" for k, h in plan.items() for i in range(1, len(h) + 1))],
        "defined_terms": defined,
        "schedules": list(schedules.values()),
    }
    return text, meta


def _contract_head(filler: Filler, deal: _Deal, companies: list[Company], states: list[State], date: str) -> str:
    rng = filler.rng
    a, b = companies
    preamble = (
        f'This {deal.title} (this "Agreement") is entered into as of {date} (the "Effective Date"), by and between '
        f"{a.name}, {with_article(states[0].name)} {a.entity} with its principal place of business at "
        f'{filler["a_address"]} ("{deal.a}"), and {b.name}, {with_article(states[1].name)} {b.entity} with its '
        f'principal place of business at {filler["b_address"]} ("{deal.b}"). {deal.a} and {deal.b} are each referred '
        'to herein as a "Party" and together as the "Parties."'
    )
    recitals = [
        f"WHEREAS, {deal.a} is engaged in {deal.business};",
        f"WHEREAS, {deal.b} desires to {deal.desire};",
        *(filler.fill(r) for r in rng.sample(_CONTRACT["contract"]["recital"], rng.randint(1, 3))),
        f"WHEREAS, the Parties wish to set forth the terms and conditions under which {deal.a} will {deal.verb} the "
        f"{deal.subject} for the benefit of {deal.b}.",
    ]
    recitals[-2] += " and"
    closing = (
        "NOW, THEREFORE, in consideration of the mutual covenants and agreements set forth herein, and for other good "
        "and valuable consideration, the receipt and sufficiency of which are hereby acknowledged, the Parties agree "
        "as follows:"
    )
    return "\n\n".join([deal.title, preamble, "RECITALS", *recitals, closing])


def _signature_blocks(rng: random.Random, companies: list[Company], date: str) -> str:
    blocks = [
        "IN WITNESS WHEREOF, the Parties have caused this Agreement to be executed by their duly authorized "
        "representatives as of the Effective Date."
    ]
    for party in companies:
        title = rng.choice(_CONTRACT["contract"]["signatory_title"])
        blocks.append(f"{party.name.upper()}\n\nBy: ______________________________\nName: {person(rng)}\n"
                      f"Title: {title}\nDate: {date}")  # fmt: skip
    return "\n\n".join(blocks)


def _schedules(filler: Filler, deal: _Deal, schedules: dict[str, str], kinds: Collection[str], budget: int) -> str:
    """Schedule A, holding as many ordering documents as it takes to reach `budget` characters, then the fee schedule
    and the service-level exhibit where the contract refers to them."""
    rng = filler.rng
    tail = []
    if "fees" in schedules:
        roles = _CONTRACT["contract"]["role"]
        rates = [f"{role}: ${rng.randint(9, 45) * 10}.00 per hour" for role in rng.sample(roles, rng.randint(2, 6))]
        terms = filler.fill(
            "2. Fixed Fees. Fixed fees, if any, are set forth in the applicable {order}.\n\n3. Payment. Invoices are "
            "payable in accordance with Section {ref:payment} of the Agreement."
        )
        rate_card = "1. Rates. The following hourly rates apply to time and materials work:\n\n" + "\n".join(rates)
        tail.append(f"{schedules['fees'].upper()}\nFEES\n\n{rate_card}\n\n{terms}")
    if "sla" in schedules:
        metrics = ("Availability", "Incident response time", "Incident resolution time", "On-time delivery",
                   "Order accuracy", "Report timeliness")  # fmt: skip
        lines = [
            f"{metric}: target {rng.choice(('95.0%', '98.0%', '99.0%', '99.5%', '99.9%'))} per calendar month; "
            f"service credit of {rng.randint(2, 10)}% of the monthly Fees for each full point below target"
            for metric in rng.sample(metrics, rng.randint(3, len(metrics)))
        ]
        cap = filler.fill("Service credits shall not exceed {percent} of the monthly Fees in any month.")
        tail.append(f"{schedules['sla'].upper()}\nSERVICE LEVELS\n\n" + "\n".join(lines) + "\n\n" + cap)
    extra_sections = _usable(_CONTRACT["contract"]["order_section"], kinds)
    orders = ["SCHEDULE A\nORDERING DOCUMENTS"]
    size = len(orders[0]) + sum(len(t) + 2 for t in tail)
    while len(orders) == 1 or size < budget:
        orders.append(_order_document(filler, deal, len(orders), extra_sections))
        size += len(orders[-1]) + 2
    return "\n\n".join(orders + tail)


def _order_document(filler: Filler, deal: _Deal, number: int, extra_sections: list[str]) -> str:
    """One numbered ordering document (a Statement of Work, Purchase Order, ...) under the agreement: scope,
    deliverables and dated milestones, acceptance, assumptions and contacts, and a few sections drawn from
    `extra_sections`."""
    rng = filler.rng
    pools = _CONTRACT["contract"]
    date = filler["effective"]
    deliverables = rng.sample(pools["deliverable"], rng.randint(2, 6))
    month = 12 * int(date[-4:]) + MONTHS.index(date.split()[0])
    milestones = []
    for i, deliverable in enumerate(deliverables, start=1):
        month += rng.randint(1, 3)
        due = f"{MONTHS[month % 12]} {rng.randint(1, 28)}, {month // 12}"
        milestones.append(f"Milestone {i}: {deliverable}, due {due}, payment of {dollars(rng, 4, 6)}")
    activities = [filler.fill(a) for a in rng.sample(pools["activity"], rng.randint(3, 7))]
    assumptions = [filler.fill(a) for a in rng.sample(pools["assumption"], rng.randint(2, 4))]
    extras = sorted(rng.sample(extra_sections, rng.randint(1, min(5, len(extra_sections)))), key=extra_sections.index)
    sections = [
        filler.fill("Overview. {A} shall {verb} the {subject} described below in support of the {workstream} program "
                    "of {B}, beginning on the date of the last signature below."),
        filler.fill("Scope. {A} shall:\n") + enumerate_items(activities),
        "Deliverables.\n" + "\n".join(f"D-{i} {d}" for i, d in enumerate(deliverables, start=1)),
        "Milestones and Payment.\n" + "\n".join(milestones),
        filler.fill("Acceptance. Each Deliverable shall be subject to review and acceptance by {B} in accordance with "
                    "the Agreement. {B} shall give written notice of acceptance or of any non-conformity within {days} "
                    "days after delivery."),
        *(filler.fill(extra) for extra in extras),
        "Assumptions.\n" + enumerate_items(assumptions),
        "Contacts.\n" + "\n".join(f"{role}: {person(rng)}" for role in rng.sample(pools["role"], rng.randint(2, 4))),
    ]  # fmt: skip
    intro = filler.fill(
        f'This {deal.order} No. {number} (this "{deal.order}") is entered into pursuant to the {deal.title.title()} '
        'dated {effective} between {a_name} and {b_name} (the "Agreement"). Capitalized terms used but not defined in '
        f"this {deal.order} have the meanings given to them in the Agreement."
    )
    numbered = (f"{i}. {section}" for i, section in enumerate(sections, start=1))
    return "\n\n".join([f"{deal.order.upper()} NO. {number}", intro, *numbered])
