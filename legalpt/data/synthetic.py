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
`generate_documents(n + k)`.

The phrases live in plain-text blocks (`_NAMES`, `_CONTRACT_PHRASES`, `_OPINION_PHRASES`) parsed at import; the code
below them only chooses, fills and arranges them.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable, Collection
from dataclasses import dataclass

from reporters_db import EDITIONS, REPORTERS

MIN_CHARS = 6_000  # shortest target length in characters (~1.5k tokens, ~1k words)
MAX_CHARS = 220_000  # longest target length (~55k tokens, ~35k words)
_LATEST_YEAR = 2024  # latest year of a contract or a cited edition; fixed, so the output never depends on today


def _parse(text: str) -> dict[str, dict[str, list[str]]]:
    """Phrase blocks: "## group" opens a group, "# pool" a pool inside it, "- text" adds an entry, "* text" an
    enumerated item (kept with its "* " marker), and a line indented by two spaces continues the entry above it."""
    groups: dict[str, dict[str, list[str]]] = {}
    for line in text.strip().splitlines():
        if line.startswith("## "):
            group = groups.setdefault(line[3:], {})
        elif line.startswith("# "):
            pool = group.setdefault(line[2:], [])
        elif line.startswith("- "):
            pool.append(line[2:])
        elif line.startswith("* "):
            pool.append(line)
        elif line.startswith("  "):
            pool[-1] += " " + line.strip()
        elif line:
            raise ValueError(f"unparsable phrase line: {line!r}")
    return groups


# ----------------------------------------------------------------------------------------------------------------
# Reporters: real abbreviations, and years inside both their real span and reporters-db's dates.

# Edition -> (first year, last year, first volume, last volume): roughly the span each edition really covered, so that
# a cited year maps to a plausible volume. The years actually drawn are this span intersected with reporters-db's.
_EDITION_SPANS: dict[str, tuple[int, int, int, int]] = {
    "U.S.": (1875, 2023, 91, 600),
    "S. Ct.": (1882, 2023, 1, 143),
    "L. Ed. 2d": (1956, 2023, 1, 215),
    "F.2d": (1924, 1993, 1, 999),
    "F.3d": (1993, 2021, 1, 999),
    "F.4th": (2021, 2024, 1, 110),
    "F. Supp.": (1932, 1988, 1, 999),
    "F. Supp. 2d": (1988, 2014, 1, 999),
    "F. Supp. 3d": (2014, 2024, 1, 720),
    "Cal. 2d": (1934, 1969, 1, 71),
    "Cal. 3d": (1969, 1991, 1, 54),
    "Cal. 4th": (1991, 2016, 1, 63),
    "N.Y.2d": (1956, 2004, 1, 100),
    "N.Y.3d": (2004, 2024, 1, 42),
    "Ill. 2d": (1954, 2011, 1, 243),
    "Mass.": (1867, 2024, 96, 495),
    "N.E.2d": (1936, 2013, 1, 999),
    "N.E.3d": (2013, 2024, 1, 240),
    "A.2d": (1938, 2010, 1, 999),
    "A.3d": (2010, 2024, 1, 320),
    "P.2d": (1931, 2000, 1, 999),
    "P.3d": (2000, 2024, 1, 550),
    "So. 2d": (1941, 2008, 1, 999),
    "So. 3d": (2008, 2024, 1, 390),
    "S.W.2d": (1928, 1999, 1, 999),
    "S.W.3d": (1999, 2024, 1, 690),
    "N.W.2d": (1942, 2023, 1, 999),
    "S.E.2d": (1939, 2024, 1, 900),
}


def _db_years(edition: str) -> tuple[int, int]:
    """The years reporters-db says `edition` was published (an open end counts as `_LATEST_YEAR`)."""
    for reporter in REPORTERS[EDITIONS[edition]]:
        dates = reporter["editions"].get(edition)
        if dates is not None:
            return dates["start"].year, dates["end"].year if dates["end"] else _LATEST_YEAR
    raise KeyError(edition)


def _citable_years() -> dict[str, tuple[int, int]]:
    years = {}
    for edition, (first, last, _, _) in _EDITION_SPANS.items():
        start, end = _db_years(edition)
        years[edition] = (max(first, start), min(last, end))
        if years[edition][0] > years[edition][1]:
            raise RuntimeError(f"reporters-db dates {start}-{end} of {edition!r} miss the span {first}-{last}")
    return years


_YEARS = _citable_years()  # edition -> (first, last) year a citation to it may carry


def _edition_for(rng: random.Random, editions: tuple[str, ...], year: int) -> str | None:
    fits = [e for e in editions if _YEARS[e][0] <= year <= _YEARS[e][1]]
    return rng.choice(fits) if fits else None


def _volume(rng: random.Random, edition: str, year: int) -> int:
    """The volume of `edition` that a decision of `year` would be in, interpolated over the edition's span."""
    first, last, v0, v1 = _EDITION_SPANS[edition]
    fraction = (year - first + rng.random()) / (last - first + 1)
    return max(v0, min(v1, v0 + int(fraction * (v1 - v0 + 1))))


# ----------------------------------------------------------------------------------------------------------------
# Names, places and courts shared by both kinds of document.

_NAMES = """
## names
# first
- Amara Benjamin Carmen Daniel Elena Farid Grace Hiroshi Isabel Jonah Keisha Liam Maya Nikolai Olivia Priya Quentin
  Rosa Samuel Tamar Umar Valeria Wesley Ximena Yusuf Zoe Adrian Beatrice Colin Dolores Emmett Fiona
# last
- Abernathy Bellweather Castellanos Delacroix Eastwood Fairbanks Galloway Halvorsen Iwasaki Jablonski Kowalczyk
  Lindqvist Montgomery Nakamura Okafor Pemberton Quintero Rasmussen Sandoval Thibodeaux Underwood Vasquez Whitcombe
  Yarborough Zeller Ashworth Brennan Chandler Donovan Ellison Fitzgerald Harrington Kessler Lockhart Mercer
  Northcott Prescott Redmond Sinclair Thornton Vance Winslow Aldridge Brightman Corrigan Dunmore
# company_head
- Northwind Bluestone Harborview Silverline Meridian Pinnacle Redwood Granite Lakeshore Summit Ironbridge Evergreen
  Brightwater Oakmont Keystone Crescent Sterling Highland Riverbend Atlas Beacon Copperfield Driftwood Falconer
  Goldcrest Juniper Kestrel Larkspur Marlowe Nettlefield Orchard Palisade Quarry Saltmarsh Tidewater
# company_trade
- Logistics Therapeutics Software Energy Capital Holdings Manufacturing Analytics Foods Materials Systems Networks
  Biosciences Realty Media Robotics Freight Medical Pharmaceuticals Semiconductor Insurance Textiles
# town
- Riverton Fairhaven Millbrook Ashford Linden Harwick Brookdale Easton Glenmoor Kingsport Marston Oakdale Pinecrest
  Stonebridge Westfield
# street
- Main Market Harbor Commerce Franklin Lakeview Park Elm Washington Madison Industrial Bay
"""
_WORDS = {name: tuple(words[0].split()) for name, words in _parse(_NAMES)["names"].items()}
_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
           "November", "December")  # fmt: skip
# Entity suffix -> what a contract's preamble calls that kind of entity.
_ENTITIES = {
    "Inc.": "corporation",
    "Corporation": "corporation",
    "Corp.": "corporation",
    "LLC": "limited liability company",
    "L.P.": "limited partnership",
    "Co.": "corporation",
}


@dataclass(frozen=True)
class _State:
    name: str
    abbr: str  # Bluebook abbreviation used in court parentheticals: "(Minn. 1990)"
    postal: str
    cities: tuple[str, ...]
    regional: tuple[str, ...]  # editions of its regional reporter
    official: tuple[
        str, ...
    ] = ()  # editions of its official reports, cited with the year alone: "12 Cal. 4th 1 (1995)"
    high_court: str = ""  # name of its highest court; "" = "Supreme Court of <name>"
    appellate: str = ""  # parenthetical of its intermediate appellate court; "" = cite only its highest court
    prosecutor: str = "State"  # how its criminal cases are captioned: "State v. X"


