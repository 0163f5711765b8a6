"""The commit a measurement names: the override, the clean HEAD, and a HEAD whose code was edited."""

from __future__ import annotations

from legalpt import provenance


def test_the_environment_names_the_commit_on_machines_without_git(monkeypatch):
    monkeypatch.setenv("LEGALPT_COMMIT", "abc1234")
    assert provenance.commit() == "abc1234"


def test_edited_code_marks_the_commit_dirty(monkeypatch):
    monkeypatch.delenv("LEGALPT_COMMIT", raising=False)
    answers = {"rev-parse": "abc1234", "status": ""}
    monkeypatch.setattr(provenance, "_git", lambda *args: answers[args[0]])
    assert provenance.commit() == "abc1234"
    answers["status"] = " M legalpt/attention/fa2.py\n?? legalpt/data/stream.py"
    assert provenance.commit() == "abc1234-dirty"
    answers["rev-parse"] = ""  # not a git checkout
    assert provenance.commit() == "unknown"
