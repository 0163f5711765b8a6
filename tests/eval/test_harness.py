"""lm-evaluation-harness tasks in `legalpt-eval`, offline: tiny tasks written here (task YAMLs over local JSONL: a
multiple-choice group, and a generation task whose answers are the base checkpoint's own greedy continuations),
scored on two tiny random checkpoints and checked against log-likelihoods and generations computed with each model
directly; names checked before loading; the forgetting table; lm-eval never imported by importing legalpt."""

import json
import math
import random
import re
import statistics
import subprocess
import sys

import pytest
import torch
from eval_helpers import FIRST_ANSWER, VOCAB, local_task, make_tokenizer, metrics
from transformers import AutoModelForCausalLM

from legalpt.config import ConfigError, EvalConfig, HarnessConfig, compose, to_config
from legalpt.eval import harness
from legalpt.eval.report import log_to_wandb, markdown
from legalpt.eval.run import check_tasks, evaluate
from legalpt.model import build_model

WORDS = [f"w{i}" for i in range(VOCAB - 4)]  # every word a token of make_tokenizer's vocabulary
GROUP = """group: tiny_suite
task: [tiny_three, tiny_two]
aggregate_metric_list:
  - metric: acc
    aggregation: mean
    weight_by_size: true
metadata:
  version: 1.0
"""
ITEMS = 8  # per task; the harness runs on the first LIMIT of them
LIMIT = 6
NEW_TOKENS = 3  # generated per answer


def choice_task(name: str, data) -> str:
    """A multiple-choice task over items {question, choices, label} in `data`."""
    return local_task(
        name,
        {"test": data},
        output_type="multiple_choice",
        doc_to_text="{{question}}",
        doc_to_choice="{{choices}}",
        doc_to_target="{{label}}",
        metric_list=metrics("acc", "acc_norm"),
    )


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, tiny_model_config):
    """Two tiny random checkpoints (base and new) with the word-level tokenizer; untied embeddings, as tied random
    ones continue any text by repeating its last word, whatever the seed."""
    root = tmp_path_factory.mktemp("checkpoints")
    tokenizer = make_tokenizer(bos=True)
    for name, seed in (("base", 0), ("new", 1)):
        torch.manual_seed(seed)
        build_model(tiny_model_config(tie_word_embeddings=False), tokenizer).save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    return root


def load_eager(checkpoint):
    """The checkpoint through transformers alone, on its eager attention (not legalpt's)."""
    return AutoModelForCausalLM.from_pretrained(checkpoint, attn_implementation="eager").eval()


def greedy_answer(model, tokenizer, question: str) -> str:
    ids = torch.tensor([tokenizer(question)["input_ids"]])  # starts with <s>
    out = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    return tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)


@pytest.fixture(scope="module")
def suite(tmp_path_factory, checkpoints):
    """A folder with two multiple-choice tasks (3 and 2 choices of 1 to 3 words), a group of both, and a generation
    task whose answers are the base checkpoint's greedy words; task name -> items."""
    seed = random.randrange(2**32)
    print(f"seed={seed}")
    rng = random.Random(seed)
    folder = tmp_path_factory.mktemp("harness_tasks")
    items = {}
    for name, choices in (("tiny_three", 3), ("tiny_two", 2)):
        items[name] = [
            {
                "question": " ".join(rng.choices(WORDS, k=rng.randint(3, 8))),
                "choices": [" ".join(rng.choices(WORDS, k=rng.randint(1, 3))) for _ in range(choices)],
                "label": rng.randrange(choices),
            }
            for _ in range(ITEMS)
        ]
        data = folder / f"{name}.jsonl"
        data.write_text("".join(json.dumps(item) + "\n" for item in items[name]))
        (folder / f"{name}.yaml").write_text(choice_task(name, data))
    (folder / "tiny_suite.yaml").write_text(GROUP)
    base, tokenizer = load_eager(checkpoints / "base"), make_tokenizer(bos=True)
    items["tiny_gen"] = []
    while len(items["tiny_gen"]) < ITEMS:  # answers of words only: a special token would be cut from the text
        question = " ".join(rng.choices(WORDS, k=rng.randint(3, 8)))
        answer = greedy_answer(base, tokenizer, question)
        if len(answer.split()) == NEW_TOKENS:
            items["tiny_gen"].append({"question": question, "answer": answer})
    data = folder / "tiny_gen.jsonl"
    data.write_text("".join(json.dumps(item) + "\n" for item in items["tiny_gen"]))
    generation = {"until": ["\n"], "do_sample": False, "max_gen_toks": NEW_TOKENS}
    (folder / "tiny_gen.yaml").write_text(
        local_task(
            "tiny_gen",
            {"test": data},
            output_type="generate_until",
            doc_to_text="{{question}}",
            doc_to_target="{{answer}}",
            generation_kwargs=generation,
            filter_list=FIRST_ANSWER,
            metric_list=metrics("exact_match"),
        )
    )
    return folder, items


