"""The README's recipe "Continued pretraining, then SFT with LoRA, on one GPU; base vs result", read from the README
and run command by command on a CPU: a tiny local checkpoint in place of the hub's, tiny sizes, and a local harness
task in place of the hub's. Checked: the SFT run adapts the continued export (not the base), and the comparison
scores both checkpoints on held-out opinions the continued run never trained on."""

import json
import shlex
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file
from train_helpers import tiny_overrides

import legalpt.train.trainer as trainer
from legalpt.config import DataConfig, compose
from legalpt.data.demo.corpus import generate_documents
from legalpt.data.demo.sft import generate_examples
from legalpt.data.pipeline import prepare
from legalpt.eval.run import evaluate
from legalpt.model import build_model

pytestmark = pytest.mark.slow

README = Path(__file__).parents[2] / "README.md"
RECIPE = "**Continued pretraining, then SFT with LoRA, on one GPU; base vs result**"
HUB_MODEL = "meta-llama/Llama-3.2-1B"
TINY_POSITIONS = 2048  # conf/model/tiny.yaml's max_position_embeddings
ADAPTED = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")  # train.lora's default


def recipe_commands() -> list[list[str]]:
    """The recipe's command lines, from its first bash block in the README."""
    text = README.read_text()
    block = text[text.index(RECIPE) :]
    start = block.index("```bash\n") + len("```bash\n")
    return [shlex.split(line) for line in block[start : block.index("```", start)].strip().splitlines()]


def tiny(command: list[str], base: Path, tmp_path: Path) -> list[str]:
    """The command's overrides with the local base for the hub's, tiny sizes and the local harness task."""
    program, *overrides = command
    settings = {o.partition("=")[0]: o.replace(HUB_MODEL, str(base)) for o in overrides}
    if program == "legalpt-train":  # rows as long as the recipe's, within the positions the tiny preset covers
        seq_len = min(int(settings["data.seq_len"].partition("=")[2]), TINY_POSITIONS)
        extra = tiny_overrides(tmp_path, "train.batch_size=2", f"data.seq_len={seq_len}", steps=4)
    else:
        extra = ["logger=none", "eval.max_documents=2", "eval.citations.max_items=4", "eval.bootstrap=10",
                 "eval.harness.tasks=[recipe_holding]", f"eval.harness.include_path={tmp_path / 'tasks'}"]  # fmt: skip
    settings.update({o.partition("=")[0]: o for o in extra})
    return [program, *settings.values()]


@pytest.fixture
def workdir(tmp_path, tiny_model_config, monkeypatch):
    """A folder holding the recipe's inputs: opinions/ (demo opinions), qa.jsonl (demo questions), a tiny base
    checkpoint with the demo corpus's tokenizer, and a harness task over the opinions."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "opinions").mkdir()
    documents = generate_documents(24, seed=1)
    for document in (d for d in documents if d["kind"] == "opinion"):
        (tmp_path / "opinions" / f"{document['id']}.txt").write_text(document["text"])
    (tmp_path / "qa.jsonl").write_text("".join(json.dumps(e) + "\n" for e in generate_examples(12, seed=2)))
    data = prepare(DataConfig(synthetic_documents=6, seq_len=128, vocab_size=400, cache_dir=str(tmp_path / "cache")))
    torch.manual_seed(0)
    build_model(tiny_model_config(), data.tokenizer).save_pretrained(tmp_path / "base")
    data.tokenizer.save_pretrained(tmp_path / "base")
    (tmp_path / "tasks").mkdir()
    items = [{"text": d["text"][:200], "answer": i % 2} for i, d in enumerate(documents[:6])]
    (tmp_path / "tasks" / "items.jsonl").write_text("".join(json.dumps(item) + "\n" for item in items))
    task = {"task": "recipe_holding", "dataset_path": "json", "test_split": "test", "output_type": "multiple_choice",
            "dataset_kwargs": {"data_files": {"test": str(tmp_path / "tasks" / "items.jsonl")}},
            "doc_to_text": "{{text}}\nHeld:", "doc_to_choice": ["reversed", "affirmed"], "doc_to_target": "{{answer}}",
            "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True}],
            "metadata": {"version": 1.0}}  # fmt: skip
    (tmp_path / "tasks" / "recipe_holding.yaml").write_text(yaml.safe_dump(task))
    return tmp_path


def test_continued_pretraining_then_lora_then_base_vs_result(workdir):
    cpt, lora, comparison = (tiny(command, workdir / "base", workdir) for command in recipe_commands())
    assert [cpt[0], lora[0], comparison[0]] == ["legalpt-train", "legalpt-train", "legalpt-eval"]
    trainer.train(compose("train", cpt[1:]))
    trainer.train(compose("train", lora[1:]))
    report = evaluate(compose("eval", comparison[1:]))

    folders = ("base", "runs/cpt/hf", "runs/lora/hf")
    base, continued, adapted = (load_file(workdir / folder / "model.safetensors") for folder in folders)
    assert any(not torch.equal(base[name], continued[name]) for name in base)
    for name, tensor in continued.items():  # LoRA merged into the continued weights, the others left as they were
        assert torch.equal(adapted[name], tensor) != (name.rsplit(".", 2)[-2] in ADAPTED), name

    assert list(report["checkpoints"]) == [str(workdir / "base"), "runs/lora/hf"]  # as the command names them
    trained = {
        json.loads(line).get("id") for line in (workdir / "runs/cpt/training_documents.jsonl").read_text().splitlines()
    }
    items = map(json.loads, Path(report["eval_set"]["path"]).read_text().splitlines())
    scored = {item["doc_id"] for item in items if "doc_id" in item}
    assert scored and not scored & trained and report["data"]["scope"] == "heldout"
    for result in report["checkpoints"].values():
        assert result["citations"]["full"]["items"] + result["citations"]["short_forms"]["items"] == 4
        assert result["harness"]["tasks"]["recipe_holding"]["examples"] == 6
    assert [(row["task"], row["metric"]) for row in report["forgetting"]] == [("recipe_holding", "acc")]