_STATES = (
    _State("California", "Cal.", "CA", ("Los Angeles", "San Francisco", "Sacramento"), ("P.2d", "P.3d"),
           ("Cal. 2d", "Cal. 3d", "Cal. 4th"), prosecutor="People"),
    _State("New York", "N.Y.", "NY", ("New York", "Albany", "Buffalo"), ("N.E.2d", "N.E.3d"), ("N.Y.2d", "N.Y.3d"),
           high_court="Court of Appeals of New York", prosecutor="People"),
    _State("Delaware", "Del.", "DE", ("Wilmington", "Dover", "Newark"), ("A.2d", "A.3d")),
    _State("Texas", "Tex.", "TX", ("Houston", "Austin", "Dallas"), ("S.W.2d", "S.W.3d"), appellate="Tex. App."),
    _State("Illinois", "Ill.", "IL", ("Chicago", "Springfield", "Naperville"), ("N.E.2d", "N.E.3d"), ("Ill. 2d",),
           appellate="Ill. App. Ct.", prosecutor="People"),
    _State("Massachusetts", "Mass.", "MA", ("Boston", "Cambridge", "Worcester"), ("N.E.2d", "N.E.3d"), ("Mass.",),
           high_court="Supreme Judicial Court of Massachusetts", appellate="Mass. App. Ct.",
           prosecutor="Commonwealth"),
    _State("Florida", "Fla.", "FL", ("Miami", "Tampa", "Orlando"), ("So. 2d", "So. 3d"),
           appellate="Fla. Dist. Ct. App."),
    _State("Pennsylvania", "Pa.", "PA", ("Philadelphia", "Pittsburgh", "Harrisburg"), ("A.2d", "A.3d"),
           appellate="Pa. Super. Ct.", prosecutor="Commonwealth"),
    _State("Washington", "Wash.", "WA", ("Seattle", "Spokane", "Tacoma"), ("P.2d", "P.3d"),
           appellate="Wash. Ct. App."),
    _State("Georgia", "Ga.", "GA", ("Atlanta", "Savannah", "Augusta"), ("S.E.2d",), appellate="Ga. Ct. App."),
    _State("Minnesota", "Minn.", "MN", ("Minneapolis", "Saint Paul", "Duluth"), ("N.W.2d",),
           appellate="Minn. Ct. App."),
    _State("Colorado", "Colo.", "CO", ("Denver", "Boulder", "Fort Collins"), ("P.2d", "P.3d"), appellate="Colo. App."),
    _State("Ohio", "Ohio", "OH", ("Columbus", "Cleveland", "Cincinnati"), ("N.E.2d", "N.E.3d"),
           appellate="Ohio Ct. App."),
    _State("New Jersey", "N.J.", "NJ", ("Newark", "Princeton", "Trenton"), ("A.2d", "A.3d")),
    _State("North Carolina", "N.C.", "NC", ("Charlotte", "Raleigh", "Durham"), ("S.E.2d",),
           appellate="N.C. Ct. App."),
    _State("Michigan", "Mich.", "MI", ("Detroit", "Lansing", "Grand Rapids"), ("N.W.2d",),
           appellate="Mich. Ct. App.", prosecutor="People"),
)  # fmt: skip
# (ordinal used in court names, abbreviation in parentheticals); the Eleventh and Federal Circuits date from 1981-82
_CIRCUITS = (
    ("First", "1st"), ("Second", "2d"), ("Third", "3d"), ("Fourth", "4th"), ("Fifth", "5th"), ("Sixth", "6th"),
    ("Seventh", "7th"), ("Eighth", "8th"), ("Ninth", "9th"), ("Tenth", "10th"), ("District of Columbia", "D.C."),
    ("Eleventh", "11th"), ("Federal", "Fed."),
)  # fmt: skip
_DISTRICTS = (
    ("Southern District of New York", "S.D.N.Y."), ("Eastern District of New York", "E.D.N.Y."),
    ("Northern District of California", "N.D. Cal."), ("Central District of California", "C.D. Cal."),
    ("District of Massachusetts", "D. Mass."), ("Northern District of Illinois", "N.D. Ill."),
    ("Eastern District of Pennsylvania", "E.D. Pa."), ("District of Delaware", "D. Del."),
    ("Southern District of Texas", "S.D. Tex."), ("District of New Jersey", "D.N.J."),
    ("Western District of Washington", "W.D. Wash."), ("District of Colorado", "D. Colo."),
)  # fmt: skip

# ----------------------------------------------------------------------------------------------------------------
# Templates: "{field}" draws from a pool, "{Field}" draws the same with a capital letter, and fixed or lazy values
# ("{ref:term}") come from the document.


class _Lazy:
    """A template value computed each time it is formatted; the format spec (`term` in `{ref:term}`) is the argument."""

    __slots__ = ("draw",)

    def __init__(self, draw: Callable[[str], str]) -> None:
        self.draw = draw

    def __format__(self, spec: str) -> str:
        return self.draw(spec)


class _Filler(dict):
    """Fills templates for one document: fixed values live in the dict, other fields are drawn from `pools` (and
    their own fields filled in turn)."""

    def __init__(self, rng: random.Random, pools: dict[str, list[str]], **fixed: object) -> None:
        super().__init__(fixed)
        self.rng = rng
        self.pools = pools

    def __missing__(self, key: str) -> str:
        options = self.pools.get(key)
        if options is not None:
            return self.rng.choice(options).format_map(self)
        text = self.rng.choice(self.pools[key[0].lower() + key[1:]]).format_map(self)
        return text[0].upper() + text[1:]

    def fill(self, template: str) -> str:
        return template.format_map(self)

    def sentence(self, template: str) -> str:
        text = template.format_map(self)
        if ".." in text:  # a value that ends with a period ("Id.", "Inc.") before the sentence's own period
            text = text.replace("..", ".")
        return text[0].upper() + text[1:]


_COUNTS = {
    "days": ["five (5)", "ten (10)", "fifteen (15)", "thirty (30)", "forty-five (45)", "sixty (60)", "ninety (90)"],
    "years": ["one (1) year", "two (2) years", "three (3) years", "five (5) years"],
    "percent": ["five percent (5%)", "ten percent (10%)", "fifteen percent (15%)", "twenty-five percent (25%)"],
}


def _date(rng: random.Random, year: int) -> str:
    return f"{rng.choice(_MONTHS)} {rng.randint(1, 28)}, {year}"


def _amount(rng: random.Random, low: int, high: int) -> str:
    """A dollar amount between 10**low and 10**high, rounded to two significant digits like a negotiated figure."""
    value = int(10 ** rng.uniform(low, high))
    unit = 10 ** max(0, int(math.log10(value)) - 1)
    return f"${value // unit * unit:,}"