def choice_logliks(model, tokenizer, item: dict) -> list[float]:
    """Summed log-probability of each choice's tokens after <s> + the question's, from one forward pass each."""
    context = tokenizer(item["question"])["input_ids"]  # starts with <s>
    scores = []
    for choice in item["choices"]:
        continuation = tokenizer(choice, add_special_tokens=False)["input_ids"]
        ids = torch.tensor([context + continuation])
        with torch.no_grad():
            logprobs = model(ids).logits[0, :-1].float().log_softmax(-1)
        targets = ids[0, len(context) :]
        scores.append(logprobs[len(context) - 1 :].gather(-1, targets[:, None]).sum().item())
    return scores


def expected_scores(checkpoint, items: list[dict]) -> dict[str, list[float]]:
    """Per item, whether the argmax choice is the label: by summed log-likelihood (acc) and by log-likelihood per
    character of the choice (acc_norm), with eager attention rather than legalpt's."""
    model, tokenizer = load_eager(checkpoint), make_tokenizer(bos=True)
    correct = {"acc": [], "acc_norm": []}
    for item in items:
        scores = choice_logliks(model, tokenizer, item)
        per_char = [s / len(c) for s, c in zip(scores, item["choices"], strict=True)]
        correct["acc"].append(float(max(range(len(scores)), key=scores.__getitem__) == item["label"]))
        correct["acc_norm"].append(float(max(range(len(scores)), key=per_char.__getitem__) == item["label"]))
    return correct


def harness_overrides(folder, out, *extra: str) -> list[str]:
    return [
        "model=tiny",
        "logger=none",
        "eval.tasks=[harness]",
        f"eval.harness.include_path={folder}",
        f"eval.output_dir={out}",
        *extra,
    ]


