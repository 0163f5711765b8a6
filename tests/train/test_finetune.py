"""Supervised fine-tuning end to end: continued pretraining, then SFT of its export in the same run folder layout; the
labels hold the responses alone, the packed loss is HF's loss on each example alone, the export is a plain HF folder."""

import json
import random
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from legalpt.config import ModelConfig, compose, to_config
from legalpt.data.pack import IGNORE_INDEX, collate_packed
from legalpt.data.pipeline import prepare
from legalpt.data.sft import INSTRUCTION, RESPONSE, TOO_LONG
from legalpt.model import build_model
from legalpt.train.trainer import train

WORDS = ("the", "parties", "agree", "that", "court", "held", "contract", "void", "for", "breach", "notice", "clause")


def sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def segments(row: dict, values: list[int]) -> list[tuple[list[int], list[int]]]:
    """(ids, values) of each example of a packed row; the padding at its end is left out."""
    out, start = [], 0
    for length in row["seq_lens"][: len(row["seq_lens"]) - (row["num_pad"] > 0)]:
        out.append((row["input_ids"][start : start + length], values[start : start + length]))
        start += length
    return out


def test_continued_pretraining_then_fine_tuning(tmp_path, rng):
    common = ["model=tiny", "logger=none", f"data.cache_dir={tmp_path / 'cache'}", "train.batch_size=2",
              "train.eval_batches=1", "train.warmup_steps=1"]  # fmt: skip
    pretrain = ["data.synthetic_documents=6", "data.seq_len=64", "data.vocab_size=400", "train.steps=1"]
    cpt = train(compose("train", [*common, *pretrain, f"train.output_dir={tmp_path / 'cpt'}"]))

    pairs = [
        {"prompt": sentence(rng, rng.randint(3, 12)), "response": sentence(rng, rng.randint(1, 8))} for _ in range(12)
    ]
    examples = tmp_path / "pairs.jsonl"
    long = {"prompt": "Restate the clause.", "response": sentence(rng, 200)}  # each word is at least one token
    examples.write_text("\n".join(json.dumps(pair) for pair in [*pairs[:5], long, *pairs[5:]]))
    fine_tune = ["data.format=sft", f"data.paths=[{examples}]", "data.seq_len=128", "data.heldout_fraction=0.25",
                 f"model.pretrained={cpt.export_dir}", "train.steps=3", "train.eval_every=3",
                 "train.save_every=3"]  # fmt: skip
    cfg = compose("train", [*common, *fine_tune, f"train.output_dir={tmp_path / 'sft'}"])
    sft = train(cfg)

    # The same run folder layout for both phases.
    for run in (cpt, sft):
        assert (run.export_dir / "config.json").is_file() and run.export_dir == run.run_dir / "hf"
        assert run.checkpoint.parent == run.run_dir / "checkpoints"
        assert {"train.log", "metrics.jsonl"} <= {path.name for path in run.run_dir.iterdir()}

    data = prepare(to_config(cfg).data, str(cpt.export_dir))
    assert data.stats["cached"]
    # (d) The over-long example is counted, with its place, and nothing else is left out.
    report = json.loads((Path(data.stats["rows_dir"]) / "report.json").read_text())
    assert report["examples"] == {
        "read": 13,
        "skipped": {TOO_LONG: 1},
        "skipped_examples": {TOO_LONG: [f"{examples}:5"]},
        "kept": 12,
    }

    # (a) Labels: IGNORE_INDEX on exactly the prompt tokens, the response and eos as tokenized on their own.
    tokenizer = AutoTokenizer.from_pretrained(cpt.export_dir)

    def ids(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]

    expected, keys = {}, []
    for pair in pairs:
        context, target = ids(INSTRUCTION + pair["prompt"] + RESPONSE), [*ids(pair["response"]), tokenizer.eos_token_id]
        keys.append(tuple(context + target))
        expected[keys[-1]] = [IGNORE_INDEX] * len(context) + target
    found = []
    for row in [*data.train, *data.heldout]:
        labels = collate_packed([row])["labels"][0].tolist()
        for segment, segment_labels in segments(row, labels):
            assert segment_labels == expected[tuple(segment)]
            found.append(tuple(segment))
    assert sorted(found) == sorted(keys)

    # (b) The packed loss, documents kept apart by legalpt's varlen attention, is HF's loss of each example alone.
    model_cfg = ModelConfig(pretrained=str(sft.export_dir), attention_backend="reference")
    packed = build_model(model_cfg, tokenizer).eval()
    plain = AutoModelForCausalLM.from_pretrained(sft.export_dir, attn_implementation="eager").eval()
    rows = list(data.train)
    with torch.no_grad():
        packed_loss = packed(**collate_packed(rows)).loss
        nll, targets = torch.zeros((), dtype=torch.float64), 0
        for row in rows:
            for segment, _ in segments(row, row["loss_mask"]):
                labels = torch.tensor([expected[tuple(segment)]])
                count = int((labels[:, 1:] != IGNORE_INDEX).sum())
                nll += plain(torch.tensor([segment]), labels=labels).loss.double() * count
                targets += count
    torch.testing.assert_close(packed_loss.double(), nll / targets, rtol=1e-5, atol=1e-6)

    # (c) The export is a plain HF folder whose weights fine-tuning changed.
    before = AutoModelForCausalLM.from_pretrained(cpt.export_dir)
    assert not torch.equal(plain.model.embed_tokens.weight, before.model.embed_tokens.weight)
    assert AutoTokenizer.from_pretrained(sft.export_dir).get_vocab() == tokenizer.get_vocab()
    assert all(torch.isfinite(torch.tensor(loss)) for _, loss in sft.eval_losses)
