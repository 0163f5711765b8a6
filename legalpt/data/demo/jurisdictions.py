"""Jurisdictions shared by both kinds of demo document: states (incorporation, governing law, state courts and their
reporters), federal circuits and federal districts."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class State:
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


STATES = (
    State("California", "Cal.", "CA", ("Los Angeles", "San Francisco", "Sacramento"), ("P.2d", "P.3d"),
          ("Cal. 2d", "Cal. 3d", "Cal. 4th"), prosecutor="People"),
    State("New York", "N.Y.", "NY", ("New York", "Albany", "Buffalo"), ("N.E.2d", "N.E.3d"), ("N.Y.2d", "N.Y.3d"),
          high_court="Court of Appeals of New York", prosecutor="People"),
    State("Delaware", "Del.", "DE", ("Wilmington", "Dover", "Newark"), ("A.2d", "A.3d")),
    State("Texas", "Tex.", "TX", ("Houston", "Austin", "Dallas"), ("S.W.2d", "S.W.3d"), appellate="Tex. App."),
    State("Illinois", "Ill.", "IL", ("Chicago", "Springfield", "Naperville"), ("N.E.2d", "N.E.3d"), ("Ill. 2d",),
          appellate="Ill. App. Ct.", prosecutor="People"),
    State("Massachusetts", "Mass.", "MA", ("Boston", "Cambridge", "Worcester"), ("N.E.2d", "N.E.3d"), ("Mass.",),
          high_court="Supreme Judicial Court of Massachusetts", appellate="Mass. App. Ct.",
          prosecutor="Commonwealth"),
    State("Florida", "Fla.", "FL", ("Miami", "Tampa", "Orlando"), ("So. 2d", "So. 3d"),
          appellate="Fla. Dist. Ct. App."),
    State("Pennsylvania", "Pa.", "PA", ("Philadelphia", "Pittsburgh", "Harrisburg"), ("A.2d", "A.3d"),
          appellate="Pa. Super. Ct.", prosecutor="Commonwealth"),
    State("Washington", "Wash.", "WA", ("Seattle", "Spokane", "Tacoma"), ("P.2d", "P.3d"),
          appellate="Wash. Ct. App."),
    State("Georgia", "Ga.", "GA", ("Atlanta", "Savannah", "Augusta"), ("S.E.2d",), appellate="Ga. Ct. App."),
    State("Minnesota", "Minn.", "MN", ("Minneapolis", "Saint Paul", "Duluth"), ("N.W.2d",),
          appellate="Minn. Ct. App."),
    State("Colorado", "Colo.", "CO", ("Denver", "Boulder", "Fort Collins"), ("P.2d", "P.3d"), appellate="Colo. App."),
    State("Ohio", "Ohio", "OH", ("Columbus", "Cleveland", "Cincinnati"), ("N.E.2d", "N.E.3d"),
          appellate="Ohio Ct. App."),
    State("New Jersey", "N.J.", "NJ", ("Newark", "Princeton", "Trenton"), ("A.2d", "A.3d")),
    State("North Carolina", "N.C.", "NC", ("Charlotte", "Raleigh", "Durham"), ("S.E.2d",),
          appellate="N.C. Ct. App."),
    State("Michigan", "Mich.", "MI", ("Detroit", "Lansing", "Grand Rapids"), ("N.W.2d",),
          appellate="Mich. Ct. App.", prosecutor="People"),
)  # fmt: skip
# (ordinal used in court names, abbreviation in parentheticals); the Eleventh and Federal Circuits date from 1981-82
CIRCUITS = (
    ("First", "1st"), ("Second", "2d"), ("Third", "3d"), ("Fourth", "4th"), ("Fifth", "5th"), ("Sixth", "6th"),
    ("Seventh", "7th"), ("Eighth", "8th"), ("Ninth", "9th"), ("Tenth", "10th"), ("District of Columbia", "D.C."),
    ("Eleventh", "11th"), ("Federal", "Fed."),
)  # fmt: skip
DISTRICTS = (
    ("Southern District of New York", "S.D.N.Y."), ("Eastern District of New York", "E.D.N.Y."),
    ("Northern District of California", "N.D. Cal."), ("Central District of California", "C.D. Cal."),
    ("District of Massachusetts", "D. Mass."), ("Northern District of Illinois", "N.D. Ill."),
    ("Eastern District of Pennsylvania", "E.D. Pa."), ("District of Delaware", "D. Del."),
    ("Southern District of Texas", "S.D. Tex."), ("District of New Jersey", "D.N.J."),
    ("Western District of Washington", "W.D. Wash."), ("District of Colorado", "D. Colo."),
)  # fmt: skip