def test_harness_numbers_equal_direct_loglikelihoods_and_fill_the_report(suite, checkpoints, tmp_path):
    folder, items = suite
    report = evaluate(
        compose(
            "eval",
            harness_overrides(
                folder,
                tmp_path,
                f"eval.checkpoint={checkpoints / 'base'}",
                f"eval.compare={checkpoints / 'new'}",
                "eval.harness.tasks=[tiny_suite,tiny_gen]",
                f"eval.harness.limit={LIMIT}",
                "eval.bootstrap=10",
            ),
        )
    )
    saved = json.loads((tmp_path / "report.json").read_text())
    md = (tmp_path / "report.md").read_text()
    import lm_eval

    expected_acc, cells = {}, []
    for name in ("base", "new"):
        result = saved["checkpoints"][str(checkpoints / name)]["harness"]
        assert result["lm_eval_version"] == lm_eval.__version__ and result["limit"] == LIMIT
        assert result["attn_implementation"] == "legalpt"
        pooled = []
        for task in ("tiny_three", "tiny_two"):
            row = result["tasks"][task]
            correct = expected_scores(checkpoints / name, items[task][:LIMIT])
            assert row["examples"] == LIMIT and row["num_fewshot"] == 0
            for metric, values in correct.items():
                assert row["metrics"][metric] == pytest.approx(statistics.mean(values))
                assert row["stderr"][metric] == pytest.approx(statistics.stdev(values) / math.sqrt(LIMIT))
            pooled += correct["acc"]
        group = result["tasks"]["tiny_suite"]
        assert group["subtasks"] == ["tiny_three", "tiny_two"] and group["examples"] == 2 * LIMIT
        assert group["metrics"]["acc"] == pytest.approx(statistics.mean(pooled))
        expected_acc[name] = statistics.mean(pooled)
        model, tokenizer = load_eager(checkpoints / name), make_tokenizer(bos=True)
        answers = [greedy_answer(model, tokenizer, item["question"]) == item["answer"] for item in items["tiny_gen"]]
        generation = result["tasks"]["tiny_gen"]
        assert generation["metrics"] == {"exact_match,get-answer": pytest.approx(statistics.mean(answers[:LIMIT]))}
        cells.append(f"{group['metrics']['acc']:.4g} ± {group['stderr']['acc']:.2g}")

    assert saved["forgetting"] == report["forgetting"]
    (suite_acc,) = [row for row in saved["forgetting"] if (row["task"], row["metric"]) == ("tiny_suite", "acc")]
    assert suite_acc["base"] == pytest.approx(expected_acc["base"])
    assert suite_acc["new"] == pytest.approx(expected_acc["new"])
    assert suite_acc["delta"] == pytest.approx(expected_acc["new"] - expected_acc["base"])
    assert suite_acc["worse"] == (expected_acc["new"] < expected_acc["base"])
    assert {(row["task"], row["metric"]) for row in saved["forgetting"]} == {
        (task, metric) for task in ("tiny_three", "tiny_two") for metric in ("acc", "acc_norm")
    } | {("tiny_suite", "acc"), ("tiny_gen", "exact_match,get-answer")}
    (answers,) = [row for row in saved["forgetting"] if row["task"] == "tiny_gen"]
    assert answers["base"] == 1.0 and answers["worse"] == (answers["new"] < 1.0)  # its own answers, to the base
    assert "## harness" in md and f"lm-eval {lm_eval.__version__}" in md and "Forgetting: Δ" in md
    worse = " *worse*" if suite_acc["worse"] else ""
    assert f"| tiny_suite | acc | 0 | {cells[0]} | {cells[1]} | {suite_acc['delta']:+.4g}{worse} |" in md


def test_logged_samples_hold_each_prompt_answer_and_score(suite, checkpoints, tmp_path):
    folder, items = suite
    overrides = harness_overrides(
        folder, tmp_path, f"eval.checkpoint={checkpoints / 'new'}", "eval.harness.tasks=[tiny_gen]",
        f"eval.harness.limit={LIMIT}", "eval.harness.log_samples=true",
    )  # fmt: skip
    evaluate(compose("eval", overrides))
    result = json.loads((tmp_path / "report.json").read_text())["checkpoints"][str(checkpoints / "new")]["harness"]
    rows = sorted(result["samples"]["tiny_gen"], key=lambda row: row["doc_id"])
    model, tokenizer = load_eager(checkpoints / "new"), make_tokenizer(bos=True)
    assert [row["doc_id"] for row in rows] == list(range(LIMIT))
    for row, item in zip(rows, items["tiny_gen"], strict=False):
        answer = greedy_answer(model, tokenizer, item["question"])
        assert row["prompt"] == item["question"] and row["target"] == item["answer"]
        assert row["filtered_resps"] == [answer.strip()]  # generation stops at NEW_TOKENS, whitespace removed
        assert row["metrics"] == {"exact_match": float(answer.strip() == item["answer"])}
    assert result["tasks"]["tiny_gen"]["metrics"]["exact_match,get-answer"] == pytest.approx(
        statistics.mean(row["metrics"]["exact_match"] for row in rows)
    )


