"""Evaluation during training (legalpt.train.live_eval) on a small corpus of opinions that cite cases: logged at its
steps, the same items every time, equal to what legalpt-eval reports for the export, training untouched by it, a
resume scoring the same set, two DDP or FSDP2 ranks, and the settings it cannot run with named."""

import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest
import torch
from accelerate import Accelerator
from train_helpers import tiny_overrides
from transformers import AutoModelForCausalLM

import legalpt.eval.run as eval_run
import legalpt.train.live_eval as live_eval
import legalpt.train.trainer as trainer
from legalpt.config import ConfigError, compose, to_config
from legalpt.data.pipeline import prepare
from legalpt.eval.generate import GenerationResult
from legalpt.eval.run import EvalSet, evaluate, heldout_documents, score_citations
from legalpt.model import build_model
from legalpt.train.tracking import logged

# (case name, volume, reporter, page, year): the cases the opinions cite, each several times over the corpus
CASES = [
    ("Smith v. Jones", "410", "U.S.", "113", 1973),
    ("Brown v. Board of Education", "347", "U.S.", "483", 1954),
    ("Miller v. Davis", "52", "F.3d", "1012", 1995),
    ("Garcia v. Lopez", "221", "F.2d", "87", 1955),
    ("Baker v. Carr", "369", "U.S.", "186", 1962),
    ("Wilson v. Thomas", "88", "A.2d", "441", 1952),
    ("Taylor v. Moore", "634", "P.3d", "210", 2010),
    ("Anderson v. White", "15", "N.E.2d", "903", 1938),
]
WORDS = [
    *("the", "court", "finds", "that", "plaintiff", "defendant", "contract", "agreement", "breach", "notice"),
    *("damages", "statute", "claim", "held", "appeal", "record", "evidence", "jury", "trial", "motion", "granted"),
    *("denied", "reversed", "remanded", "under", "provision", "clause", "party", "duty", "liability", "standard"),
    *("review", "reasonable", "fact", "law", "issue", "argument", "order", "judgment"),
]
LIVE = ("train.eval_citations=5", "train.eval_documents=3", "train.eval_documents_every=2")
METRICS = ("eval/citation_exact", "eval/citation_well_formed", "eval/citation_fabricated", "eval/bits_per_byte")


def opinion(rng: random.Random) -> str:
    """Sentences of random legal words, each second one citing a case (its full form, or Id. after one)."""
    sentences = []
    for _ in range(rng.randint(8, 12)):
        sentence = " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 16))).capitalize() + "."
        if rng.random() < 0.5:
            name, volume, reporter, page, year = rng.choice(CASES)
            sentence += f" See {name}, {volume} {reporter} {page} ({year})."
            if rng.random() < 0.3:
                sentence += f" The {rng.choice(WORDS)} was {rng.choice(WORDS)}. Id. at {int(page) + 2}."
        sentences.append(sentence)
    return "OPINION\n\n" + " ".join(sentences) + "\n"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """16 opinions as text files; a fixed seed, since the module's runs share them."""
    folder = tmp_path_factory.mktemp("opinions")
    rng = random.Random(35)
    for number in range(16):
        (folder / f"opinion_{number:02d}.txt").write_text(opinion(rng))
    return folder


def data_overrides(corpus) -> list[str]:
    """The corpus, its split, and short prompts and continuations."""
    return [
        "data.synthetic_documents=0",
        f"data.paths=[{corpus}]",
        "data.heldout_fraction=0.25",
        "eval.citations.prompt_tokens=32",
        "eval.generation.max_new_tokens=12",
    ]


def run_overrides(tmp_path, corpus, name: str, *extra: str) -> list[str]:
    """A tiny run of 6 steps in rows of two: held-out loss at 0, 3 and 6; `extra` last."""
    data = data_overrides(corpus)
    return tiny_overrides(tmp_path, "train.batch_size=2", *data, f"train.output_dir={tmp_path / name}", *extra)


def random_states() -> tuple:
    """Python's, NumPy's and torch's random states, comparable with ==."""
    return random.getstate(), np.random.get_state()[1].tolist(), torch.get_rng_state().tolist()


@pytest.fixture(scope="module")
def live_run(corpus, tmp_path_factory):
    """A run with the live evaluation on, recording the prompts of each evaluation and whether each left the random
    states of training as it found them."""
    tmp_path = tmp_path_factory.mktemp("live")
    prompts, states_kept = [], []
    real_generate, real_evaluate = live_eval.generate, live_eval.LiveEval.evaluate

    def recording_generate(model, tokenizer, batch, *args, **kwargs):
        prompts.append(list(batch))
        return real_generate(model, tokenizer, batch, *args, **kwargs)

    def checked_evaluate(self, model, accelerator):
        before = random_states()
        values = real_evaluate(self, model, accelerator)
        states_kept.append(random_states() == before)
        return values

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(live_eval, "generate", recording_generate)
        patch.setattr(live_eval.LiveEval, "evaluate", checked_evaluate)
        result = trainer.train(compose("train", run_overrides(tmp_path, corpus, "live", *LIVE)))
    return tmp_path, result, prompts, states_kept


