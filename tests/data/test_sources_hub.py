"""Dataset sources through `datasets.load_dataset`: field mapping, skips, streaming, the presets in conf/ loaded from
local copies laid out like their hub repositories (no network), and bad source configs."""

import datetime
import json
import lzma
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from data_helpers import text
from omegaconf import OmegaConf

from legalpt.config import CONF_DIR, DataConfig, SourceConfig, compose, to_config
from legalpt.data.kinds import KINDS, guess_kind
from legalpt.data.sources import load_documents


def load(tmp_path: Path, **sources: SourceConfig):
    documents, report = load_documents(DataConfig(sources=sources, cache_dir=str(tmp_path / "cache")))
    return documents.to_list(), report


# Local copies of the hub datasets the presets name, in their layout and schema; each returns its records.


def pile_of_law(root: Path, pattern: str, rng: random.Random) -> list[dict]:
    records = [
        {"text": text(rng), "created_timestamp": "01-02-2020", "downloaded_timestamp": "05-06-2022", "url": f"u{i}"}
        for i in range(5)
    ]
    records[rng.randrange(5)]["text"] = ""
    path = root / "pile-of-law" / "pile-of-law" / pattern.replace("*", "0")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(lzma.compress("".join(json.dumps(r) + "\n" for r in records).encode(), format=lzma.FORMAT_XZ))
    return records


def cuad_qa(root: Path, rng: random.Random) -> list[dict]:
    contracts = [(f"CONTRACT_{i}", text(rng)) for i in range(3)]
    records = [
        {
            "id": f"{title}__{q}",
            "title": title,
            "context": context,
            "question": f"question {q}",
            "answers": {"text": ["x"], "answer_start": [0]},
        }
        for title, context in contracts
        for q in range(rng.randint(2, 4))
    ]
    write_parquet(root / "theatticusproject" / "cuad-qa" / "data" / "train-00000-of-00001.parquet", records)
    return records


def cold_cases(root: Path, rng: random.Random) -> list[dict]:
    def opinion(kind: str) -> dict:
        return {"opinion_text": text(rng), "type": kind, "author_str": "Smith"}

    records = [
        {
            "id": 100 + i,
            "case_name": f"A v. B {i}",
            "date_filed": datetime.date(1990 + i, 1, 2),
            "court_full_name": "Supreme Court",
            "citations": [f"{i} U.S. {i + 7}"],
            "opinions": [opinion("majority"), opinion("dissent")][: rng.randint(1, 2)],
        }
        for i in range(4)
    ]
    records[rng.randrange(4)]["opinions"] = []  # a case without opinion text
    write_parquet(root / "harvard-lil" / "cold-cases" / "data" / "train-00000-of-00002.parquet", records[:2])
    write_parquet(root / "harvard-lil" / "cold-cases" / "data" / "train-00001-of-00002.parquet", records[2:])
    return records


def with_configs(root: Path, repo: str, configs: dict[str, str], records: list[dict]) -> list[dict]:
    """A repository whose README declares its configurations and their files, as FineWeb and Wikipedia do."""
    folder = root / repo
    lines = ["---", "configs:"]
    for config, files in configs.items():
        lines += [f"- config_name: {config}", "  data_files:", "  - split: train", f"    path: {files}/*.parquet"]
        write_parquet(folder / files / "000_00000.parquet", records)
    (folder / "README.md").write_text("\n".join([*lines, "---", "A local copy.", ""]))
    return records


def fineweb_edu(root: Path, rng: random.Random) -> list[dict]:
    records = [
        {"text": text(rng), "id": f"<urn:uuid:{i}>", "url": f"https://example.org/{i}", "score": 3.5} for i in range(6)
    ]
    return with_configs(root, "HuggingFaceFW/fineweb-edu", {"sample-10BT": "sample/10BT", "default": "data"}, records)


def wikipedia(root: Path, rng: random.Random) -> list[dict]:
    records = [
        {"id": str(i), "url": f"https://en.wikipedia.org/wiki?curid={i}", "title": f"T{i}", "text": text(rng)}
        for i in range(5)
    ]
    return with_configs(
        root, "wikimedia/wikipedia", {"20231101.en": "20231101.en", "20231101.fr": "20231101.fr"}, records
    )


