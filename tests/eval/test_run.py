"""`legalpt-eval` end to end on tiny models: every task, two checkpoints side by side, report files, eval-set reuse,
and no training document scored (a tiny run trained on a folder, evaluated on it and on others)."""

import json
import random

import pytest
import torch

from legalpt.config import ConfigError, DataConfig, compose, to_config
from legalpt.data.manifest import MANIFEST
from legalpt.data.pipeline import prepare, split_corpus
from legalpt.data.stream import in_heldout
from legalpt.eval.run import CheckpointError, EvalSet, evaluate, resolve_checkpoint
from legalpt.model import build_model

DATA = ["data.synthetic_documents=12", "data.seq_len=128", "data.vocab_size=600", "data.heldout_fraction=0.25"]
FAST = [
    "model=tiny",
    "logger=none",
    "eval.max_documents=3",
    "eval.perplexity_context=128",
    "eval.citations.max_items=12",
    "eval.citations.prompt_tokens=48",
    "eval.citations.set_documents=2",
    "eval.citations.set_prompt_tokens=48",
    "eval.citations.set_new_tokens=24",
    "eval.generation.max_new_tokens=12",
    "eval.bootstrap=50",
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_model_config):
    """Two tiny checkpoints (different initialisations) saved as run exports, with the demo corpus's tokenizer."""
    root = tmp_path_factory.mktemp("runs")
    cache = root / "cache"
    data = prepare(
        DataConfig(synthetic_documents=12, seq_len=128, vocab_size=600, heldout_fraction=0.25, cache_dir=str(cache))
    )
    for name, seed in (("base", 0), ("legal", 1)):
        torch.manual_seed(seed)
        model = build_model(tiny_model_config(max_position_embeddings=512), data.tokenizer)
        model.save_pretrained(root / name / "hf")
        data.tokenizer.save_pretrained(root / name / "hf")
    casehold = root / "casehold.csv"
    casehold.write_text(
        "citing_prompt,holding_0,holding_1,holding_2,holding_3,holding_4,label\n"
        '"The court held <HOLDING> in that case.",holding that a contract requires consideration,'
        "holding that the statute applies,holding nothing,holding that notice was due,holding for the plaintiff,0\n"
        '"See id. <HOLDING> which controls here.",holding that waiver is valid,holding that time is of the essence,'
        "holding the claim barred,holding the term void,holding for the defendant,2\n"
    )
    return root, cache, casehold


def overrides(runs, *extra):
    root, cache, casehold = runs
    return [*FAST, *DATA, f"data.cache_dir={cache}", f"eval.runs_dir={root}", f"eval.choice_data={casehold}", *extra]


def test_two_checkpoints_every_task_and_the_report(runs, tmp_path):
    root = runs[0]
    report = evaluate(
        compose(
            "eval",
            overrides(
                runs,
                f"eval.checkpoint={root / 'base'}",
                f"eval.compare={root / 'legal'}",
                f"eval.output_dir={tmp_path}",
            ),
        )
    )
    results = report["checkpoints"]
    assert list(results) == [str(root / "base" / "hf"), str(root / "legal" / "hf")]
    for result in results.values():
        assert {"perplexity", "citations", "citation_set", "choice"} <= result.keys()
        assert result["perplexity"]["by_kind"]["all"]["tokens"] > 0
        assert result["citations"]["full"]["items"] + result["citations"]["short_forms"]["items"] == 12
        assert len(result["citations"]["items"]) == 12 and result["citations"]["generation"]["prompts"] == 12
        assert result["choice"]["items"] == 2
    # Both checkpoints saw the same prompts.
    ids = [[row["id"] for row in r["citations"]["items"]] for r in results.values()]
    assert ids[0] == ids[1]

    saved = json.loads((tmp_path / "report.json").read_text())
    assert saved["checkpoints"].keys() == results.keys()
    md = (tmp_path / "report.md").read_text()
    for section in ("## perplexity", "## citations", "## citation_set", "## choice", "checkpoint 2"):
        assert section in md
    assert "full/metrics/exact" in md and "by_kind/all/bits_per_byte" in md
    for plot in ("citations_by_reporter.png", "citations_by_position.png", "citations_by_prompt_tokens.png"):
        assert (tmp_path / plot).stat().st_size > 1000


def test_eval_set_is_reused_item_for_item(runs, tmp_path):
    root = runs[0]
    first = evaluate(
        compose(
            "eval",
            overrides(
                runs, f"eval.checkpoint={root / 'base'}", "eval.tasks=[citations]", f"eval.output_dir={tmp_path / 'a'}"
            ),
        )
    )
    saved = EvalSet.load(tmp_path / "a" / "eval_set.jsonl")
    assert len(saved.citation_items) == 12
    # A different corpus sample would build other items; the saved set must win.
    again = evaluate(
        compose(
            "eval",
            overrides(
                runs,
                f"eval.checkpoint={root / 'base'}",
                "eval.tasks=[citations]",
                f"eval.eval_set={tmp_path / 'a' / 'eval_set.jsonl'}",
                "eval.seed=7",
                f"eval.output_dir={tmp_path / 'b'}",
            ),
        )
    )
    rows = [r["checkpoints"][str(root / "base" / "hf")]["citations"]["items"] for r in (first, again)]
    assert [(r["id"], r["generation"]) for r in rows[0]] == [(r["id"], r["generation"]) for r in rows[1]]


