"""Reading local files: every format, CAP case JSON, compressed variants, skip accounting, the line cap, real
samples."""

import csv
import gzip
import io
import json
import os
import random
import resource
from pathlib import Path

import docx
import pyarrow as pa
import pyarrow.parquet as pq
import pypdf
import pytest
import zstandard
from data_helpers import load, random_text

from legalpt.data import readers
from legalpt.data.readers.rows import SkipReport

SHARED_DATA = Path(__file__).resolve().parents[3] / "shared" / "data"


def make_pdf(pages: list[str]) -> bytes:
    """A minimal PDF written by hand: one Helvetica line of text per page, with a correct cross-reference table."""
    objects = ["<< /Type /Catalog /Pages 2 0 R >>", "", "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"]
    kids = []
    for text in pages:
        stream = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET"
        objects.append(f"<< /Length {len(stream)} >>\nstream\n{stream}\nendstream")
        resources = "<< /Font << /F1 3 0 R >> >>"
        contents = len(objects)
        objects.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources {resources} /Contents {contents} 0 R >>"
        )
        kids.append(f"{len(objects)} 0 R")
    objects[1] = f"<< /Type /Pages /Kids [{' '.join(kids)}] /Count {len(kids)} >>"
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n{body}\nendobj\n".encode()
    table = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += "".join(f"{offset:010d} 00000 n \n" for offset in offsets).encode()
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{table}\n%%EOF\n".encode()
    return bytes(out)


def blank_pdf(password: str | None = None) -> bytes:
    writer = pypdf.PdfWriter()
    writer.add_blank_page(width=200, height=200)
    if password:
        writer.encrypt(password, algorithm="RC4-128")  # RC4 needs no optional crypto package
    buffer = io.BytesIO()
    writer.write(buffer)
    return buffer.getvalue()


def cap_case(rng: random.Random, case_id: int, opinions: int = 2, head: bool = True) -> dict:
    data = {
        "attorneys": ["Counsel for appellant"],
        "opinions": [{"type": t, "author": "J.", "text": random_text(rng)} for t in ["majority", "dissent"][:opinions]],
    }
    if head:
        data["head_matter"] = random_text(rng)
    return {
        "id": case_id,
        "name_abbreviation": f"Smith v. Jones {case_id}",
        "decision_date": "1991-03-27",
        "citations": [{"type": "official", "cite": f"{case_id} U.S. 340"}],
        "court": {"name": "Supreme Court of the United States"},
        "casebody": {"status": "ok", "data": data},
    }


def cap_text(case: dict) -> str:
    data = case["casebody"]["data"]
    parts = [data["head_matter"]] if "head_matter" in data else []
    return "\n\n".join(parts + [op["text"] for op in data["opinions"]])


def test_each_plain_format(tmp_path, rng):
    texts = [random_text(rng) for _ in range(9)]
    (tmp_path / "a.txt").write_text(texts[0], encoding="utf-8")
    (tmp_path / "b.jsonl").write_text(
        "\n".join(json.dumps({"id": f"b{i}", "text": t, "court": "x"}) for i, t in enumerate(texts[1:3])) + "\n\n"
    )
    (tmp_path / "c.json").write_text(json.dumps([{"text": texts[3]}, {"text": texts[4], "kind": "contract"}]))
    (tmp_path / "d.json").write_text(json.dumps({"text": texts[5]}))
    pq.write_table(pa.table({"text": [texts[6]], "year": [1999]}), tmp_path / "e.parquet")
    (tmp_path / "f.json").write_text("\n".join(json.dumps({"text": t}) for t in texts[7:]))  # JSON Lines, named .json

    documents, report = load(tmp_path, tmp_path / "*.*")
    assert report.total == 0 and str(report) == "nothing skipped"
    assert [d["text"] for d in documents] == texts
    by_text = {d["text"]: d for d in documents}
    assert by_text[texts[0]]["id"] == str(tmp_path / "a.txt") == by_text[texts[0]]["source"]
    assert [by_text[t]["id"] for t in texts[1:3]] == ["b0", "b1"]
    assert json.loads(by_text[texts[1]]["meta"]) == {"court": "x"}
    assert by_text[texts[3]]["id"] == f"{tmp_path / 'c.json'}:0"
    assert by_text[texts[4]]["kind"] == "contract"
    assert json.loads(by_text[texts[6]]["meta"]) == {"year": 1999}
    assert all(d["kind"] in ("contract", "opinion", "other") for d in documents)


