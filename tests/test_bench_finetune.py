"""scripts/bench_finetune.py on a small written data folder, a few steps of a tiny model: the instruction set, the
base, full and LoRA fine-tuning each scored before and after on the same held-out examples, and its record."""

import json

import pytest
from instruction_helpers import write_documents


@pytest.fixture
def bench(load_script):
    return load_script("bench_finetune")


def test_the_script_records_heldout_response_loss_before_and_after(bench, tmp_path):
    write_documents(tmp_path / "data", contracts=5, opinions=2)
    argv = ["--data", str(tmp_path / "data"), "--pretrain-steps", "2", "--steps", "3", "--batch-size", "2",
            "--seq-len", "128", "--vocab-size", "300", "--work", str(tmp_path / "work"),
            "--out", str(tmp_path / "out"), "--override", "train.activation_checkpointing=full"]  # fmt: skip
    assert bench.main(argv) == 0
    for method in ("full", "lora"):  # the override reaches every fine-tuning run, and not the base's pretraining
        assert "activation_checkpointing: full" in (tmp_path / "work" / method / "config.yaml").read_text(), method
    assert "activation_checkpointing: none" in (tmp_path / "work" / "base" / "config.yaml").read_text()

    (path,) = (tmp_path / "out").glob("finetune-cpu*-*.json")
    result = json.loads(path.read_text())
    assert result["header"]["benchmark"] == "finetune" and result["header"]["steps"] == 3
    assert result["header"]["overrides"] == ["train.activation_checkpointing=full"]
    heldout = [json.loads(line) for line in (tmp_path / "work" / "instructions" / "heldout.jsonl").open()]
    assert sum(result["instructions"]["examples"]["heldout"].values()) == len(heldout) > 0
    full, lora = result["methods"]["full"], result["methods"]["lora"]
    assert full["before"] == lora["before"]  # one base, one set of held-out examples
    assert full["before"]["examples"] + sum(full["before"]["skipped"].values()) == len(heldout)
    for method in (full, lora):
        assert method["after"]["tokens"] == method["before"]["tokens"] > 0
        assert method["after"]["loss"] != method["before"]["loss"]
    assert full["trained"] == full["parameters"] and 0 < lora["trained"] < lora["parameters"]
    assert result["heldout_loss_lowered"] == all(m["after"]["loss"] < m["before"]["loss"] for m in (full, lora))


def test_bad_settings_are_refused(bench, capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(["--steps", "0"])
    assert "--steps must be >= 1" in capsys.readouterr().err