def test_no_arguments_means_the_newest_run(runs, tmp_path):
    root = runs[0]
    (root / "legal" / "hf" / "config.json").touch()  # the newest export
    report = evaluate(compose("eval", overrides(runs, "eval.tasks=[perplexity]", f"eval.output_dir={tmp_path}")))
    assert list(report["checkpoints"]) == [str(root / "legal" / "hf")]


def test_unknown_task_is_named(runs):
    with pytest.raises(ValueError, match=r"eval\.tasks"):
        evaluate(compose("eval", overrides(runs, "eval.tasks=[perplexity,rouge]")))


def test_missing_eval_set_is_named(runs, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"eval\.eval_set"):
        evaluate(compose("eval", overrides(runs, f"eval.eval_set={tmp_path / 'none.jsonl'}")))


def test_report_goes_to_wandb_when_it_is_on(runs, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    root = runs[0]
    evaluate(
        compose(
            "eval",
            overrides(
                runs,
                "logger=wandb",
                f"eval.checkpoint={root / 'base'}",
                "eval.tasks=[citations]",
                f"eval.output_dir={tmp_path}",
            ),
        )
    )
    offline_runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(offline_runs) == 1 and any(offline_runs[0].glob("*.wandb"))


def test_checkpoints_are_checked_before_anything_loads(runs, tmp_path, monkeypatch):
    root = runs[0]
    assert resolve_checkpoint(str(root / "base"), str(root)) == str(root / "base" / "hf")  # a run folder: its export
    assert resolve_checkpoint(str(root / "base" / "hf"), str(root)) == str(root / "base" / "hf")
    untokenized = tmp_path / "untokenized"
    untokenized.mkdir()
    (untokenized / "config.json").write_text((root / "base" / "hf" / "config.json").read_text())
    with pytest.raises(CheckpointError, match=rf"^eval\.compare: {untokenized} has no tokenizer"):
        resolve_checkpoint(str(untokenized), str(root), "eval.compare")

    def load(*args, **kwargs):
        raise AssertionError("loaded data or a model before checking the checkpoints")

    monkeypatch.setattr("legalpt.eval.run.heldout_documents", load)
    monkeypatch.setattr("legalpt.eval.run.build_model", load)
    missing = tmp_path / "missing"
    with pytest.raises(CheckpointError, match=rf"^eval\.compare: {missing} is not a folder and not a hub id"):
        evaluate(compose("eval", overrides(runs, f"eval.checkpoint={root / 'base'}", f"eval.compare={missing}")))


WORDS = ["court", "held", "lessee", "notice", "motion", "appeal", "statute", "remand", "tenant", "damages", "deed"]


def write_documents(folder, rng, count: int) -> dict[str, str]:
    """`count` text files of random legal-sounding words; file name -> text."""
    folder.mkdir()
    texts = {f"doc{i}.txt": " ".join(rng.choices(WORDS, k=rng.randint(60, 120))) + "." for i in range(count)}
    for name, text in texts.items():
        (folder / name).write_text(text)
    return texts


def files_overrides(folder, cache, *extra: str) -> list[str]:
    return [
        "model=tiny",
        "logger=none",
        "data=files",
        f"data.paths=[{folder}]",
        "data.seq_len=128",
        "data.vocab_size=300",
        f"data.cache_dir={cache}",
        *extra,
    ]


def scored_ids(report: dict) -> list[str]:
    (result,) = report["checkpoints"].values()
    return [row["id"] for row in result["perplexity"]["per_document"]]


@pytest.fixture(scope="module")
def trained_on_files(tmp_path_factory):
    """A tiny run trained on a folder of 10 documents (8 train, 2 held out), and the texts of its training split."""
    from legalpt.train.trainer import train

    root = tmp_path_factory.mktemp("contamination")
    rng = random.Random(1234)
    texts = write_documents(root / "opinions", rng, 10)
    cache, run_dir = root / "cache", root / "run"
    split = ["data.heldout_fraction=0.2", "data.seed=0"]
    train_steps = ["train.steps=1", "train.warmup_steps=0", "train.eval_every=1", "train.save_every=1"]
    cfg = compose(
        "train", files_overrides(root / "opinions", cache, *split, *train_steps, f"train.output_dir={run_dir}")
    )
    train(cfg)
    trained = split_corpus(to_config(cfg).data).splits["train"]
    return root, texts, {row["text"] for row in trained}


def eval_on(root, folder, *extra: str) -> dict:
    return evaluate(
        compose(
            "eval",
            files_overrides(
                folder,
                root / "cache",
                "eval.tasks=[perplexity]",
                "eval.perplexity_context=128",
                "eval.bootstrap=0",
                f"eval.output_dir={root / 'eval'}",
                *extra,
            ),
        )
    )


@pytest.mark.parametrize("given", ["run", "export"])
def test_eval_on_the_training_folder_scores_no_training_document(trained_on_files, given):
    """Re-split with another seed and fraction, the held-out split holds training documents: they are left out and
    counted, whether the checkpoint is given as the run folder or as its HF export."""
    root, texts, trained = trained_on_files
    checkpoint = root / "run" if given == "run" else root / "run" / "hf"
    resplit = ["data.heldout_fraction=0.6", "data.seed=7"]
    report = eval_on(root, root / "opinions", f"eval.checkpoint={checkpoint}", *resplit)
    heldout = split_corpus(
        to_config(compose("eval", files_overrides(root / "opinions", root / "cache", *resplit))).data
    )
    candidates = [row["text"] for row in heldout.splits["heldout"]]
    expected = [t for t in candidates if t not in trained]
    assert 0 < len(expected) < len(candidates)  # the re-split does hold training documents
    by_id = {str(root / "opinions" / name): text for name, text in texts.items()}
    assert [by_id[i] for i in scored_ids(report)] == expected
    assert report["data"]["excluded_training"] == len(candidates) - len(expected)
    assert report["data"]["manifests"] == [str(root / "run" / MANIFEST)]
    md = (root / "eval" / "report.md").read_text()
    assert f"{len(candidates) - len(expected)} left out as training documents" in md


def test_documents_all_scores_a_disjoint_folder_whole_and_leaves_out_copies(trained_on_files, rng):
    """eval.documents=all: a folder the model never saw is scored whole; training documents copied into another
    folder under other names (and with other line breaks) are recognized by content, left out and counted."""
    root, _, trained = trained_on_files
    tag = rng.randrange(10**6)  # each parametrized run its own folders
    fresh_folder, mixed_folder = root / f"fresh{tag}", root / f"mixed{tag}"
    fresh = write_documents(fresh_folder, rng, 4)
    copied = rng.sample(sorted(trained), 3)
    mixed_folder.mkdir()
    for i, text in enumerate(copied):
        (mixed_folder / f"copy{i}.txt").write_text(text.replace(" ", "\n", 5))
    for name, text in fresh.items():
        (mixed_folder / name).write_text(text)
    checkpoint = f"eval.checkpoint={root / 'run'}"

    whole = eval_on(root, fresh_folder, checkpoint, "eval.documents=all")
    assert sorted(scored_ids(whole)) == sorted(str(fresh_folder / name) for name in fresh)
    assert whole["data"]["excluded_training"] == 0

    mixed = eval_on(root, mixed_folder, checkpoint, "eval.documents=all")
    assert sorted(scored_ids(mixed)) == sorted(str(mixed_folder / name) for name in fresh)
    assert mixed["data"]["excluded_training"] == len(copied) and mixed["data"]["scope"] == "all"


def test_a_folder_of_training_documents_alone_is_refused_by_name(trained_on_files, rng):
    root, _, trained = trained_on_files
    folder = root / f"copies{rng.randrange(10**6)}"
    folder.mkdir()
    for i, text in enumerate(rng.sample(sorted(trained), 2)):
        (folder / f"copy{i}.txt").write_text(text)
    with pytest.raises(ValueError, match=r"^data: all 2 candidate documents were trained on \(named in .*run/"):
        eval_on(root, folder, f"eval.checkpoint={root / 'run'}", "eval.documents=all")


def test_eval_documents_is_checked(runs):
    with pytest.raises(ConfigError, match=r"eval\.documents"):
        evaluate(compose("eval", overrides(runs, "eval.documents=everything")))


def test_a_streamed_run_is_kept_out_by_its_hash_rule(trained_on_files):
    """A streamed run's manifest holds its hash rule: evaluated on its folder in memory, with every document asked
    for, exactly the documents its rule held out are scored."""
    from legalpt.train.trainer import train

    root, texts, _ = trained_on_files
    run = root / "streamed"
    rule = ["data.streaming=true", "data.heldout_fraction=0.4", "data.seed=3", "data.stream_heldout_rows=2"]
    steps = ["train.steps=1", "train.warmup_steps=0", "train.eval_every=1", "train.save_every=1"]
    train(
        compose("train", files_overrides(root / "opinions", root / "cache", *rule, *steps, f"train.output_dir={run}"))
    )
    report = eval_on(root, root / "opinions", f"eval.checkpoint={run}", "eval.documents=all")
    held_out = sorted(str(root / "opinions" / name) for name, text in texts.items() if in_heldout(text, 0.4, 3))
    assert 0 < len(held_out) < len(texts)
    assert sorted(scored_ids(report)) == held_out
    assert report["data"]["excluded_training"] == len(texts) - len(held_out)