def test_text_field_is_configurable(tmp_path, rng):
    texts = [random_text(rng) for _ in range(3)]
    (tmp_path / "a.jsonl").write_text(json.dumps({"body": texts[0], "text": "not this"}) + "\n")
    pq.write_table(pa.table({"body": texts[1:]}), tmp_path / "b.parquet")
    documents, report = load(tmp_path, tmp_path / "a.jsonl", tmp_path / "b.parquet", text_field="body")
    assert [d["text"] for d in documents] == texts and report.total == 0


def test_cap_case_json_and_jsonl(tmp_path, rng):
    cases = [cap_case(rng, 100 + i, opinions=1 + i % 2, head=i != 2) for i in range(4)]
    (tmp_path / "one case.json").write_text(json.dumps(cases[0], indent=2))
    (tmp_path / "cases.jsonl").write_text("\n".join(json.dumps(c) for c in cases[1:3]))
    (tmp_path / "list.json").write_text(json.dumps([cases[3]]))

    documents, report = load(tmp_path, tmp_path / "one case.json", tmp_path / "cases.jsonl", tmp_path / "list.json")
    assert report.total == 0
    assert [d["text"] for d in documents] == [cap_text(c) for c in cases]
    assert [d["id"] for d in documents] == ["100", "101", "102", "103"]
    assert {d["kind"] for d in documents} == {"opinion"}
    meta = json.loads(documents[1]["meta"])
    assert meta["citations"] == ["101 U.S. 340"] and meta["opinion_types"] == ["majority", "dissent"]
    assert meta["court"] == "Supreme Court of the United States" and meta["name"] == "Smith v. Jones 101"


def test_csv(tmp_path, rng):
    texts = [random_text(rng) for _ in range(3)]
    texts[1] = f'{texts[1]}, "quoted"\n\nsecond paragraph'  # commas, quotes and newlines inside one field
    texts[2] = random_text(rng, words=40_000)  # far over the csv module's default field limit of 128 KiB
    with open(tmp_path / "opinions.csv", "w", newline="", encoding="utf-8") as out:
        writer = csv.writer(out)
        writer.writerow(["id", "text", "court", "kind"])
        writer.writerows([["c0", texts[0], "Ninth Circuit", "opinion"], ["c1", texts[1], "", ""], ["c2", texts[2]]])
        writer.writerow(["c3"])  # a short row: no text
    documents, report = load(tmp_path, tmp_path / "opinions.csv")
    assert [d["text"] for d in documents] == texts
    assert [d["id"] for d in documents] == ["c0", "c1", "c2"]
    assert documents[0]["kind"] == "opinion" and json.loads(documents[0]["meta"]) == {"court": "Ninth Circuit"}
    assert report.counts == {"empty text": 1}


def test_html_opinion(tmp_path, rng):
    words = [random_text(rng, words=6) for _ in range(6)]
    page = f"""<!DOCTYPE html>
<html><head><title> Smith v. Jones </title><style>p {{ color: red }}</style></head>
<body>
<script>var court = "not text";</script>
<h1>SUPREME COURT</h1>
<p>The opinion of the court.   {words[0]}<sup class="footnotemark"><a href="#fn1">1</a></sup>
   continues here.<!-- an editor's comment --></p>
<div class="footnote" id="fn1"><p>1 {words[1]}</p></div>
<p>{words[2]}<br>{words[3]}</p>
<table><tr><td>Appellant</td><td>{words[4]}</td></tr></table>
<div class="footnotes"><div class="footnote" id="fn2">2 {words[5]}</div></div>
</body></html>"""
    (tmp_path / "opinion é.html").write_text(page, encoding="utf-8")
    (tmp_path / "page.htm").write_text(f"<html><body><div>{words[0]}</div><div>{words[1]}</div></body></html>")

    documents, report = load(tmp_path, tmp_path / "opinion é.html", tmp_path / "page.htm")
    assert report.total == 0
    expected = (
        f"SUPREME COURT\n\nThe opinion of the court. {words[0]}1 continues here.\n\n{words[2]}\n{words[3]}\n\n"
        f"Appellant\t{words[4]}\n\n1 {words[1]}\n\n2 {words[5]}"
    )
    assert documents[0]["text"] == expected
    assert documents[0]["kind"] == "opinion" and json.loads(documents[0]["meta"]) == {"title": "Smith v. Jones"}
    assert documents[1]["text"] == f"{words[0]}\n{words[1]}" and documents[1]["kind"] == "other"