def test_harness_alone_reads_no_corpus(suite, checkpoints, tmp_path):
    folder, _ = suite
    missing = tmp_path / "no_corpus"
    overrides = [
        "model=tiny",
        "logger=none",
        "data=files",
        f"data.paths=[{missing}]",
        f"eval.checkpoint={checkpoints / 'base'}",
        f"eval.output_dir={tmp_path / 'eval'}",
        f"eval.harness.include_path={folder}",
        "eval.harness.tasks=[tiny_two]",
        "eval.harness.limit=2",
    ]
    report = evaluate(compose("eval", [*overrides, "eval.tasks=[harness]"]))
    assert report["checkpoints"][str(checkpoints / "base")]["harness"]["tasks"]["tiny_two"]["examples"] == 2
    assert "data" not in report and "eval_set" not in report
    assert not (tmp_path / "eval" / "eval_set.jsonl").exists()
    assert "documents scored" not in (tmp_path / "eval" / "report.md").read_text()
    with pytest.raises(FileNotFoundError, match=rf"^data\.paths: '{re.escape(str(missing))}' does not exist"):
        evaluate(compose("eval", [*overrides, "eval.tasks=[harness,citations]"]))


def test_unreadable_task_data_fails_before_a_model_loads(checkpoints, tmp_path, monkeypatch):
    folder = tmp_path / "tasks"
    folder.mkdir()
    (folder / "lost.yaml").write_text(choice_task("lost", "lost.jsonl"))  # relative: to the working dir
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("legalpt.eval.run.build_model", lambda *args: pytest.fail("a model was loaded"))
    overrides = [f"eval.checkpoint={checkpoints / 'base'}", "eval.harness.tasks=[lost]"]
    with pytest.raises(ValueError, match=r"^eval\.harness\.tasks: a task's data cannot be read: .*lost\.jsonl"):
        evaluate(compose("eval", harness_overrides(folder, tmp_path / "eval", *overrides)))


def test_unknown_task_names_fail_before_loading_with_how_to_list(suite):
    folder, _ = suite
    cfg = EvalConfig(
        tasks=["harness"], harness=HarnessConfig(tasks=["tiny_two", "no_such_task"], include_path=str(folder))
    )
    with pytest.raises(ValueError, match=r"^eval\.harness\.tasks: unknown \['no_such_task'\] .*`lm-eval ls tasks`"):
        check_tasks(cfg)
    cfg.harness.tasks = ["tiny_two", str(folder / "tiny_three.yaml")]  # a task YAML's path stands for its task
    assert check_tasks(cfg) == ["harness"]
    assert "harness" not in check_tasks(EvalConfig())  # off until harness tasks are named
    preset = to_config(compose("eval", ["eval=forgetting"])).eval
    preset.harness.include_path = str(folder)  # the task index already built
    assert check_tasks(preset) == ["harness"]  # every name in the preset is one the harness knows
    cfg.harness.include_path = str(folder / "missing")
    with pytest.raises(ValueError, match=r"^eval\.harness\.include_path: expected a folder"):
        check_tasks(cfg)


def test_a_chat_template_is_required_when_asked_for(checkpoints):
    tokenizer = make_tokenizer(bos=True)
    cfg = HarnessConfig(tasks=["tiny_two"], apply_chat_template=True)
    with pytest.raises(ValueError, match=r"^eval\.harness\.apply_chat_template: .* no chat template"):
        harness.run_harness(None, tokenizer, cfg, batch_size=1, bootstrap=0)


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("limit", 1.5, "None, a whole number >= 1 or a fraction in (0, 1)"),
        ("limit", 0.0, "None, a whole number >= 1 or a fraction in (0, 1)"),
        ("num_fewshot", -1, "an integer >= 0"),
        ("batch_size", 0, "an integer >= 1"),
        ("tasks", ["mmlu", ""], "a list of task names"),
    ],
)
def test_harness_settings_are_checked(field, value, expected):
    with pytest.raises(ConfigError, match=rf"^eval\.harness\.{field}: expected {re.escape(expected)}"):
        EvalConfig(harness=HarnessConfig(**{field: value})).validate()