def write_parquet(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(records), path)


def local_copy(source: SourceConfig, root: Path, rng: random.Random) -> tuple[SourceConfig, list[dict]]:
    """The source pointed at a local copy of its hub data (the hub name swapped for a folder), and its records."""
    if source.data_files:
        prefix = "hf://datasets/pile-of-law/pile-of-law/"
        assert all(f.startswith(prefix) for f in source.data_files)
        records = [r for f in source.data_files for r in pile_of_law(root, f.removeprefix(prefix), rng)]
        files = [str(root / "pile-of-law" / "pile-of-law" / f.removeprefix(prefix)) for f in source.data_files]
        return SourceConfig(**{**vars(source), "data_files": files}), records
    builders = {
        "theatticusproject/cuad-qa": cuad_qa,
        "harvard-lil/cold-cases": cold_cases,
        "HuggingFaceFW/fineweb-edu": fineweb_edu,
        "wikimedia/wikipedia": wikipedia,
    }
    records = builders[source.name](root, rng)
    return SourceConfig(**{**vars(source), "name": str(root / source.name)}), records


def expected_documents(name: str, source: SourceConfig, records: list[dict]) -> list[dict]:
    """What each record should become, worked out from the preset's fields by hand (not through the loader)."""
    documents, seen = [], set()
    for number, record in enumerate(records):
        if source.text_field == "opinions.opinion_text":
            body = "\n\n".join(op["opinion_text"] for op in record["opinions"])
        else:
            body = record[source.text_field]
        if not body or (source.distinct_field and record[source.distinct_field] in seen):
            continue
        if source.distinct_field:
            seen.add(record[source.distinct_field])
        meta = json.loads(json.dumps({f: record[f] for f in source.meta_fields}, default=str))
        doc_id = str(record[source.id_field]) if source.id_field else f"{name}:{number}"
        documents.append({"id": doc_id, "text": body, "source": name, "meta": meta})
    return documents


SOURCE_PRESETS = sorted(p.stem for p in (CONF_DIR / "source").glob("*.yaml"))
DATA_PRESETS = ["pile_of_law", "cuad", "cold_cases", "legal_mix"]


def source_preset(stem: str) -> SourceConfig:
    return OmegaConf.to_object(OmegaConf.merge(SourceConfig, OmegaConf.load(CONF_DIR / "source" / f"{stem}.yaml")))


@pytest.mark.parametrize("stem", SOURCE_PRESETS)
def test_each_source_preset_loads_its_local_copy(tmp_path, rng, stem):
    source, records = local_copy(source_preset(stem), tmp_path / "hub", rng)
    documents, report = load(tmp_path, **{stem: source})
    expected = expected_documents(stem, source, records)
    assert [{k: d[k] for k in ("id", "text", "source")} for d in documents] == [
        {k: e[k] for k in ("id", "text", "source")} for e in expected
    ]
    assert [json.loads(d["meta"]) for d in documents] == [e["meta"] for e in expected]
    for document in documents:
        assert document["kind"] == (source.kind or guess_kind(document["text"]))
    assert documents and documents[0]["kind"] in KINDS
    # Every record is a document or a counted skip.
    assert len(documents) + report.total == len(records)


@pytest.mark.parametrize("preset", DATA_PRESETS)
def test_data_presets_compose(preset):
    cfg = to_config(compose("prepare", [f"data={preset}"]))
    assert cfg.data.sources and not cfg.data.paths
    for name, source in cfg.data.sources.items():
        assert isinstance(source, SourceConfig) and source.name, name
        assert source.kind in (*KINDS, None)
    overridden = to_config(compose("prepare", [f"data={preset}", f"data.sources.{name}.weight=0.5"]))
    assert overridden.data.sources[name].weight == 0.5


def test_legal_mix_replays_a_few_percent_and_loads_from_local_copies(tmp_path, rng):
    sources = to_config(compose("prepare", ["data=legal_mix"])).data.sources
    weights = {name: source.weight for name, source in sources.items()}
    assert 0.02 <= weights["replay"] / sum(weights.values()) <= 0.1
    assert sources["replay"].kind == "other" and {sources[n].kind for n in sources if n != "replay"} <= set(KINDS)
    local = {name: local_copy(source, tmp_path / "hub", rng)[0] for name, source in sources.items()}
    documents, report = load(tmp_path, **local)
    assert {d["source"] for d in documents} <= set(sources) and documents
    assert report.counts.keys() <= {"empty text", "beyond mixture share"}