def test_html_star_page_labels_dropped_between_words(tmp_path):
    """CourtListener, CAP and bracketed star-page labels, at a paragraph start, inside a case name with and without
    spaces around, and in <pre>: gone, and the words on either side stay apart."""
    page = """<html><body>
<p>The court below dismissed.</p>
<p><span class="star-pagination" number="1006">*1006</span>On appeal, we reverse.</p>
<p>See Feist Publications, Inc. v. Rural<a class="page-label" data-label="1007" href="#p1007">*1007</a>Telephone
Service Co., 499 U.S. 340 (1991); Baker v. <page-number label="1008">*1008</page-number> Selden, 101 U.S. 99 (1880).</p>
<p>Lotus Development Corp. v.[*1009]Borland International, Inc., 49 F.3d 807 (1st Cir. 1995) [**12] held so.</p>
<pre>kept  as[*1010]printed</pre>
</body></html>"""
    (tmp_path / "opinion.html").write_text(page, encoding="utf-8")
    documents, report = load(tmp_path, tmp_path / "opinion.html")
    assert report.total == 0
    assert documents[0]["text"] == (
        "The court below dismissed.\n\nOn appeal, we reverse.\n\nSee Feist Publications, Inc. v. Rural Telephone "
        "Service Co., 499 U.S. 340 (1991); Baker v. Selden, 101 U.S. 99 (1880).\n\nLotus Development Corp. v. "
        "Borland International, Inc., 49 F.3d 807 (1st Cir. 1995) held so.\n\nkept  as printed"
    )


def test_pdf_and_docx(tmp_path, rng):
    pages = [random_text(rng, words=8).replace("é", "e").replace("§", "s") for _ in range(2)]
    (tmp_path / "brief.pdf").write_bytes(make_pdf(pages))
    document = docx.Document()
    document.core_properties.title = "Lease"
    paragraphs = [random_text(rng, words=10) for _ in range(2)]
    document.add_paragraph(paragraphs[0])
    table = document.add_table(rows=2, cols=3)
    table.cell(0, 0).merge(table.cell(0, 1)).text = "Landlord"
    table.cell(0, 2).text = "Tenant"
    table.cell(1, 0).text, table.cell(1, 1).text, table.cell(1, 2).text = "a", "b", "c"
    document.add_paragraph(paragraphs[1])
    document.save(tmp_path / "lease ñ.docx")

    documents, report = load(tmp_path, tmp_path / "brief.pdf", tmp_path / "lease ñ.docx")
    assert report.total == 0
    assert documents[0]["text"] == f"{pages[0]}\n\f\n{pages[1]}" and json.loads(documents[0]["meta"]) == {"pages": 2}
    assert documents[1]["text"] == f"{paragraphs[0]}\nLandlord\tTenant\na\tb\tc\n{paragraphs[1]}"
    assert json.loads(documents[1]["meta"]) == {"title": "Lease"}


@pytest.mark.parametrize("compression", ["gz", "zst"])
def test_compressed_variants(tmp_path, rng, compression):
    plain, packed = tmp_path / "plain", tmp_path / "packed"
    plain.mkdir()
    packed.mkdir()
    texts = [random_text(rng) for _ in range(6)]
    (plain / "a doc.txt").write_text(texts[0])
    (plain / "b.jsonl").write_text("\n".join(json.dumps({"text": t}) for t in texts[1:3]))
    (plain / "c.csv").write_text("text\n" + texts[3] + "\n")
    (plain / "d.html").write_text(f"<p>{texts[4]}</p>")
    pq.write_table(pa.table({"text": [texts[5]]}), plain / "e.parquet")
    (plain / "f.pdf").write_bytes(make_pdf(["plain ascii page"]))
    docx.Document().save(plain / "g.docx")  # an empty document: the same skip either way
    compress = gzip.compress if compression == "gz" else zstandard.ZstdCompressor().compress
    for path in plain.iterdir():
        (packed / f"{path.name}.{compression}").write_bytes(compress(path.read_bytes()))

    expected, expected_report = load(tmp_path, plain)
    documents, report = load(tmp_path, packed)
    assert len(expected) == 7 and expected_report.counts == report.counts == {"empty text": 1}
    assert [d["text"] for d in documents] == [d["text"] for d in expected]
    assert [d["source"] for d in documents] == [
        str(packed / f"{Path(d['source']).name}.{compression}") for d in expected
    ]