def test_metrics_are_logged_at_their_steps_on_one_fixed_set(live_run):
    _, result, prompts, states_kept = live_run
    for key in METRICS:
        assert [step for step, _ in logged(result.run_dir, key)] == [0, 2, 4, 6], key
    for key in METRICS[:3]:
        assert all(0 <= value <= 1 for _, value in logged(result.run_dir, key)), key
    assert all(0 < value < 16 for _, value in logged(result.run_dir, "eval/bits_per_byte"))
    assert [step for step, _ in result.eval_losses] == [0, 3, 6]  # train.eval_every is unchanged

    # The run folder names the items; every evaluation generated after exactly their prompts.
    items = EvalSet.load(result.run_dir / live_eval.LIVE_SET).citation_items
    assert len(items) == 5 and len({item.id for item in items}) == 5
    assert prompts == [[item.prompt for item in items]] * 4
    assert states_kept == [True] * 4
    bits = [value for _, value in logged(result.run_dir, "eval/bits_per_byte")]
    assert bits[-1] < bits[0]  # the model learns the corpus


def test_the_last_step_equals_legalpt_eval_on_the_export(live_run, corpus, tmp_path):
    run_tmp, result, _, _ = live_run
    final = {key: logged(result.run_dir, key)[-1][1] for key in METRICS}
    common = [
        "model=tiny",
        "logger=none",
        *data_overrides(corpus),
        "data.seq_len=128",
        "data.vocab_size=400",
        f"data.cache_dir={run_tmp / 'cache'}",
        f"eval.checkpoint={result.run_dir}",
        "eval.bootstrap=0",
    ]
    citing = ["eval.tasks=[citations]", "eval.citations.max_items=5", f"eval.output_dir={tmp_path}"]
    cited = evaluate(compose("eval", [*common, *citing]))
    # legalpt-eval drew the same items on its own, from the same held-out documents
    drawn = EvalSet.load(tmp_path / "eval_set.jsonl").citation_items
    assert drawn == EvalSet.load(result.run_dir / live_eval.LIVE_SET).citation_items
    summary = next(iter(cited["checkpoints"].values()))["citations"]
    for name in ("exact", "well_formed", "fabricated"):
        assert final[f"eval/citation_{name}"] == pytest.approx(combined_mean(summary, name), abs=1e-12), name

    scoring = ["eval.tasks=[perplexity]", "eval.max_documents=3", f"eval.output_dir={tmp_path}"]
    scored = evaluate(compose("eval", [*common, *scoring]))
    everything = next(iter(scored["checkpoints"].values()))["perplexity"]["by_kind"]["all"]
    assert everything["documents"] == 3
    assert final["eval/bits_per_byte"] == pytest.approx(everything["bits_per_byte"], rel=1e-9)


def test_training_is_the_same_without_it(live_run, corpus):
    run_tmp, result, _, _ = live_run
    plain = trainer.train(compose("train", run_overrides(run_tmp, corpus, "plain")))
    for key in ("train/loss", "train/grad_norm", "train/tokens", "eval/loss"):
        assert logged(plain.run_dir, key) == logged(result.run_dir, key), key
    assert not logged(plain.run_dir, "eval/citation_exact")
    a = AutoModelForCausalLM.from_pretrained(plain.export_dir).state_dict()
    b = AutoModelForCausalLM.from_pretrained(result.export_dir).state_dict()
    assert all(torch.equal(a[name], b[name]) for name in a)


def test_citation_metrics_count_what_was_written(corpus, tmp_path, monkeypatch):
    """Generations written by hand: every third prompt continued by its true text, every third by a citation that
    no opinion makes, the rest by words. The live means are those shares, and legalpt-eval's scorer agrees."""
    cfg = to_config(compose("train", run_overrides(tmp_path, corpus, "unit", *LIVE)))
    data = prepare(cfg.data)
    model = build_model(cfg.model, data.tokenizer)
    accelerator = Accelerator()
    live = live_eval.LiveEval.start(cfg, data.tokenizer, accelerator, tmp_path)
    texts = [path.read_text() for path in corpus.iterdir()]
    true_text = {p: next(t.split(p, 1)[1][:40] for t in texts if p in t) for p in (i.prompt for i in live.items)}
    prompts = sorted(true_text)
    written = {p: (true_text[p], " 999 U.S. 999 (1999).", " the court finds")[i % 3] for i, p in enumerate(prompts)}
    shares = [len(range(k, len(prompts), 3)) / len(prompts) for k in range(3)]  # copied, fabricated, words

    monkeypatch.setattr(live_eval, "generate", lambda model, tokenizer, batch, *_, **__: [written[p] for p in batch])
    values = live.evaluate(model, accelerator)
    assert values["eval/citation_exact"] == pytest.approx(shares[0])
    assert values["eval/citation_well_formed"] == pytest.approx(shares[0] + shares[1])
    assert values["eval/citation_fabricated"] == pytest.approx(shares[1])

    def written_with_stats(model, tokenizer, batch, *args, **kwargs):
        ones = [1] * len(batch)
        return GenerationResult([written[p] for p in batch], ones, ones, [0] * len(batch), 1.0)

    monkeypatch.setattr(eval_run, "generate_with_stats", written_with_stats)
    documents, _ = heldout_documents(cfg.data, cfg.eval.max_documents)
    summary = score_citations(model, data.tokenizer, documents, EvalSet(live.items, [], {}), cfg.eval)
    for name in ("exact", "well_formed", "fabricated"):
        mean = combined_mean(summary, name)
        assert values[f"eval/citation_{name}"] == pytest.approx(mean, abs=1e-12), name