def harness_result(**tasks) -> dict:
    """A checkpoint's harness summary with these tasks, each {metric: (value, stderr)} plus higher_is_better."""
    return {
        "harness": {
            "lm_eval_version": "0.4.13",
            "limit": None,
            "num_fewshot": None,
            "apply_chat_template": False,
            "attn_implementation": "legalpt",
            "dtype": "torch.float32",
            "tasks": {
                name: {
                    "metrics": {metric: value for metric, (value, _) in metrics.items()},
                    "stderr": {metric: error for metric, (_, error) in metrics.items()},
                    "examples": 100,
                    "num_fewshot": 5,
                    "version": "1.0",
                    "higher_is_better": {"acc": True, "word_perplexity": False, "exact_match": True},
                }
                for name, metrics in tasks.items()
            },
        }
    }


def test_forgetting_table_lines_up_two_reports(tmp_path, monkeypatch):
    base = harness_result(
        mmlu_professional_law={"acc": (0.40, 0.01)},
        wikitext={"word_perplexity": (20.0, 0.5)},
        gsm8k={"exact_match,strict-match": (0.30, 0.02)},
    )
    new = harness_result(
        mmlu_professional_law={"acc": (0.46, 0.01)},
        wikitext={"word_perplexity": (23.0, 0.5)},
        gsm8k={"exact_match,strict-match": (0.25, 0.02)},
    )
    results = {"base/hf": base, "legal/hf": new}
    rows = {(r["task"], r["metric"]): r for r in harness.forgetting(results)}
    law = rows["mmlu_professional_law", "acc"]
    assert (law["base"], law["new"], law["delta"], law["worse"]) == (0.40, 0.46, pytest.approx(0.06), False)
    perplexity = rows["wikitext", "word_perplexity"]  # lower is better: a rise is forgetting
    assert (perplexity["delta"], perplexity["worse"]) == (pytest.approx(3.0), True)
    gsm = rows["gsm8k", "exact_match,strict-match"]
    assert (gsm["delta"], gsm["worse"]) == (pytest.approx(-0.05), True)

    report = {
        "checkpoints": results,
        "data": {"scope": "heldout", "documents": 1, "excluded_training": 0},
        "eval_set": {"path": "eval_set.jsonl"},
        "forgetting": list(rows.values()),
        "config": {},
    }
    md = markdown(report)
    assert "| mmlu_professional_law | acc | 5 | 0.4 ± 0.01 | 0.46 ± 0.01 | +0.06 |" in md
    assert "| wikitext | word_perplexity | 5 | 20 ± 0.5 | 23 ± 0.5 | +3 *worse* |" in md
    assert "| gsm8k | exact_match,strict-match | 5 | 0.3 ± 0.02 | 0.25 ± 0.02 | -0.05 *worse* |" in md

    logged = _record_wandb(monkeypatch)
    log_to_wandb(report, [], tmp_path, "legalpt")
    table = logged["harness_forgetting"]
    assert table.columns == ["task", "metric", "base", "new", "delta", "worse"] and len(table.data) == 3
    assert logged["summary"]["checkpoint2/harness/tasks/wikitext/metrics/word_perplexity"] == 23.0
    assert logged["summary"]["checkpoint1/harness/lm_eval_version"] == "0.4.13"


def _record_wandb(monkeypatch) -> dict:
    """wandb.init replaced by a run that keeps what is logged (the summary under "summary")."""
    import wandb

    logged: dict = {"summary": {}}

    class Run:
        summary = logged["summary"]

        def log(self, values: dict) -> None:
            logged.update(values)

        def finish(self) -> None:
            pass

    monkeypatch.setattr(wandb, "init", lambda **kwargs: Run())
    return logged


def test_importing_legalpt_does_not_import_lm_eval():
    code = "import sys, legalpt, legalpt.cli, legalpt.eval.run; assert 'lm_eval' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