def test_every_skip_reason_is_counted(tmp_path, rng, monkeypatch):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    good = [random_text(rng) for _ in range(5)]
    (corpus / "good.txt").write_text(good[0])
    (corpus / "scan.pdf").write_bytes(b"%PDF-1.4")  # corrupt
    (corpus / "locked.pdf").write_bytes(blank_pdf(password="secret"))
    (corpus / "blank.pdf").write_bytes(blank_pdf())
    (corpus / "bad.docx").write_bytes(b"PK\x03\x04 not a zip")
    (corpus / "notes").write_text("no extension")
    (corpus / "archive.gz").write_bytes(gzip.compress(b"no inner extension"))
    (corpus / "empty.txt").write_bytes(b"")
    (corpus / "empty.jsonl.gz").write_bytes(gzip.compress(b""))
    (corpus / "blank.txt").write_text("  \n\t ")
    (corpus / "garbage.txt").write_bytes(bytes(rng.randrange(256) for _ in range(5000)) + b"\x00")
    (corpus / "late nul.txt").write_bytes(b"text " * 20000 + b"\x00 more")  # past the sample at the start
    (corpus / "controls.html").write_bytes(bytes(rng.randrange(1, 9) for _ in range(3000)))
    (corpus / "latin1.txt").write_bytes(f"caf\xe9 \xa7 2 {good[3]}".encode("cp1252"))  # decoded by the fallback
    (corpus / "cp1252 holes.txt").write_bytes(b"\x81\x8d\x8f\x90\x9d" * 10)  # bytes no encoding we try defines
    (corpus / "truncated.jsonl.gz").write_bytes(gzip.compress(json.dumps({"text": good[4]}).encode() * 50)[:-30])
    (corpus / "junk.txt.zst").write_bytes(b"\x28\xb5\x2f\xfd not really zstd")
    (corpus / "no text column.csv").write_text("id,body\n1,x\n")
    (corpus / "unreadable.txt").write_text(random_text(rng))
    (corpus / "unreadable.txt").chmod(0)
    if os.geteuid() == 0:  # root reads any file whatever its mode, so refuse it the way the OS would
        refused = str(corpus / "unreadable.txt")

        def guarded_open(path, *args, **kwargs):
            if str(path) == refused:
                raise PermissionError(13, "Permission denied", path)
            return open(path, *args, **kwargs)

        monkeypatch.setattr(readers, "open", guarded_open, raising=False)
    lines = [
        json.dumps({"text": good[1]}),
        json.dumps({"body": "wrong field"}),
        json.dumps({"text": ""}),
        json.dumps({"text": None}),
        json.dumps({"text": 42}),
        json.dumps(["not", "an", "object"]),
        '{"text": "broken',
        json.dumps({"text": "\ud800 lone surrogate"}),
    ]
    (corpus / "records.jsonl").write_bytes(("\n".join(lines) + "\n").encode() + b'{"text": "\x81\x8d"}\n')
    (corpus / "bad.parquet").write_bytes(b"not parquet at all")
    (corpus / "truncated.json").write_text('{\n  "text": "cut off\n  here')
    pq.write_table(pa.table({"body": ["x"]}), corpus / "other column.parquet")
    pq.write_table(pa.table({"text": [good[2], ""]}), corpus / "rows.parquet")
    # One line of 100 MB between two good records, written in pieces: it is passed over, never held whole.
    last = random_text(rng)
    with open(corpus / "huge line.jsonl", "wb") as huge:
        huge.write(json.dumps({"text": good[0] + " first"}).encode() + b"\n" + b'{"text": "')
        for _ in range(100):
            huge.write(b"x" * 2**20)
        huge.write(b'"}\n' + json.dumps({"text": last}).encode() + b"\n")
    memory_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB

    documents, report = load(tmp_path, corpus)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - memory_before < 90 * 2**10
    expected = [*good[:3], f"caf\xe9 \xa7 2 {good[3]}", good[0] + " first", last]
    assert sorted(d["text"] for d in documents) == sorted(expected)
    assert report.counts == {
        "unknown extension": 2,  # notes, archive.gz
        "empty file": 2,  # empty.txt, the gzip of nothing
        "empty text": 4,  # blank.txt, "", null, the empty parquet row
        "binary file": 3,
        "undecodable bytes": 3,  # the cp1252 holes file and line, the lone surrogate
        "missing text field": 3,  # a record, a parquet file, a csv file
        "text not a string": 1,
        "record not an object": 1,
        "invalid json": 2,
        "unreadable parquet": 1,
        "unreadable pdf": 2,  # corrupt, encrypted
        "pdf without text": 1,
        "unreadable docx": 1,
        "unreadable file": 1,
        "corrupt compressed file": 2,
        "line too long": 1,
    }
    assert report.total == 30
    assert report.examples["empty file"] == [str(corpus / "empty.jsonl.gz"), str(corpus / "empty.txt")]
    assert report.examples["invalid json"] == [f"{corpus / 'records.jsonl'}:7", str(corpus / "truncated.json")]
    assert report.examples["line too long"] == [f"{corpus / 'huge line.jsonl'}:2"]
    assert report.examples["unreadable file"] == [str(corpus / "unreadable.txt")]
    assert sorted(report.examples["binary file"]) == sorted(
        str(corpus / name) for name in ("garbage.txt", "late nul.txt", "controls.html")
    )
    assert "2 invalid json" in str(report)

    # A load served from the cache reports the same skips.
    again, cached_report = load(tmp_path, corpus)
    assert cached_report == report and [d["text"] for d in again] == [d["text"] for d in documents]