@pytest.mark.parametrize("streaming", [False, True])
def test_field_mapping_and_skips(tmp_path, rng, streaming):
    records = [
        {"body": text(rng), "key": f"k{i}", "court": f"c{i}", "year": 2000 + i, "extra": "not kept"} for i in range(8)
    ]
    empty = rng.sample(range(8), 3)
    for i, value in zip(empty, [None, "", " \n\t "], strict=True):
        records[i]["body"] = value
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "part-0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    source = SourceConfig(
        name=str(tmp_path / "ds"),
        text_field="body",
        id_field="key",
        meta_fields=["court", "year"],
        kind="opinion",
        streaming=streaming,
    )
    documents, report = load(tmp_path, opinions=source)
    kept = [r for i, r in enumerate(records) if i not in empty]
    assert [d["text"] for d in documents] == [r["body"] for r in kept]
    assert [d["id"] for d in documents] == [r["key"] for r in kept]
    assert [json.loads(d["meta"]) for d in documents] == [{"court": r["court"], "year": r["year"]} for r in kept]
    assert {d["kind"] for d in documents} == {"opinion"} and {d["source"] for d in documents} == {"opinions"}
    assert report.counts == {"empty text": 3}
    assert sorted(report.examples["empty text"]) == sorted(f"opinions:{i}" for i in empty)

    wrong_field = SourceConfig(**{**vars(source), "text_field": "no_such_field"})
    documents, report = load(tmp_path, opinions=wrong_field)
    assert documents == [] and report.counts == {"missing text field": len(records)}

    capped = SourceConfig(**{**vars(source), "max_documents": 2, "id_field": None})
    documents, _ = load(tmp_path, opinions=capped)
    assert [d["text"] for d in documents] == [r["body"] for r in kept[:2]]
    assert documents[0]["id"] == f"opinions:{records.index(kept[0])}"  # no id field: the record's place


def test_paths_and_sources_together(tmp_path, rng):
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "a.txt").write_text(text(rng))
    write_parquet(tmp_path / "ds" / "data" / "train.parquet", [{"text": text(rng)}])
    cfg = DataConfig(
        paths=[str(tmp_path / "files")],
        sources={"hub": SourceConfig(name=str(tmp_path / "ds"))},
        cache_dir=str(tmp_path / "cache"),
    )
    documents, report = load_documents(cfg)
    assert {d["source"] for d in documents} <= {"hub", str(tmp_path / "files" / "a.txt")}
    assert documents.num_rows + report.total == 2


@pytest.mark.parametrize(
    ("source", "match"),
    [
        (SourceConfig(), "either a dataset `name` or local `paths`"),
        (SourceConfig(name="x", paths=["y"]), "either a dataset `name` or local `paths`"),
        (SourceConfig(paths=["y"], id_field="id"), "id_field apply to a dataset"),
        (SourceConfig(name="x", kind="memo"), r"data.sources.bad.kind: expected one of contract"),
        (SourceConfig(name="x", weight=0), r"weight of source 'data.sources.bad'"),
        (SourceConfig(name="x", max_documents=-1), "data.sources.bad.max_documents"),
    ],
)
def test_bad_source_configs(tmp_path, source, match):
    with pytest.raises(ValueError, match=match):
        load(tmp_path, bad=source)


def test_unloadable_sources_and_taken_names(tmp_path):
    with pytest.raises(ValueError, match=r"data.sources.gone: cannot load"):
        load(tmp_path, gone=SourceConfig(name=str(tmp_path / "no such folder")))
    with pytest.raises(ValueError, match=r"data.sources.files"):
        load_documents(DataConfig(paths=[str(tmp_path)], sources={"files": SourceConfig(name="x")}))
    with pytest.raises(TypeError, match=r"data.sources.bad: expected a SourceConfig"):
        load(tmp_path, bad={"name": "x"})