def _roman(number: int) -> str:
    out = []
    for value, letters in ((10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")):
        count, number = divmod(number, value)
        out.append(letters * count)
    return "".join(out)


def _person(rng: random.Random) -> str:
    return f"{rng.choice(_WORDS['first'])} {rng.choice(_WORDS['last'])}"


@dataclass(frozen=True)
class _Company:
    name: str  # "Northwind Logistics, Inc."
    short: str  # "Northwind Logistics"
    entity: str  # "corporation"


def _company(rng: random.Random) -> _Company:
    short = f"{rng.choice(_WORDS['company_head'])} {rng.choice(_WORDS['company_trade'])}"
    suffix = rng.choice(tuple(_ENTITIES))
    name = f"{short}, Inc." if suffix == "Inc." else f"{short} {suffix}"
    return _Company(name, short, _ENTITIES[suffix])


def _address(rng: random.Random, state: _State) -> str:
    street = f"{rng.randint(10, 9900)} {rng.choice(_WORDS['street'])} {rng.choice(('Street', 'Avenue', 'Road'))}"
    suite = f", Suite {rng.randint(1, 30) * 100}" if rng.random() < 0.6 else ""
    return f"{street}{suite}, {rng.choice(state.cities)}, {state.postal} {rng.randint(10000, 99999)}"


def _article(word: str) -> str:
    """The word with its indefinite article: "a Delaware", "an Illinois"."""
    return f"{'an' if word[0] in 'AEIOU' else 'a'} {word}"


def _enumerate(items: list[str]) -> str:
    """(a) first;\\n(b) second; and\\n(c) third."""
    lines = [f"({chr(ord('a') + i)}) {item};" for i, item in enumerate(items)]
    lines[-1] = lines[-1][:-1] + "."
    if len(lines) > 1:
        lines[-2] += " and"
    return "\n".join(lines)


# ================================================================================================================
# Contracts


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

# Groups: "contract" (recitals and the pools of the ordering documents), "definitions" (one pool per defined term;
# only the terms the body uses are defined), and one group per article kind, "kind | TITLE", whose pools are its
# sections. A section keeps its first sentence, then a sample of the others in order; its "* " items follow the last
# sentence, which then ends with a colon and is always kept. "{ref:kind}" points to the first section of that
# article, which refers to no other article so that it is always present. A section whose first sentence or item
# lead-in refers to an absent article is left out, and any other sentence that does is dropped.
_CONTRACT_PHRASES = """
## contract
# recital
- WHEREAS, {A} has the expertise, personnel and resources necessary to {verb} the {subject} in accordance with the
  terms of this Agreement;
- WHEREAS, {B} has conducted a competitive selection process and has selected {A} to {verb} the {subject};
- WHEREAS, the Parties entered into a letter of intent dated {prior_date} and now wish to set forth the definitive
  terms of their relationship;
- WHEREAS, {A} represents that it holds all licenses and permits required to {verb} the {subject} in the State of
  {law_state};
- WHEREAS, each Party has obtained all corporate approvals required to enter into this Agreement;
# workstream
- data migration
- system integration
- user acceptance testing
- training
- onboarding
- quality inspection
- packaging and labeling
- installation
- preventive maintenance
- custom configuration
- reporting
- process redesign
- vendor management
- capacity planning
# activity
- prepare a detailed project plan and deliver it to {B} for approval
- conduct up to {count} workshops with stakeholders of {B} to confirm requirements
- configure the {subject} to support the business processes described in the requirements document
- perform {workstream} activities in coordination with the project team of {B}
- provide weekly written status reports describing progress, risks and open issues
- train up to {count} employees of {B} in the use of the {subject}
- perform acceptance testing in accordance with the test plan approved by {B}
- provide post-delivery support for a period of {days} days
- coordinate with third-party vendors of {B} as reasonably required for {workstream}
- deliver the {subject} to the facility of {B} located in {city}
# deliverable
- Project plan and schedule
- Requirements specification
- Configuration workbook
- Test plan and results
- Training materials
- Final acceptance report
- Monthly performance report
- Installation certificate
- Data migration report
- Operations manual
# assumption
- {B} will make its subject-matter experts available for at least {count} hours per week
- all work will be performed remotely except for on-site visits approved in advance by {B}
- {B} will provide timely access to its systems, data and facilities
- the schedule assumes that {B} will review each Deliverable within {days} days after delivery
- any work outside the scope of this {order} will be addressed through the change procedure of the Agreement
- the Fees assume no more than {count} production environments
# role
- Project Manager
- Solution Architect
- Senior Consultant
- Consultant
- Analyst
- Engineer
- Field Technician
- Quality Specialist
# signatory_title
- Chief Executive Officer
- President
- Chief Financial Officer
- General Counsel
- Chief Operating Officer
- Vice President, Operations
- Managing Member
# cadence
- weekly
- every two weeks
- monthly
# order_section
- Objectives. The objective of this {order} is to enable {B} to improve the efficiency of its {workstream}
  operations while maintaining compliance with Applicable Law.
- Governance. Each Party shall appoint a project manager, and the project managers shall meet {cadence} to review
  progress, risks and open issues. Issues that the project managers cannot resolve shall be escalated in accordance
  with Section {ref:disputes} of the Agreement.
- Change Control. Any change to the scope, schedule or Fees of this {order} shall be documented in a written change
  order signed by both Parties. {A} shall not be obligated to perform any change until the change order has been
  executed.
- Staffing. {A} shall staff this {order} with personnel having the qualifications described in its proposal. Key
  personnel may not be reassigned during the first {days} days of the engagement without the prior written consent
  of {B}.
- Reporting. {A} shall deliver a written status report to {B} {cadence}, describing completed activities, planned
  activities, risks and any decisions required of {B}.
- Out of Scope. The following activities are outside the scope of this {order}: the procurement of hardware or
  third-party software, the operation of the data centers of {B}, and the support of legacy systems.
- Term. This {order} shall commence on the date of the last signature below and continue until all Deliverables
  have been accepted, unless terminated earlier in accordance with Section {ref:term} of the Agreement.
- Security. {A} shall comply with the security requirements of the Agreement and shall not access the production
  systems of {B} except through accounts issued by {B}.
- Travel. Travel expenses shall be reimbursed in accordance with the Agreement and shall not exceed {small_amount}
  per month without the prior written approval of {B}.
- Location. The work shall be performed at the facilities of {A} and at the site of {B} in {city}.
- Warranty. The Deliverables are subject to the warranty set forth in Section {ref:warranties} of the Agreement.
- Confidentiality. All information exchanged under this {order} is Confidential Information subject to Section
  {ref:confidentiality} of the Agreement.
- Risks. The principal risks to the schedule of this {order} are delays in the availability of the personnel of {B}
  and changes to the requirements for {workstream}. The Parties shall review these risks at each project meeting.
- Dependencies. The schedule of this {order} depends on the timely completion by {B} of the {workstream} activities
  for which it is responsible.

## definitions
# Affiliate
- means, with respect to any Person, any other Person that directly or indirectly controls, is controlled by, or is
  under common control with such Person, for so long as such control exists
# Applicable Law
- means all laws, statutes, regulations, ordinances, orders and decrees of any Governmental Authority that apply to
  a Party or to its performance under this Agreement
# Business Day
- means any day other than a Saturday, a Sunday or a day on which commercial banks in {city} are authorized or
  required by law to close
# Change of Control
- means any transaction or series of related transactions in which any Person acquires beneficial ownership of more
  than fifty percent (50%) of the voting power of a Party, or all or substantially all of its assets
# Claim
- means any claim, demand, suit, action or proceeding brought by a third party
# Confidential Information
- means all non-public information disclosed by or on behalf of a Party, whether orally or in writing, that is
  designated as confidential or that a reasonable person would understand to be confidential given the nature of the
  information and the circumstances of disclosure
# Deliverables
- means all reports, documents, software and other materials that {A} delivers to {B} under this Agreement
# Documentation
- means the user manuals, specifications and technical documentation that {A} makes generally available for the
  {subject}
# Fees
- means the amounts payable by {B} under this Agreement, as set forth in {sched_fees}
# Governmental Authority
- means any federal, state, local or foreign government, or any court, agency, commission or other body exercising
  governmental or regulatory authority
# Intellectual Property Rights
- means all patents, copyrights, trademarks, trade secrets, moral rights and other intellectual property rights of
  every kind, whether registered or unregistered, throughout the world
# Losses
- means all losses, damages, liabilities, judgments, settlements, fines, costs and expenses, including reasonable
  attorneys' fees
# Person
- means any individual, corporation, partnership, limited liability company, trust, association or other entity
# Personal Data
- means any information relating to an identified or identifiable natural person that a Party processes in
  connection with this Agreement
# Representatives
- means a Party's Affiliates and its and their directors, officers, employees, agents and professional advisors
# Specifications
- means the functional and technical specifications for the {subject} set forth in the applicable {order} or in the
  Documentation
# Term
- has the meaning set forth in Section {ref:term}
# Territory
- means the United States of America and such other countries as the Parties may agree in writing

## subject
# Scope
- Subject to the terms of this Agreement, {A} shall {verb} the {subject} {prep} {B} as described in each {order}
  executed by the Parties.
- Each {order} shall be substantially in the form of {sched_scope} and shall form part of this Agreement.
- {A} shall {verb} the {subject} in the Territory in accordance with the Specifications and Applicable Law.
# Orders
- {B} may request additional {subject} by submitting a proposed {order} to {A}.
- No {order} shall be binding until it has been signed by authorized representatives of both Parties.
- {A} shall accept or reject each proposed {order} within {days} days after receipt.
# Personnel
- {A} shall assign qualified personnel to {verb} the {subject} and shall designate a relationship manager who will
  serve as the primary point of contact for {B}.
- {A} shall replace any of its personnel whom {B} reasonably requests to be removed, at no additional charge to {B}.
# Delivery and Acceptance
- {A} shall deliver the {subject} and any Deliverables on the dates set forth in the applicable {order}.
- {B} shall have {days} days after delivery to test the {subject} against the Specifications and to notify {A} of
  any material non-conformity.
- If {B} does not give notice of a non-conformity within that period, the {subject} shall be deemed accepted.
# Cooperation
- {B} shall provide {A} with timely access to the information, facilities and personnel reasonably required to
  {verb} the {subject}.
- {A} shall not be responsible for any delay caused by the failure of {B} to perform its obligations under this
  Section.
# Changes
- Either Party may request a change to the scope of an {order} by written notice to the other Party.
- No change shall be effective until the Parties have executed a written change order describing the change and any
  resulting adjustment to the Fees and the schedule.
# Service Levels
- {A} shall meet or exceed the service levels set forth in {sched_sla}.
- If {A} fails to meet a service level, {B} shall be entitled to the service credits described in {sched_sla}, which
  shall be {B}'s sole and exclusive monetary remedy for that failure.

## payment | FEES AND PAYMENT
# Fees
- In consideration of the {subject}, {B} shall pay {A} the Fees set forth in {sched_fees}.
- Except as otherwise provided in this Agreement, the Fees are non-cancellable and non-refundable.
- The Fees shall remain fixed during the Initial Term and may thereafter be increased by {A} upon {days} days' prior
  written notice, provided that no increase in any twelve-month period shall exceed {percent}.
# Invoices and Payment
- {A} shall invoice {B} monthly in arrears for all Fees accrued during the preceding month.
- {B} shall pay each undisputed invoice within {days} days after receipt.
- All payments shall be made in United States dollars by wire transfer to the account designated by {A} in writing.
# Disputed Amounts
- If {B} disputes any portion of an invoice in good faith, {B} shall notify {A} in writing before the due date,
  describing the basis of the dispute in reasonable detail.
- The Parties shall work together diligently to resolve any such dispute within {days} days, and {B} shall pay the
  undisputed portion of the invoice when due.
- The procedures in Section {ref:disputes} shall apply to any dispute that the Parties cannot resolve.
# Late Payments
- Any amount not paid when due shall bear interest at the lesser of one and one-half percent (1.5%) per month and
  the highest rate permitted by Applicable Law.
- If any undisputed amount remains unpaid more than {days} days after written notice of non-payment, {A} may suspend
  performance until all past-due amounts are paid.
# Taxes
- The Fees do not include any sales, use, value-added or similar taxes, all of which shall be paid by {B}, other
  than taxes based on the net income of {A}.
- If {B} is required by Applicable Law to withhold any tax from a payment, {B} shall gross up the payment so that
  {A} receives the amount it would have received absent the withholding.
# Expenses
- {B} shall reimburse {A} for reasonable and documented travel and out-of-pocket expenses incurred in performing
  this Agreement, provided that any single expense exceeding {small_amount} has been approved in advance by {B} in
  writing.
- Expenses shall be invoiced at cost, without mark-up, together with receipts or other reasonable supporting
  documentation.

## term | TERM AND TERMINATION
# Term
- This Agreement shall commence on the Effective Date and continue for an initial period of {years} (the "Initial
  Term"), unless earlier terminated in accordance with this Article.
- Thereafter, this Agreement shall renew automatically for successive periods of one (1) year (each, a "Renewal
  Term" and, together with the Initial Term, the "Term") unless either Party gives written notice of non-renewal at
  least {days} days before the end of the then-current Term.
# Termination for Convenience
- Either Party may terminate this Agreement for convenience upon {days} days' prior written notice to the other
  Party.
- Termination for convenience shall not relieve {B} of its obligation to pay the Fees for the {subject} provided
  through the effective date of termination.
# Termination for Cause
- Either Party may terminate this Agreement upon written notice to the other Party if:
* the other Party materially breaches this Agreement and fails to cure the breach within {days} days after receiving
  written notice describing it
* the other Party becomes insolvent, makes a general assignment for the benefit of creditors, or becomes the subject
  of any voluntary or involuntary proceeding in bankruptcy
* the other Party undergoes a Change of Control in favor of a competitor of the terminating Party
* the other Party violates Applicable Law in a manner that materially affects the terminating Party
# Effect of Termination
- Upon expiration or termination of this Agreement for any reason, all rights granted to {B} under this Agreement
  shall terminate immediately.
- Within {days} days after termination, each Party shall return or destroy all Confidential Information of the other
  Party in its possession, as set forth in Section {ref:confidentiality}.
- {B} shall pay {A} all Fees accrued through the effective date of termination.
# Survival
- Any provision of this Agreement that by its nature should survive its termination or expiration shall so survive,
  including the provisions relating to payment, confidentiality, indemnification and limitation of liability.
# Transition Assistance
- Upon request by {B} made before the end of the Term, {A} shall provide reasonable transition assistance for a
  period of up to {days} days, at the rates then in effect.
- During the transition period the terms of this Agreement shall continue to apply to the {subject} provided by {A}.

## warranties | REPRESENTATIONS AND WARRANTIES
# Mutual Representations
- Each Party represents and warrants to the other Party that:
* it is duly organized, validly existing and in good standing under the laws of its jurisdiction of organization
* it has full corporate power and authority to enter into and perform this Agreement
* the execution and performance of this Agreement do not conflict with any other agreement to which it is a party
* this Agreement constitutes its legal, valid and binding obligation, enforceable in accordance with its terms
# Performance Warranty
- {A} warrants that the {subject} will conform in all material respects to the Specifications for a period of {days}
  days after delivery.
- {A} further warrants that it will {verb} the {subject} in a professional and workmanlike manner, using personnel
  with the skill and experience required.
- If the {subject} fail to conform to this warranty, {A} shall, at its option, correct the non-conformity or refund
  the Fees paid for the non-conforming portion.
# Compliance Warranty
- Each Party warrants that it will comply with all Applicable Law in performing its obligations under this
  Agreement.
- {A} warrants that it holds, and will maintain throughout the Term, all permits and licenses required to {verb} the
  {subject}.
# Disclaimer
- EXCEPT AS EXPRESSLY SET FORTH IN THIS ARTICLE, NEITHER PARTY MAKES ANY WARRANTY OF ANY KIND, WHETHER EXPRESS,
  IMPLIED OR STATUTORY, AND EACH PARTY SPECIFICALLY DISCLAIMS ALL IMPLIED WARRANTIES OF MERCHANTABILITY, FITNESS FOR
  A PARTICULAR PURPOSE AND NON-INFRINGEMENT.

## confidentiality | CONFIDENTIALITY
# Obligations
- Each Party that receives Confidential Information shall hold it in strict confidence and shall not disclose it to
  any Person other than its Representatives who need to know it for the purposes of this Agreement and who are bound
  by obligations of confidentiality no less protective than those set forth herein.
- Each Party shall protect the Confidential Information of the other Party using at least the degree of care it uses
  to protect its own information of a similar nature, and in no event less than reasonable care.
- Each Party shall be responsible for any breach of this Article by its Representatives.
# Exclusions
- The obligations in Section {ref:confidentiality} shall not apply to information that the receiving Party can
  demonstrate:
* is or becomes generally available to the public other than through a breach of this Agreement
* was known to the receiving Party before its disclosure under this Agreement without restriction
* is received from a third party that is not under an obligation of confidentiality
* is independently developed without use of or reference to the Confidential Information of the disclosing Party
# Compelled Disclosure
- If a Party is required by Applicable Law or by order of a Governmental Authority to disclose any Confidential
  Information of the other Party, it shall give prompt written notice so that the other Party may seek a protective
  order.
- The Party compelled to disclose shall disclose only that portion of the Confidential Information that its counsel
  advises is legally required.
# Equitable Relief
- Each Party acknowledges that a breach of this Article may cause irreparable harm for which monetary damages would
  be an inadequate remedy.
- Accordingly, the non-breaching Party shall be entitled to seek injunctive relief, without the posting of a bond,
  in addition to any other remedy available at law or in equity.
# Return of Materials
- Upon the written request of the disclosing Party, the receiving Party shall promptly return or destroy all
  Confidential Information of the disclosing Party and certify the destruction in writing.
- The receiving Party may retain copies stored in automatic backup systems, which shall remain subject to this
  Article for so long as they are retained.

## ip | INTELLECTUAL PROPERTY
# Ownership
- As between the Parties, {A} owns all right, title and interest, including all Intellectual Property Rights, in and
  to the {subject} and the Documentation.
- Nothing in this Agreement transfers to {B} any Intellectual Property Rights of {A}, except for the limited rights
  expressly granted herein.
# Deliverables
- Upon payment in full of the applicable Fees, {A} assigns to {B} all Intellectual Property Rights in the
  Deliverables created specifically for {B}.
- {A} retains ownership of its pre-existing materials and general know-how incorporated into any Deliverables, and
  grants {B} a perpetual, non-exclusive license to use those materials as part of the Deliverables.
# Feedback
- {B} may provide suggestions or feedback regarding the {subject}.
- {A} may use any such feedback without restriction and without obligation to {B}.
# Restrictions
- Except as expressly permitted by this Agreement, {B} shall not:
* copy, modify or create derivative works of the {subject} or the Documentation
* reverse engineer, decompile or disassemble any software included in the {subject}
* sublicense, rent or lease the {subject} to any third party
* remove or alter any proprietary notice of {A}

## compliance | COMPLIANCE AND DATA PROTECTION
# Compliance with Laws
- Each Party shall comply with all Applicable Law in connection with this Agreement, including all anti-corruption,
  export control and sanctions laws.
- Neither Party shall offer or give anything of value to any official of a Governmental Authority for the purpose of
  obtaining or retaining business.
# Personal Data
- To the extent that {A} processes Personal Data on behalf of {B}, {A} shall process it only on the documented
  instructions of {B} and in accordance with Applicable Law.
- {A} shall implement appropriate technical and organizational measures to protect Personal Data against
  unauthorized access, loss or disclosure.
- {A} shall notify {B} without undue delay, and in any event within seventy-two (72) hours, after becoming aware of
  any breach of security affecting Personal Data.
# Security Program
- {A} shall maintain a written information security program that includes administrative, physical and technical
  safeguards appropriate to the nature of the {subject}.
- {A} shall review the program at least annually and promptly remediate any material deficiency identified.

## audit | RECORDS AND AUDIT
# Records
- {A} shall maintain complete and accurate records relating to the {subject} and the Fees for at least {years} after
  the end of the Term.
# Audit Rights
- Upon {days} days' prior written notice, {B} or its independent auditor may inspect the records described in
  Section {ref:audit} during normal business hours, not more than once in any calendar year.
- If an audit reveals an overcharge, {A} shall promptly refund the overcharged amount, and if the overcharge exceeds
  {percent} of the Fees for the audited period, {A} shall also bear the cost of the audit.

## insurance | INSURANCE
# Required Coverage
- During the Term and for one (1) year thereafter, {A} shall maintain, at its own expense, the following insurance
  with insurers rated A- or better by A.M. Best:
* commercial general liability insurance with limits of not less than {amount} per occurrence
* professional liability insurance with limits of not less than {amount} per claim
* workers' compensation insurance as required by Applicable Law
* cyber liability insurance with limits of not less than {amount} in the aggregate
# Certificates
- Upon request, {A} shall furnish {B} with certificates of insurance evidencing the coverage required by Section
  {ref:insurance}.
- {A} shall give {B} at least {days} days' prior written notice of any cancellation or material reduction of that
  coverage.

## indemnification | INDEMNIFICATION
# Indemnification by {A}
- {A} shall defend {B} and its Representatives against any Claim, and shall indemnify and hold them harmless from
  all Losses arising from that Claim, to the extent the Claim arises out of:
* any allegation that the {subject} infringe or misappropriate the Intellectual Property Rights of any Person
* the gross negligence or willful misconduct of {A} or its personnel
* any breach by {A} of its obligations under Section {ref:confidentiality}
* any violation of Applicable Law by {A}
# Indemnification by {B}
- {B} shall defend {A} and its Representatives against any Claim, and shall indemnify and hold them harmless from
  all Losses arising from that Claim, to the extent the Claim arises out of the use of the {subject} by {B} in
  breach of this Agreement or in violation of Applicable Law.
# Procedure
- The Party seeking indemnification shall give the indemnifying Party prompt written notice of the Claim, provided
  that any delay shall relieve the indemnifying Party of its obligations only to the extent it is prejudiced by the
  delay.
- The indemnifying Party shall have sole control of the defense and settlement of the Claim, provided that it shall
  not settle any Claim that imposes any obligation on the indemnified Party without that Party's prior written
  consent.
- The indemnified Party may participate in the defense with counsel of its own choosing at its own expense.
# Infringement Remedies
- If the {subject} become, or in the opinion of {A} are likely to become, the subject of an infringement Claim, {A}
  may, at its option and expense:
* procure for {B} the right to continue using the {subject}
* modify the {subject} so that they become non-infringing without material loss of functionality
* replace the {subject} with functionally equivalent non-infringing items
* terminate the affected portion of this Agreement and refund any prepaid Fees for that portion

## liability | LIMITATION OF LIABILITY
# Exclusion of Damages
- EXCEPT FOR A PARTY'S INDEMNIFICATION OBLIGATIONS OR A BREACH OF ITS CONFIDENTIALITY OBLIGATIONS, IN NO EVENT SHALL
  EITHER PARTY BE LIABLE FOR ANY INDIRECT, INCIDENTAL, SPECIAL, CONSEQUENTIAL OR PUNITIVE DAMAGES, OR FOR ANY LOSS
  OF PROFITS, REVENUE OR DATA, HOWEVER CAUSED.
# Cap on Liability
- EXCEPT AS PROVIDED IN SECTION {ref:liability}, THE AGGREGATE LIABILITY OF EACH PARTY ARISING OUT OF THIS AGREEMENT
  SHALL NOT EXCEED THE FEES PAID OR PAYABLE BY {B_UPPER} IN THE TWELVE (12) MONTHS PRECEDING THE EVENT GIVING RISE
  TO THE LIABILITY.
# Basis of the Bargain
- The Parties acknowledge that the limitations in this Article reflect an informed, voluntary allocation of risk and
  form an essential basis of the bargain between them.
- The limitations shall apply even if a limited remedy fails of its essential purpose.

## force_majeure | FORCE MAJEURE
# Excused Performance
- Neither Party shall be liable for any failure or delay in performance, other than an obligation to pay money,
  caused by events beyond its reasonable control, including acts of God, flood, fire, earthquake, epidemic, war,
  terrorism, labor disputes, or the acts of any Governmental Authority (each, a "Force Majeure Event").
- The affected Party shall notify the other Party promptly after the Force Majeure Event begins and shall use
  commercially reasonable efforts to mitigate its effects.
# Extended Force Majeure
- If a Force Majeure Event prevents a Party from performing a material obligation for more than {days} consecutive
  days, the other Party may terminate this Agreement upon written notice, without liability, as provided in Section
  {ref:term}.

## disputes | GOVERNING LAW AND DISPUTE RESOLUTION
# Governing Law
- This Agreement shall be governed by and construed in accordance with the laws of the State of {law_state}, without
  giving effect to any choice-of-law rule that would require the application of the laws of another jurisdiction.
- The United Nations Convention on Contracts for the International Sale of Goods shall not apply to this Agreement.
# Escalation
- The Parties shall attempt in good faith to resolve any dispute arising out of this Agreement through negotiations
  between executives with authority to settle it.
- If the dispute is not resolved within {days} days after either Party requests negotiations, either Party may
  pursue the remedies described in this Article.
# Arbitration
- Any dispute that is not resolved under Section {ref:disputes} shall be finally settled by binding arbitration
  administered by the American Arbitration Association under its Commercial Arbitration Rules.
- The arbitration shall be conducted in {law_city}, {law_state}, before a single arbitrator, and judgment on the
  award may be entered in any court of competent jurisdiction.
# Jurisdiction
- Subject to the agreement to arbitrate, each Party submits to the exclusive jurisdiction of the state and federal
  courts located in {law_city}, {law_state}, and waives any objection to venue in those courts.
- EACH PARTY IRREVOCABLY WAIVES ANY RIGHT TO TRIAL BY JURY IN ANY PROCEEDING ARISING OUT OF THIS AGREEMENT.

## governance | RELATIONSHIP MANAGEMENT
# Relationship Managers
- Each Party shall designate a relationship manager who shall be responsible for the overall relationship between the
  Parties under this Agreement.
- Each Party may replace its relationship manager upon written notice to the other Party.
# Steering Committee
- The Parties shall establish a steering committee composed of an equal number of senior representatives of each
  Party.
- The steering committee shall meet {cadence} during the first year of the Term and at least quarterly thereafter.
- The steering committee shall review the performance of the {subject}, approve material changes to any {order}, and
  attempt to resolve any dispute referred to it under Section {ref:disputes}.
# Reports
- {A} shall deliver to {B} a written report each month describing its performance of the {subject} during the
  preceding month, including any failure to meet the Specifications and the corrective actions taken.
# Continuous Improvement
- {A} shall identify opportunities to improve the quality and reduce the cost of the {subject} and shall present its
  proposals to {B} at least once in each calendar year.
- {B} shall have no obligation to accept any such proposal.

## restrictive | NON-SOLICITATION AND PUBLICITY
# Non-Solicitation
- During the Term and for one (1) year thereafter, neither Party shall solicit for employment any employee of the
  other Party who was directly involved in the performance of this Agreement.
- General solicitations of employment not directed specifically at such employees shall not violate this Section.
# Publicity
- Neither Party shall issue any press release or public announcement relating to this Agreement without the prior
  written consent of the other Party.
- {A} may identify {B} as a customer in its marketing materials, provided that it does not disclose any Confidential
  Information of {B}.
# Use of Names
- Except as permitted by Section {ref:restrictive}, neither Party shall use the name, trademarks or logos of the other
  Party without its prior written consent.

## assignment | ASSIGNMENT
# Assignment
- Neither Party may assign or transfer this Agreement, in whole or in part, without the prior written consent of the
  other Party, which shall not be unreasonably withheld.
- Notwithstanding the foregoing, either Party may assign this Agreement without consent to an Affiliate or to a
  successor in connection with a Change of Control, upon written notice to the other Party.
- Any purported assignment in violation of this Section shall be null and void.
# Successors and Assigns
- This Agreement shall be binding upon and inure to the benefit of the Parties and their respective successors and
  permitted assigns.
# Subcontracting
- {A} may subcontract any of its obligations under this Agreement, provided that {A} remains responsible for the
  performance of its subcontractors as if it had performed those obligations itself.

## notices | NOTICES
# Notices
- All notices under this Agreement shall be in writing and shall be deemed given when delivered personally, one (1)
  Business Day after deposit with a nationally recognized overnight courier, or three (3) Business Days after
  mailing by certified mail, return receipt requested, addressed as follows:
* if to {A}: {a_name}, {a_address}, Attention: General Counsel
* if to {B}: {b_name}, {b_address}, Attention: Chief Legal Officer
# Electronic Notices
- Routine operational communications may be given by electronic mail to the relationship manager of the receiving
  Party, but no notice of breach, termination or indemnification shall be effective unless given as provided in
  Section {ref:notices}.
# Change of Address
- Either Party may change its address for notices by giving notice of the new address in accordance with Section
  {ref:notices}.

## general | MISCELLANEOUS
# Entire Agreement
- This Agreement, together with its Schedules and Exhibits, constitutes the entire agreement between the Parties
  with respect to its subject matter and supersedes all prior and contemporaneous agreements, proposals and
  understandings, whether written or oral.
# Amendment and Waiver
- No amendment of this Agreement shall be effective unless it is in writing and signed by both Parties.
- No failure or delay by either Party in exercising any right shall operate as a waiver of that right.
# Severability
- If any provision of this Agreement is held invalid or unenforceable, that provision shall be enforced to the
  maximum extent permissible and the remaining provisions shall continue in full force and effect.
# Independent Contractors
- The Parties are independent contractors, and nothing in this Agreement creates a partnership, joint venture,
  agency or fiduciary relationship between them.
# Counterparts
- This Agreement may be executed in counterparts, each of which shall be deemed an original and all of which
  together shall constitute one instrument.
- Signatures delivered by electronic transmission shall be deemed original signatures.
# Further Assurances
- Each Party shall execute and deliver such further documents and take such further actions as the other Party may
  reasonably request to carry out the purposes of this Agreement.
# Third-Party Beneficiaries
- Except as provided in Section {ref:indemnification}, nothing in this Agreement confers any right or remedy on any
  Person other than the Parties and their respective successors and permitted assigns.
# Remedies Cumulative
- Except as otherwise expressly provided in this Agreement, all rights and remedies of the Parties are cumulative and
  in addition to any other rights and remedies available at law or in equity.
# Order of Precedence
- In the event of any conflict between the body of this Agreement and any Schedule or {order}, the body of this
  Agreement shall control unless the {order} expressly states that it overrides a specific Section of this
  Agreement.
"""
_CONTRACT = _parse(_CONTRACT_PHRASES)
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


def _section(filler: _Filler, heading: str, templates: list[str], number: str, kinds: Collection[str]) -> str:
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
        text += "\n\n" + _enumerate([filler.fill(item) for item in picked])
    return text


def _contract(rng: random.Random, target: int) -> tuple[str, dict]:
    deal = rng.choice(_DEALS)
    year = rng.randint(2005, _LATEST_YEAR)
    effective = _date(rng, year)
    companies = [_company(rng), _company(rng)]
    while companies[1].short == companies[0].short:
        companies[1] = _company(rng)
    states = rng.sample(_STATES, 3)
    law_state = states[2] if rng.random() < 0.4 else states[0]
    plan = _plan_articles(rng, target)
    numbers = {kind: number for number, kind in enumerate(plan, start=2)}  # Article I holds the definitions
    schedules = {"scope": "Schedule A"}
    if "payment" in plan:
        schedules["fees"] = "Schedule B"
    if rng.random() < 0.5:
        schedules["sla"] = f"Exhibit {chr(ord('A') + len(schedules))}"
    filler = _Filler(
        rng, {**_COUNTS, **_CONTRACT["contract"]},
        A=deal.a, B=deal.b, B_UPPER=deal.b.upper(), subject=deal.subject, verb=deal.verb, prep=deal.prep,
        order=deal.order, a_name=companies[0].name, b_name=companies[1].name, effective=effective,
        a_address=_address(rng, states[0]), b_address=_address(rng, states[1]),
        law_state=law_state.name, law_city=law_state.cities[0], city=rng.choice(states[0].cities),
        prior_date=_date(rng, year - 1), ref=_Lazy(lambda kind: f"{numbers[kind]}.1"),
        sched_scope=schedules["scope"], sched_fees=schedules.get("fees", f"the applicable {deal.order}"),
        sched_sla=schedules.get("sla", f"the applicable {deal.order}"),
        amount=_Lazy(lambda _: _amount(rng, 5, 7)), small_amount=_Lazy(lambda _: _amount(rng, 2, 4)),
        count=_Lazy(lambda _: str(rng.randint(2, 40))),
    )  # fmt: skip

    body = []
    for kind, headings in plan.items():
        title, sections = _ARTICLES[kind]
        body.append(f"ARTICLE {_roman(numbers[kind])}\n{title or deal.subject_title}")
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


def _contract_head(filler: _Filler, deal: _Deal, companies: list[_Company], states: list[_State], date: str) -> str:
    rng = filler.rng
    a, b = companies
    preamble = (
        f'This {deal.title} (this "Agreement") is entered into as of {date} (the "Effective Date"), by and between '
        f"{a.name}, {_article(states[0].name)} {a.entity} with its principal place of business at "
        f'{filler["a_address"]} ("{deal.a}"), and {b.name}, {_article(states[1].name)} {b.entity} with its principal '
        f'place of business at {filler["b_address"]} ("{deal.b}"). {deal.a} and {deal.b} are each referred to herein '
        'as a "Party" and together as the "Parties."'
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


def _signature_blocks(rng: random.Random, companies: list[_Company], date: str) -> str:
    blocks = [
        "IN WITNESS WHEREOF, the Parties have caused this Agreement to be executed by their duly authorized "
        "representatives as of the Effective Date."
    ]
    for company in companies:
        title = rng.choice(_CONTRACT["contract"]["signatory_title"])
        blocks.append(f"{company.name.upper()}\n\nBy: ______________________________\nName: {_person(rng)}\n"
                      f"Title: {title}\nDate: {date}")  # fmt: skip
    return "\n\n".join(blocks)


def _schedules(filler: _Filler, deal: _Deal, schedules: dict[str, str], kinds: Collection[str], budget: int) -> str:
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


def _order_document(filler: _Filler, deal: _Deal, number: int, extra_sections: list[str]) -> str:
    """One numbered ordering document (a Statement of Work, Purchase Order, ...) under the agreement: scope,
    deliverables and dated milestones, acceptance, assumptions and contacts, and a few sections drawn from
    `extra_sections`."""
    rng = filler.rng
    pools = _CONTRACT["contract"]
    date = filler["effective"]
    deliverables = rng.sample(pools["deliverable"], rng.randint(2, 6))
    month = 12 * int(date[-4:]) + _MONTHS.index(date.split()[0])
    milestones = []
    for i, deliverable in enumerate(deliverables, start=1):
        month += rng.randint(1, 3)
        due = f"{_MONTHS[month % 12]} {rng.randint(1, 28)}, {month // 12}"
        milestones.append(f"Milestone {i}: {deliverable}, due {due}, payment of {_amount(rng, 4, 6)}")
    activities = [filler.fill(a) for a in rng.sample(pools["activity"], rng.randint(3, 7))]
    assumptions = [filler.fill(a) for a in rng.sample(pools["assumption"], rng.randint(2, 4))]
    extras = sorted(rng.sample(extra_sections, rng.randint(1, min(5, len(extra_sections)))), key=extra_sections.index)
    sections = [
        filler.fill("Overview. {A} shall {verb} the {subject} described below in support of the {workstream} program "
                    "of {B}, beginning on the date of the last signature below."),
        filler.fill("Scope. {A} shall:\n") + _enumerate(activities),
        "Deliverables.\n" + "\n".join(f"D-{i} {d}" for i, d in enumerate(deliverables, start=1)),
        "Milestones and Payment.\n" + "\n".join(milestones),
        filler.fill("Acceptance. Each Deliverable shall be subject to review and acceptance by {B} in accordance with "
                    "the Agreement. {B} shall give written notice of acceptance or of any non-conformity within {days} "
                    "days after delivery."),
        *(filler.fill(extra) for extra in extras),
        "Assumptions.\n" + _enumerate(assumptions),
        "Contacts.\n" + "\n".join(f"{role}: {_person(rng)}" for role in rng.sample(pools["role"], rng.randint(2, 4))),
    ]  # fmt: skip
    intro = filler.fill(
        f'This {deal.order} No. {number} (this "{deal.order}") is entered into pursuant to the {deal.title.title()} '
        'dated {effective} between {a_name} and {b_name} (the "Agreement"). Capitalized terms used but not defined in '
        f"this {deal.order} have the meanings given to them in the Agreement."
    )
    numbered = (f"{i}. {section}" for i, section in enumerate(sections, start=1))
    return "\n\n".join([f"{deal.order.upper()} NO. {number}", intro, *numbered])


# ================================================================================================================
# Court opinions

# Groups: "opinion" (the pools every opinion draws from) and one group per topic, "name | caption style", whose
# pools (its statutes, the questions, rules, holdings, facts and arguments its reasoning is built from) take
# precedence over the generic ones. In a template, {P} is the party that sued (or the defendant of a criminal case),
# {R} the other side, {cite} a citation and {string_cite} several.
_OPINION_PHRASES = """
## opinion
# analysis
- We have long recognized that {rule}. {cite}.
- It is well established that {rule}. {cite}.
- Our precedents make clear that {rule}. {cite}.
- "{Rule}." {cite}.
- That principle follows from the settled rule that {rule}. {cite}.
- {P} contends that {p_arg}. We disagree.
- {R} responds that {r_arg}. {cite}.
- The text of {statute} points the same way.
- Nothing in {statute} suggests otherwise, and we decline to read into the statute a limitation that its text does
  not contain.
- The record leaves little doubt on that score: {fact}.
- Applying that standard here, we conclude that {holding}.
- To be sure, {rule}. {cite}. But that observation does not resolve the question presented.
- Courts have applied this principle in a variety of settings. {string_cite}.
- This conclusion accords with the decisions of other courts that have considered the question. {string_cite}.
- We review conclusions of law de novo. {cite}.
- The same is true here.
- That is precisely what happened in this case: {fact}.
- Reading the provision as {P} urges would render other parts of {statute} superfluous. {cite}.
- Because {fact}, the {lower} did not err in concluding that {holding}.
- {P} relies heavily on the contrary view, but {rule}. {cite}.
- The argument proves too much. {cite}.
- Indeed, we have cautioned that {rule}. {cite}.
- {R} does not dispute that {fact}.
- Neither party disputes that {rule}. {cite}.
- The {lower} reasoned that {holding}. {cite}.
- The question, then, is {question}.
- We think the better reading is the one the {lower} adopted.
- That reading also accords with the structure of the statute as a whole.
- {R} offers no persuasive reason to depart from that rule here.
- We see no basis for a different result on this record.
- The remaining arguments of {P} do not alter our analysis.
- Several considerations support that conclusion.
- The text of {statute} does not support the reading that {P} proposes.
- The practical consequences of the position {P} takes confirm that it is mistaken.
- It follows that {holding}.
- {P} argues in the alternative that {p_arg}. That argument fails for the same reasons.
- Nor are we persuaded by the contention that {r_arg}.
- The {lower} correctly recognized as much.
- {P} does not seriously contest the point, and we therefore treat it as settled for purposes of this appeal.
# canon
- Statutory interpretation begins with the text, and where the text is clear, it ends there as well. {cite}.
- We must give effect, if possible, to every clause and word of a statute. {cite}.
- Summary judgment is appropriate only where there is no genuine dispute as to any material fact and the movant is
  entitled to judgment as a matter of law. {cite}.
- On a motion to dismiss, we accept the well-pleaded factual allegations of the complaint as true and draw all
  reasonable inferences in favor of the plaintiff. {cite}.
- A party forfeits an argument that it fails to raise in its opening brief. {cite}.
- We may affirm on any ground supported by the record, even one the {lower} did not reach. {cite}.
- Stare decisis carries enhanced force when a decision interprets a statute, because the legislature remains free to
  alter what we have done. {cite}.
- Where the words of a statute are unambiguous, the judicial inquiry is complete. {cite}.
- A court should not read a provision in isolation, but in light of the statutory scheme as a whole. {cite}.
- We ordinarily decline to consider arguments raised for the first time on appeal. {cite}.
- The burden of persuasion rests on the party seeking relief. {cite}.
- Findings of fact are reviewed for clear error, and conclusions of law are reviewed de novo. {cite}.
# claim
- {P} brought this action against {R} under {statute}
# procedure
- The {lower} {lower_ruling}. {cite}.
- {R} timely appealed.
- The parties agree that the question presented is one of law. {cite}.
- The issue on appeal is {question}.
- Other courts have divided on {question}. {string_cite}.
# lower_ruling
- granted summary judgment in favor of {R}
- denied the motion to dismiss
- entered judgment on the jury's verdict
- dismissed the complaint for failure to state a claim
- reversed the judgment of the trial court
# dissent
- The majority holds that {holding}. Because that conclusion cannot be squared with {statute} or with our
  precedents, I respectfully dissent.
- The majority's approach would unsettle a body of law on which litigants have long relied. {cite}.
- The majority reads {statute} as though {rule} were the only principle at stake. It is not. {cite}.
- I would instead hold that the {lower} correctly applied the governing standard. {cite}.
- The record does not support the majority's account: {fact}.

## arbitration | mixed
# statute
- 9 U.S.C. § 2
- 9 U.S.C. § 3
- 9 U.S.C. § 4
- 9 U.S.C. § 10(a)(4)
# question
- whether a court or an arbitrator decides if the parties' dispute falls within their agreement to arbitrate
- whether a party waives its right to arbitrate by litigating the dispute in court
# rule
- arbitration is a matter of contract, and a party cannot be required to submit to arbitration any dispute which it
  has not agreed so to submit
- courts must place arbitration agreements on an equal footing with other contracts and enforce them according to
  their terms
- any doubts concerning the scope of arbitrable issues should be resolved in favor of arbitration
- parties may delegate threshold questions of arbitrability to the arbitrator, so long as the delegation is clear
  and unmistakable
- a court may not override the contract by deciding a question the parties have committed to the arbitrator
- generally applicable contract defenses, such as fraud, duress, or unconscionability, may invalidate an arbitration
  agreement
- a party seeking to vacate an award must show more than that the arbitrator committed an error, or even a serious
  error
# holding
- the delegation clause in the parties' agreement must be enforced according to its terms
- the {lower} erred in deciding the question of arbitrability itself
- {R} did not waive its right to arbitrate by defending the collection action
# fact
- {P} and {R} entered into a written distribution agreement in {fact_year}
- the agreement provided that any dispute arising under or relating to it would be resolved by binding arbitration
- {P} filed suit in federal court, alleging breach of contract and seeking {amount} in damages
- {R} moved to compel arbitration under {statute}
- the arbitration clause incorporated the rules of the American Arbitration Association
# p_arg
- the dispute falls outside the scope of the arbitration clause
- the arbitration agreement is unconscionable and therefore unenforceable
# r_arg
- the parties clearly and unmistakably delegated questions of arbitrability to the arbitrator
- the {lower} improperly resolved the merits of the dispute under the guise of interpreting the contract

## civil rights | municipal
# statute
- 42 U.S.C. § 1983
- 42 U.S.C. § 1988(b)
- 28 U.S.C. § 1331
- 28 U.S.C. § 1291
# question
- whether the officers are entitled to qualified immunity
- whether the municipality may be held liable for the officers' conduct
# rule
- qualified immunity shields government officials from liability for civil damages unless their conduct violates
  clearly established statutory or constitutional rights of which a reasonable person would have known
- a right is clearly established only when its contours are sufficiently clear that every reasonable official would
  have understood that what he is doing violates that right
- courts may not define clearly established law at a high level of generality
- an officer's use of force is judged from the perspective of a reasonable officer on the scene, rather than with
  the vision of hindsight
- a plaintiff need not identify a case directly on point, but existing precedent must have placed the constitutional
  question beyond debate
- a municipality may not be held liable solely because it employs a tortfeasor
- the denial of qualified immunity is immediately appealable to the extent it turns on an issue of law
# holding
- the officers are entitled to qualified immunity because no clearly established law prohibited their conduct
- {P} has alleged facts sufficient to state a claim under {statute}
- the {lower} erred in denying the motion for summary judgment
# fact
- officers of the {town} Police Department responded to a report of a disturbance at the residence of {P} on
  {fact_date}
- {P} alleges that the officers entered the home without a warrant
- the encounter lasted less than ten minutes and was partially recorded by a body-worn camera
- {P} sued the officers and the City of {town} under {statute}, alleging excessive force and unlawful entry
# p_arg
- the officers' conduct violated clearly established law
- the city's training policies were the moving force behind the violation
# r_arg
- no precedent placed the lawfulness of the entry beyond debate
- the officers reasonably believed that an emergency required immediate entry

## securities | company
# statute
- 15 U.S.C. § 78j(b)
- 15 U.S.C. § 78u-4(b)(2)(A)
- 17 C.F.R. § 240.10b-5
- 15 U.S.C. § 78t(a)
# question
- whether the complaint adequately pleads scienter
- whether the challenged statements were materially misleading
# rule
- a securities fraud plaintiff must allege a material misrepresentation or omission, scienter, a connection with the
  purchase or sale of a security, reliance, economic loss, and loss causation
- a complaint must state with particularity facts giving rise to a strong inference that the defendant acted with
  the required state of mind
- an inference of scienter must be cogent and at least as compelling as any opposing inference
- an omitted fact is material if there is a substantial likelihood that a reasonable shareholder would consider it
  important
- statements of opinion are not actionable merely because they turn out to be wrong
- loss causation requires a plaintiff to show that the misrepresentation caused the economic loss
# holding
- the complaint adequately pleads a strong inference of scienter
- the challenged statements were inactionable expressions of corporate optimism
- {P} failed to plead loss causation with the required particularity
# fact
- {R} announced in {fact_year} that it expected revenue to grow by more than twenty percent
- the price of {R} stock fell by nearly forty percent in a single trading day after the company disclosed an
  accounting restatement
- {P}, a pension fund, purchased shares of {R} during the class period
- several senior executives of {R} sold shares shortly before the corrective disclosure
# p_arg
- the executives' stock sales support a strong inference of scienter
- the revenue projections were false when made
# r_arg
- the projections were accompanied by meaningful cautionary language
- the stock sales were made under preexisting trading plans

## employment | person
# statute
- 42 U.S.C. § 2000e-2(a)(1)
- 42 U.S.C. § 2000e-3(a)
- 42 U.S.C. § 2000e-5(e)(1)
- 29 U.S.C. § 623(a)(1)
# question
- whether the employee presented sufficient evidence of pretext to survive summary judgment
- whether the charge of discrimination was timely filed
# rule
- a plaintiff may establish a prima facie case of discrimination by showing membership in a protected class,
  qualification for the position, an adverse employment action, and less favorable treatment than similarly situated
  employees
- once the plaintiff establishes a prima facie case, the burden shifts to the employer to articulate a legitimate,
  nondiscriminatory reason for its action
- a plaintiff may prove pretext by showing that the employer's stated reason is unworthy of credence
- a retaliation claim requires proof that the desire to retaliate was the but-for cause of the challenged employment
  action
- the timely filing of a charge with the Equal Employment Opportunity Commission is a prerequisite to suit
- an employer is liable for a hostile work environment when the harassment is sufficiently severe or pervasive to
  alter the conditions of employment
# holding
- {P} presented sufficient evidence of pretext to survive summary judgment
- temporal proximity between the complaint and the termination, standing alone, does not establish causation
- the charge was timely filed
# fact
- {P} worked as a regional sales manager for {R} for eleven years
- in {fact_year}, {R} eliminated the position held by {P} as part of a reorganization
- {P} had complained to the human resources department about comments made by a supervisor
- {P} filed a charge of discrimination with the Equal Employment Opportunity Commission and received a right-to-sue
  letter
# p_arg
- the reorganization was a pretext for discrimination
- the supervisor's comments reveal a discriminatory motive
# r_arg
- the position was eliminated for legitimate budgetary reasons
- the decisionmaker was unaware of the complaint

## jurisdiction | mixed
# statute
- 28 U.S.C. § 1332(a)
- 28 U.S.C. § 1391(b)
- 28 U.S.C. § 1404(a)
- 28 U.S.C. § 1291
# question
- whether the forum court may exercise specific personal jurisdiction over a nonresident manufacturer
- whether the defendant purposefully availed itself of the privilege of conducting business in the forum
# rule
- a court may exercise specific jurisdiction over a nonresident defendant only when the suit arises out of or
  relates to the defendant's contacts with the forum
- the defendant must have purposefully availed itself of the privilege of conducting activities within the forum
  State
- the unilateral activity of a plaintiff cannot satisfy the requirement of contact with the forum State
- a corporation is subject to general jurisdiction where it is incorporated and where it has its principal place of
  business
- the exercise of jurisdiction must comport with traditional notions of fair play and substantial justice
- the plaintiff bears the burden of establishing that jurisdiction is proper
# holding
- the exercise of specific jurisdiction over {R} is consistent with due process
- {R} did not purposefully avail itself of the forum
- the {lower} properly dismissed the complaint for lack of personal jurisdiction
# fact
- {R}, a corporation organized under the laws of {other_state}, sold its products through a network of independent
  distributors
- {P} purchased the product from a retailer in {city}
- {R} maintains no offices, employees, or bank accounts in the forum
- {R} moved to dismiss for lack of personal jurisdiction
# p_arg
- {R} targeted the forum market through its national advertising
- the distributor's sales in the forum should be attributed to {R}
# r_arg
- its contacts with the forum are random, fortuitous, and attenuated
- the claims do not arise out of any activity it directed at the forum

## contracts | company
# statute
- U.C.C. § 2-201
- U.C.C. § 2-207(2)
- U.C.C. § 2-725(1)
- Restatement (Second) of Contracts § 205
# question
- whether the limitation of liability clause bars recovery of lost profits
- whether the contract's minimum purchase requirement is ambiguous
# rule
- the fundamental goal of contract interpretation is to give effect to the mutual intention of the parties
- where the language of a contract is clear and unambiguous, the court must enforce it as written
- every contract imposes upon each party a duty of good faith and fair dealing in its performance and its
  enforcement
- the implied covenant cannot create obligations inconsistent with the express terms of the contract
- extrinsic evidence is admissible to explain an ambiguity but not to vary the plain terms of an integrated writing
- a limitation of liability clause is enforceable unless it is unconscionable or contrary to public policy
- damages for breach of contract place the nonbreaching party in the position it would have occupied had the
  contract been performed
# holding
- the limitation of liability clause bars the recovery of lost profits
- the minimum purchase requirement is unambiguous and {R} breached it
- the {lower} properly admitted extrinsic evidence to resolve the ambiguity
# fact
- {P} and {R} entered into a five-year supply agreement in {fact_year}
- the agreement required {R} to purchase minimum quantities of product each quarter
- {R} stopped placing orders after the second year, citing a decline in demand
- {P} sued for breach of contract, seeking {amount} in lost profits
- the agreement contained a clause excluding liability for consequential damages
# p_arg
- lost profits are direct damages that fall outside the exclusion
- the course of dealing between the parties modified the written terms
# r_arg
- the exclusion unambiguously covers lost profits
- the integration clause bars evidence of any prior understanding

## criminal procedure | criminal
# statute
- 18 U.S.C. § 922(g)(1)
- 21 U.S.C. § 841(a)(1)
- 18 U.S.C. § 3231
- 18 U.S.C. § 3742(a)
# question
- whether the traffic stop was unlawfully prolonged
- whether the good-faith exception to the exclusionary rule applies
# rule
- searches conducted outside the judicial process, without prior approval by a judge or magistrate, are per se
  unreasonable, subject only to a few specifically established exceptions
- an officer may conduct a brief investigatory stop when the officer has reasonable, articulable suspicion that
  criminal activity is afoot
- probable cause exists where the known facts and circumstances would warrant a person of reasonable prudence in the
  belief that contraband or evidence of a crime will be found
- the exclusionary rule does not apply when officers act in objectively reasonable reliance on a warrant later held
  invalid
- a traffic stop may last no longer than is necessary to address the infraction that justified it
- the touchstone of the Fourth Amendment is reasonableness
# holding
- the stop was not unlawfully prolonged, and the motion to suppress was properly denied
- the officers lacked reasonable suspicion to extend the stop, and the evidence must be suppressed
- the good-faith exception applies to the search of the vehicle
# fact
- officers stopped the vehicle {P} was driving on {fact_date} for a broken taillight
- a trained narcotics dog alerted to the trunk of the car
- the search uncovered a loaded handgun and approximately two kilograms of cocaine
- {P} moved to suppress the evidence, arguing that the stop was unlawfully prolonged
- a grand jury indicted {P} on one count of violating {statute}
# claim
- {R} charged {P} with violating {statute}
# p_arg
- the officers extended the stop without reasonable suspicion
- the warrant was so lacking in probable cause that no reasonable officer could have relied on it
# r_arg
- the dog sniff was completed within the time reasonably required to issue the citation
- the officers relied in good faith on the warrant
"""
_OPINION = _parse(_OPINION_PHRASES)
_TOPICS = {key.split(" | ")[0]: (key.split(" | ")[1], pools) for key, pools in _OPINION.items() if key != "opinion"}


@dataclass(frozen=True)
class _Parties:
    """The two sides of a case caption, in caption order, and the names used for them after the caption."""

    first: str
    second: str
    short: str  # the name short citations use: "Okafor, 123 F.3d at 460"
    actor: str  # in an opinion's text, the party that sued, or the defendant of a criminal case
    other: str  # the opposing party

    @property
    def name(self) -> str:
        return f"{self.first} v. {self.second}"


def _parties(rng: random.Random, style: str, prosecutor: str = "United States") -> _Parties:
    """A caption of the given style: company | person | mixed (a person or a company against a company) | municipal
    | criminal. A criminal case is "<prosecutor> v. <defendant>", and its short name is the defendant's, as the
    Bluebook has it."""
    last_names = _WORDS["last"]
    if style == "criminal":
        defendant = rng.choice(last_names)
        government = "the Government" if prosecutor == "United States" else f"the {prosecutor}"
        return _Parties(prosecutor, defendant, defendant, defendant, government)
    if style == "municipal":
        person = rng.choice(last_names)
        return _Parties(person, f"City of {rng.choice(_WORDS['town'])}", person, person, "the City")
    second = _company(rng)
    if style == "person" or (style == "mixed" and rng.random() < 0.5):
        person = rng.choice(last_names)
        return _Parties(person, second.name, person, person, second.short)
    first = _company(rng)
    while first.short == second.short:
        first = _company(rng)
    return _Parties(first.name, second.name, first.short, first.short, second.short)


@dataclass(frozen=True)
class _Case:
    name: str
    short: str  # the name its short forms use
    cites: tuple[tuple[int, str, int], ...]  # (volume, edition, first page); parallel citations follow the first
    year: int
    court: str  # court abbreviation of the parenthetical; "" when the reporter implies the court


# Kind of the citing court -> how likely it cites each kind of court.
_CITED_COURTS = {
    "scotus": {"scotus": 0.75, "circuit": 0.2, "state": 0.05},
    "circuit": {"scotus": 0.4, "circuit": 0.45, "district": 0.1, "state": 0.05},
    "district": {"scotus": 0.3, "circuit": 0.4, "district": 0.3},
    "state": {"scotus": 0.25, "state": 0.65, "circuit": 0.1},
}


class _Citations:
    """Writes the case citations of one opinion: a full citation the first time a case is cited, then Id., short
    cites and supra that refer back to it. Every full citation is recorded for the document's metadata."""

    def __init__(
        self,
        rng: random.Random,
        court: str,
        year: int,
        state: _State,
        circuit: str,
        explain: Callable[[], str],
        taken: set[tuple[int, str, int]],
    ) -> None:
        self.rng = rng
        self.taken = taken  # every (volume, edition, page) of the corpus so far; each names one case, added here
        self.court = court  # kind of the citing court: scotus | circuit | district | state
        self.year = year  # no cited decision is later than the opinion
        self.state = state  # the home state, cited most by a state court
        self.circuit = circuit  # the home circuit, cited most by a circuit court
        self.explain = explain  # draws a proposition for an explanatory parenthetical
        self.cases: list[_Case] = []
        self.last: _Case | None = None  # the case "Id." refers to; None right after a string cite
        self.full: list[dict] = []
        self.counts = {"id": 0, "short": 0, "supra": 0}

    def cite(self, _: str = "") -> str:
        draw = self.rng.random()
        if self.last is not None and draw < 0.3:
            return self._id()
        earlier = [c for c in self.cases if c is not self.last]
        if earlier and draw < 0.65:
            return self._signal() + self._short(self.rng.choice(earlier))
        return self._signal() + self._full(self._new_case())

    def string_cite(self, _: str = "") -> str:
        parts = [self._full(self._new_case()) for _ in range(self.rng.randint(2, 3))]
        self.last = None  # "Id." after a string cite would be ambiguous
        return self.rng.choice(("See, e.g., ", "See ", "")) + "; ".join(parts)

    def _signal(self) -> str:
        return self.rng.choice(("", "", "", "See ", "See also ", "Cf. ", "See generally "))

    def _pin(self, case: _Case) -> int:
        return case.cites[0][2] + self.rng.randint(1, 40)

    def _id(self) -> str:
        self.counts["id"] += 1
        draw = self.rng.random()
        if draw < 0.25:
            return "Id."
        return f"{'See id.' if draw < 0.45 else 'Id.'} at {self._pin(self.last)}"

    def _short(self, case: _Case) -> str:
        self.last = case
        volume, edition, _ = case.cites[0]
        if self.rng.random() < 0.3:
            self.counts["supra"] += 1
            return f"{case.short}, supra, at {self._pin(case)}"
        self.counts["short"] += 1
        return f"{case.short}, {volume} {edition} at {self._pin(case)}"

    def _full(self, case: _Case) -> str:
        self.last = case
        pin = self._pin(case) if self.rng.random() < 0.7 else None
        cites = [f"{v} {e} {p}" for v, e, p in case.cites]
        if pin is not None:
            cites[0] += f", {pin}"
        paren = f"({case.court} {case.year})" if case.court else f"({case.year})"
        if self.rng.random() < 0.2:
            paren += f" ({self.rng.choice(('holding', 'explaining', 'noting'))} that {self.explain()})"
        for i, (volume, edition, page) in enumerate(case.cites):
            self.full.append({"case_name": case.name, "volume": volume, "reporter": edition, "page": page,
                              "pin": pin if i == 0 else None, "year": case.year, "court": case.court})  # fmt: skip
        return f"{case.name}, {', '.join(cites)} {paren}"

    def _new_case(self) -> _Case:
        weights = _CITED_COURTS[self.court]
        make = {"scotus": self._scotus, "circuit": self._circuit, "district": self._district, "state": self._state}
        kind = self.rng.choices(tuple(weights), tuple(weights.values()))[0]
        case = make[kind]()
        # Short forms must be unambiguous in the opinion, and a cite held by another case would make it name two.
        while any(c.short == case.short for c in self.cases) or not self.taken.isdisjoint(case.cites):
            case = make[kind]()
        self.taken.update(case.cites)
        self.cases.append(case)
        return case

    def _year(self, first: int) -> int:
        """A year from `first` to the opinion's year, biased toward recent decisions as real opinions are."""
        return self.year - int((self.year - first) * self.rng.random() ** 3)

    def _parties(self, prosecutor: str = "United States") -> _Parties:
        style = self.rng.choice(("company", "company", "mixed", "mixed", "criminal", "municipal"))
        return _parties(self.rng, style, prosecutor)

    def _scotus(self) -> _Case:
        rng = self.rng
        year = self._year(1900)
        cites = [(_volume(rng, "U.S.", year), "U.S.", rng.randint(1, 1200))]
        if year >= 1960 and rng.random() < 0.3:
            cites += [(_volume(rng, e, year), e, rng.randint(1, 3000)) for e in ("S. Ct.", "L. Ed. 2d")]
        parties = self._parties()
        return _Case(parties.name, parties.short, tuple(cites), year, "")

    def _circuit(self) -> _Case:
        rng = self.rng
        year = self._year(1950)
        circuits = _CIRCUITS if year >= 1982 else _CIRCUITS[:11]
        circuit = self.circuit if rng.random() < 0.5 and year >= 1982 else rng.choice(circuits)[1]
        edition = _edition_for(rng, ("F.2d", "F.3d", "F.4th"), year)
        parties = self._parties()
        cite = (_volume(rng, edition, year), edition, rng.randint(1, 1400))
        return _Case(parties.name, parties.short, (cite,), year, f"{circuit} Cir.")

    def _district(self) -> _Case:
        rng = self.rng
        year = self._year(1960)
        edition = _edition_for(rng, ("F. Supp.", "F. Supp. 2d", "F. Supp. 3d"), year)
        parties = self._parties()
        cite = (_volume(rng, edition, year), edition, rng.randint(1, 1600))
        return _Case(parties.name, parties.short, (cite,), year, rng.choice(_DISTRICTS)[1])

    def _state(self) -> _Case:
        rng = self.rng
        state = self.state if rng.random() < 0.7 else rng.choice(_STATES)
        year = self._year(1950)
        parties = self._parties(state.prosecutor)
        official = _edition_for(rng, state.official, year) if rng.random() < 0.6 else None
        if official is not None:
            cite = (_volume(rng, official, year), official, rng.randint(1, 1200))
            return _Case(parties.name, parties.short, (cite,), year, "")
        edition = _edition_for(rng, state.regional, year)
        court = state.appellate if state.appellate and rng.random() < 0.3 else state.abbr
        cite = (_volume(rng, edition, year), edition, rng.randint(1, 1400))
        return _Case(parties.name, parties.short, (cite,), year, court)


@dataclass(frozen=True)
class _Court:
    kind: str  # scotus | circuit | district | state
    caption: str  # the court's name as printed at the top of the opinion
    lower: str  # the court whose decision is reviewed, as the opinion calls it
    author: str  # the line that introduces the opinion
    dissent: str  # the line that introduces a dissent; "" = this court has none
    ending: str


def _court(rng: random.Random, kind: str, state: _State, circuit: str) -> _Court:
    judges = [name.upper() for name in rng.sample(_WORDS["last"], 3)]
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
        district = rng.choice(_DISTRICTS)[0].upper()
        return _Court(
            kind,
            f"UNITED STATES DISTRICT COURT FOR THE {district}",
            "magistrate judge",
            f"{_person(rng).upper()}, United States District Judge.",
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


def _caption(parties: _Parties, kind: str, criminal: bool) -> tuple[str, str]:
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


def _opinion(rng: random.Random, target: int, taken: set[tuple[int, str, int]]) -> tuple[str, dict]:
    """An opinion of about `target` characters whose new cases take cites that are not in `taken` (and add them)."""
    topic = rng.choice(tuple(_TOPICS))
    style, topic_pools = _TOPICS[topic]
    kind = rng.choices(("scotus", "circuit", "district", "state"), (0.3, 0.3, 0.2, 0.2))[0]
    state = rng.choice(_STATES)
    circuit = rng.choice(_CIRCUITS)
    court = _court(rng, kind, state, circuit[0])
    year = rng.randint(1995, 2023)
    decided = _date(rng, year)
    parties = _parties(rng, style, state.prosecutor if kind == "state" else "United States")
    statutes: list[str] = []

    def statute(_: str) -> str:
        statutes.append(rng.choice(topic_pools["statute"]))
        return statutes[-1]

    filler = _Filler(
        rng, {**_COUNTS, **_OPINION["opinion"], **topic_pools},
        P=parties.actor, R=parties.other, lower=court.lower, statute=_Lazy(statute),
        town=rng.choice(_WORDS["town"]), city=rng.choice(state.cities), other_state=rng.choice(_STATES).name,
        fact_year=str(year - rng.randint(2, 6)), fact_date=_date(rng, year - rng.randint(2, 6)),
        amount=_amount(rng, 5, 8),
    )  # fmt: skip
    citations = _Citations(rng, kind, year, state, circuit[1], lambda: filler.fill("{rule}"), taken)
    filler["cite"] = _Lazy(citations.cite)
    filler["string_cite"] = _Lazy(citations.string_cite)

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


def _facts(filler: _Filler, low: int, high: int) -> list[str]:
    """From `low` to `high` different facts of the case, in the order the topic tells them."""
    pool = filler.pools["fact"]
    picked = sorted(filler.rng.sample(range(len(pool)), filler.rng.randint(low, min(high, len(pool)))))
    return [filler.fill(pool[i]) for i in picked]


def _paragraph(filler: _Filler, pools: tuple[str, ...], sentences: int = 0) -> str:
    """A paragraph of `sentences` (default 3 to 7) different sentences drawn from the named pools."""
    rng = filler.rng
    templates = [t for name in pools for t in filler.pools[name]]
    count = min(len(templates), sentences or rng.randint(3, 7))
    return " ".join(filler.sentence(t) for t in rng.sample(templates, count))


def _majority(filler: _Filler, court: _Court, budget: float, used: int) -> str:
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
        part = [_roman(number)]
        letters = rng.randint(2, 4) if budget > 30_000 else 1
        for letter in range(letters):
            if letters > 1:
                part.append(chr(ord("A") + letter))
            paragraphs = rng.randint(2, 3 + int(budget) // 25_000)
            part += [_paragraph(filler, ("analysis", "canon")) for _ in range(paragraphs)]
        blocks += part
        size += sum(len(b) + 2 for b in part)
        number += 1
    blocks += [_roman(number), filler.sentence("For the foregoing reasons, we conclude that {holding}."), court.ending]
    return "\n\n".join(blocks)


# ================================================================================================================


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
        text, meta = _contract(rng, target) if kind == "contract" else _opinion(rng, target, cited)
        meta["target_chars"] = target
        record = {"id": f"synthetic-{seed}-{index:05d}", "text": text, "source": "synthetic", "kind": kind}
        documents.append({**record, "meta": meta})
    return documents
