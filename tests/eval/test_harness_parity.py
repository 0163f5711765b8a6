"""Parity of `legalpt-eval`'s harness task with lm-evaluation-harness's own CLI: the same LegalBench-style tasks (a
classification answered by generation, as LegalBench's are, and the same as multiple choice; few-shot examples from
a train split and an instruction, over local JSONL) on the same tiny checkpoint, with the same few-shot count and
batch size. With the CLI's attention (sdpa) at float32 every number is equal; on legalpt's attention each metric is
within one standard error of the CLI's."""

import json
import os
import random
import subprocess
import sys

import pytest
import torch
from eval_helpers import FIRST_ANSWER, VOCAB, local_task, make_tokenizer, metrics

from legalpt.config import compose
from legalpt.eval.run import evaluate
from legalpt.model import build_model

pytestmark = pytest.mark.slow

LABELS = ["w10", "w20"]  # the classes
WORDS = [f"w{i}" for i in range(4, VOCAB)]  # the word tokens of make_tokenizer's vocabulary
SHOTS = 3
BATCH = 4
GENERATION = {  # LegalBench's: greedy up to a line break, the first word, compared ignoring case and punctuation
    "output_type": "generate_until",
    "doc_to_target": "{{answer}}",
    "generation_kwargs": {"until": ["\n"], "do_sample": False, "temperature": 0.0, "max_gen_toks": 1},
    "filter_list": FIRST_ANSWER,
    "metric_list": metrics("exact_match", ignore_case=True, ignore_punctuation=True),
}
CHOICE = {
    "output_type": "multiple_choice",
    "doc_to_choice": LABELS,
    "doc_to_target": "{{answer}}",
    "metric_list": metrics("acc", "acc_norm"),
}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, tiny_model_config):
    """A tiny random checkpoint; its tied embeddings make it repeat a text's last word, so a text that ends in its
    label is answered right by generation."""
    folder = tmp_path_factory.mktemp("checkpoint")
    tokenizer = make_tokenizer(bos=True)
    torch.manual_seed(0)
    build_model(tiny_model_config(), tokenizer).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    """A folder with the two tasks' YAMLs over one train and one test JSONL of random texts, half ending in their
    label."""
    seed = random.randrange(2**32)
    print(f"seed={seed}")
    rng = random.Random(seed)
    folder = tmp_path_factory.mktemp("tasks")
    for split, count in (("train", 8), ("test", 24)):
        rows = []
        for _ in range(count):
            answer = rng.choice(LABELS)
            last = answer if rng.random() < 0.5 else rng.choice(WORDS)
            rows.append({"text": " ".join([*rng.choices(WORDS, k=rng.randint(3, 8)), last]), "answer": answer})
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    files = {split: folder / f"{split}.jsonl" for split in ("train", "test")}
    for name, fields in (("lb_generate", GENERATION), ("lb_choice", CHOICE)):
        # LegalBench's layout: an instruction, few-shot examples from the train split (5 unless overridden)
        task = local_task(
            name,
            files,
            fewshot_split="train",
            num_fewshot=5,
            description="w1 w2 w3\n\n",
            doc_to_text="{{text}}",
            target_delimiter=" ",
            **fields,
        )
        (folder / f"{name}.yaml").write_text(task)
    return folder


@pytest.fixture(scope="module")
def cli_results(checkpoint, tasks, tmp_path_factory):
    """The `results` of `lm_eval --model hf` on the checkpoint (float32, sdpa), from the JSON it writes."""
    out = tmp_path_factory.mktemp("cli")
    args = ["--model", "hf", "--model_args", f"pretrained={checkpoint},dtype=float32,attn_implementation=sdpa",
            "--tasks", "lb_generate,lb_choice", "--include_path", str(tasks), "--num_fewshot", str(SHOTS),
            "--batch_size", str(BATCH), "--device", "cpu", "--output_path", str(out)]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    subprocess.run([sys.executable, "-m", "lm_eval", *args], check=True, env=env, cwd=out)
    (path,) = out.glob("*/results_*.json")
    output = json.loads(path.read_text())
    assert output["n-shot"] == {"lb_generate": SHOTS, "lb_choice": SHOTS}
    return output["results"]


def legalpt_harness(checkpoint, tasks, out, *extra: str) -> dict:
    """The harness section of `legalpt-eval`'s report.json on the checkpoint, at float32 with eval.batch_size BATCH."""
    evaluate(
        compose(
            "eval",
            [
                "model=tiny",
                "logger=none",
                "train.mixed_precision=no",
                f"eval.checkpoint={checkpoint}",
                f"eval.output_dir={out}",
                "eval.tasks=[harness]",
                f"eval.batch_size={BATCH}",
                "eval.harness.tasks=[lb_generate,lb_choice]",
                f"eval.harness.include_path={tasks}",
                f"eval.harness.num_fewshot={SHOTS}",
                *extra,
            ],
        )
    )
    return json.loads((out / "report.json").read_text())["checkpoints"][str(checkpoint)]["harness"]


def cli_metrics(row: dict) -> tuple[dict, dict]:
    """A CLI results row's metrics and standard errors, keyed as legalpt's report keys them (filter `none` left
    out)."""
    metrics, errors = {}, {}
    for key, value in row.items():
        metric, _, filter_name = key.partition(",")
        if not filter_name:
            continue
        shown = metric.removesuffix("_stderr") + ("" if filter_name == "none" else f",{filter_name}")
        (errors if metric.endswith("_stderr") else metrics)[shown] = value
    return metrics, errors


def test_same_numbers_as_the_cli_on_the_same_attention(checkpoint, tasks, cli_results, tmp_path):
    harness = legalpt_harness(checkpoint, tasks, tmp_path, "model.attn_implementation=sdpa")
    assert harness["attn_implementation"] == "sdpa" and harness["dtype"] == "torch.float32"
    for name, row in cli_results.items():
        metrics, errors = cli_metrics(row)
        ours = harness["tasks"][name]
        assert ours["examples"] == row["sample_len"] == 24 and ours["num_fewshot"] == SHOTS
        assert ours["metrics"] == metrics and ours["stderr"] == errors
    assert 0 < cli_results["lb_generate"]["exact_match,get-answer"] < 1  # generations that differ would show


def test_legalpt_attention_is_within_noise_of_the_cli(checkpoint, tasks, cli_results, tmp_path):
    harness = legalpt_harness(checkpoint, tasks, tmp_path)
    assert harness["attn_implementation"] == "legalpt"
    for name, row in cli_results.items():
        metrics, errors = cli_metrics(row)
        ours = harness["tasks"][name]
        assert ours["metrics"].keys() == metrics.keys()
        for metric, value in metrics.items():
            assert abs(ours["metrics"][metric] - value) <= errors[metric], (name, metric)