def test_line_cap_applies_to_line_formats(tmp_path, rng, monkeypatch):
    monkeypatch.setattr(readers, "MAX_LINE_BYTES", 100)
    short = [random_text(rng, words=5) for _ in range(3)]
    (tmp_path / "long.txt").write_text(short[0] + "\n" + "y" * 101 + "\n")
    (tmp_path / "ok.txt").write_text(short[0] + "\n" + "y" * 99 + "\n")  # 100 bytes with its newline: kept
    (tmp_path / "rows.csv").write_text(f"text\n{short[1]}\n{'z' * 200}\n{short[2]}\n")
    documents, report = load(tmp_path, tmp_path / "long.txt", tmp_path / "ok.txt", tmp_path / "rows.csv")
    assert [d["text"] for d in documents] == [short[0] + "\n" + "y" * 99 + "\n", short[1], short[2]]
    assert report.counts == {"line too long": 2}
    assert report.examples["line too long"] == [str(tmp_path / "long.txt"), f"{tmp_path / 'rows.csv'}:3"]


def test_skip_report_keeps_few_examples():
    report = SkipReport()
    for i in range(10):
        report.add("empty file", f"f{i}")
    assert report.counts == {"empty file": 10} and report.examples["empty file"] == ["f0", "f1", "f2"]


@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="the shared sample documents are absent")
def test_real_contracts_and_opinions(tmp_path):
    contracts = sorted((SHARED_DATA / "contracts").glob("*.txt"))
    opinions = sorted((SHARED_DATA / "opinions").glob("*.json"))
    documents, report = load(tmp_path, SHARED_DATA / "contracts", SHARED_DATA / "opinions" / "*.json")
    assert report.total == 0
    assert len(documents) == len(contracts) + len(opinions)
    by_source = {d["source"]: d for d in documents}
    for path in contracts:  # names with spaces, commas and parentheses
        assert by_source[str(path)]["text"] == path.read_text(encoding="utf-8")
    assert sum(by_source[str(p)]["kind"] == "contract" for p in contracts) >= 0.9 * len(contracts)
    for path in opinions:
        case = json.loads(path.read_text())
        document = by_source[str(path)]
        assert document["kind"] == "opinion" and document["id"] == str(case["id"])
        assert document["text"] == cap_text(case)
        assert json.loads(document["meta"])["citations"] == [c["cite"] for c in case["citations"]]