def test_documents_without_citations_log_bits_per_byte_alone(tmp_path, caplog):
    folder = tmp_path / "uncited"
    folder.mkdir()
    rng = random.Random(7)
    for number in range(8):  # opinions whose sentences cite nothing
        text = " ".join(" ".join(rng.choice(WORDS) for _ in range(12)).capitalize() + "." for _ in range(10))
        (folder / f"opinion_{number}.txt").write_text("OPINION\n\n" + text + "\n")
    cfg = to_config(compose("train", run_overrides(tmp_path, folder, "unit", *LIVE)))
    data = prepare(cfg.data)
    accelerator = Accelerator()
    live = live_eval.LiveEval.start(cfg, data.tokenizer, accelerator, tmp_path)
    assert live.items == [] and len(live.documents) == 2  # 8 documents: 2 held out
    assert "train.eval_citations=5: the held-out documents hold 0 citation items; no citation metrics" in caplog.text
    values = live.evaluate(build_model(cfg.model, data.tokenizer), accelerator)
    assert list(values) == ["eval/bits_per_byte"] and 0 < values["eval/bits_per_byte"] < 16


def combined_mean(summary: dict, name: str) -> float:
    """The mean of metric `name` over every item of a legalpt-eval citation summary (full and short forms)."""
    groups = [summary[group] for group in ("full", "short_forms") if summary[group]["items"]]
    return sum(g["metrics"][name]["mean"] * g["items"] for g in groups) / sum(g["items"] for g in groups)


@pytest.mark.slow
def test_a_resume_scores_the_same_set(live_run, corpus, train_until_first_checkpoint):
    run_tmp, result, _, _ = live_run
    overrides = run_overrides(run_tmp, corpus, "resumed", *LIVE)
    train_until_first_checkpoint(compose("train", overrides))
    resumed = trainer.train(compose("train", overrides))
    assert (resumed.run_dir / live_eval.LIVE_SET).read_text() == (result.run_dir / live_eval.LIVE_SET).read_text()
    for key in METRICS:
        assert logged(resumed.run_dir, key) == logged(result.run_dir, key), key


@pytest.mark.slow
@pytest.mark.parametrize("distributed", ["ddp", "fsdp2"])
def test_two_ranks_agree_with_one_process(live_run, corpus, distributed):
    """5 items and 3 documents over two CPU processes (gloo), one prompt and one window per forward. DDP: uneven
    shares (3 and 2 items), one reduce. FSDP2: every forward gathers from both ranks, so each rank scores the whole
    set, forward for forward with the other (shares would leave one rank waiting in a gather the other never makes).
    Before the first step both runs hold the same initial weights, so the step-0 numbers equal the one-process run's."""
    run_tmp, result, _, _ = live_run
    run_dir = run_tmp / distributed
    one_per_forward = ("eval.generation.batch_size=1", "eval.batch_size=1")
    overrides = run_overrides(run_tmp, corpus, distributed, *LIVE, *one_per_forward, "train.batch_size=1",
                              "train.steps=2", f"train.distributed={distributed}")  # fmt: skip
    script = run_tmp / "legalpt_train.py"
    script.write_text("import sys\nfrom legalpt.cli import train_main\nsys.argv[0] = 'legalpt-train'\ntrain_main()\n")
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script)]
    launched = subprocess.run([*command, *overrides], capture_output=True, text=True, env=env, timeout=600)
    assert launched.returncode == 0, launched.stdout[-3000:] + launched.stderr[-6000:]
    for key in METRICS:
        assert [step for step, _ in logged(run_dir, key)] == [0, 2], key
        assert logged(run_dir, key)[0][1] == pytest.approx(logged(result.run_dir, key)[0][1], rel=1e-6), key
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert sum("eval/citation_exact" in line for line in lines) == 2  # rank 0 alone writes


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["train.eval_citations=-1"], "train.eval_citations"),
        (["train.eval_documents=-1"], "train.eval_documents"),
        (["train.eval_documents_every=-2"], "train.eval_documents_every"),
        (["train.eval_documents=2", "data=sft_example"], "data.format"),
        (["train.eval_citations=4", "data.streaming=true"], "eval.max_documents"),
    ],
)
def test_settings_it_cannot_run_with_are_named(overrides, key):
    with pytest.raises(ConfigError, match="^" + key.replace(".", r"\.") + ": expected"):
        to_config(compose("train", ["model=tiny", *overrides]))
