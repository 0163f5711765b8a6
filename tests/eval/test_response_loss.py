"""`legalpt-eval` on fine-tuning examples (data.format=sft): the held-out response loss of two checkpoints side by
side equals transformers' loss on each example alone with its prompt labelled -100, token-weighted; examples that
cannot be scored, and those a checkpoint was trained on, are counted."""

import json
import random

import datasets
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from legalpt.config import DataConfig, compose, to_config
from legalpt.data.manifest import write_manifest
from legalpt.data.pack import IGNORE_INDEX
from legalpt.data.pipeline import prepare
from legalpt.data.sft import INSTRUCTION, RESPONSE, TOO_LONG
from legalpt.data.tokenizer import train_bpe
from legalpt.eval.run import evaluate
from legalpt.model import build_model

WORDS = ("the", "seller", "shall", "deliver", "goods", "within", "days", "court", "held", "citation", "v.", "F.3d")


def sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_model_config):
    """Two tiny checkpoints (different initialisations, one tokenizer) and a file of examples: valid pairs, one too
    long for data.seq_len=128 and one with an empty response."""
    root, rng = tmp_path_factory.mktemp("sft_eval"), random.Random(7)
    tokenizer = train_bpe([sentence(random.Random(i), 30) + INSTRUCTION + RESPONSE for i in range(40)], 300)
    for name, seed in (("base", 0), ("tuned", 1)):
        torch.manual_seed(seed)
        build_model(tiny_model_config(), tokenizer).save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    pairs = [{"prompt": sentence(rng, rng.randint(3, 10)), "response": sentence(rng, rng.randint(1, 9))}
             for _ in range(9)]  # fmt: skip
    records = [*pairs[:4], {"prompt": "Restate it.", "response": sentence(rng, 150)}, *pairs[4:],
               {"prompt": "Cite it.", "response": ""}]  # fmt: skip
    (root / "pairs.jsonl").write_text("\n".join(json.dumps(r) for r in records))
    return root, pairs


def overrides(root, tmp_path, *extra: str) -> list[str]:
    return [
        "model=tiny",
        "logger=none",
        "data.format=sft",
        f"data.paths=[{root / 'pairs.jsonl'}]",
        "data.seq_len=128",
        f"data.cache_dir={tmp_path / 'cache'}",
        f"eval.checkpoint={root / 'base'}",
        f"eval.output_dir={tmp_path / 'eval'}",
        "eval.batch_size=2",
        *extra,
    ]


def direct_loss(checkpoint, pairs: list[dict]) -> tuple[float, int]:
    """Token-weighted mean of transformers' loss on each example alone, prompt tokens labelled IGNORE_INDEX."""
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, attn_implementation="eager").eval()

    def ids(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]

    nll, tokens = torch.zeros((), dtype=torch.float64), 0
    with torch.no_grad():
        for pair in pairs:
            context, target = (
                ids(INSTRUCTION + pair["prompt"] + RESPONSE),
                [*ids(pair["response"]), tokenizer.eos_token_id],
            )
            labels = torch.tensor([[IGNORE_INDEX] * len(context) + target])
            count = len(target)
            nll += model(torch.tensor([context + target]), labels=labels).loss.double() * count
            tokens += count
    return (nll / tokens).item(), tokens


def test_two_checkpoints_score_the_responses_of_every_example(setup, tmp_path):
    root, pairs = setup
    report = evaluate(
        compose("eval", overrides(root, tmp_path, "eval.documents=all", f"eval.compare={root / 'tuned'}"))
    )

    assert report["data"]["documents"] == 10  # the empty response is skipped while reading
    assert report["data"]["read"] == 11 and "1 empty response" in report["data"]["skipped"]
    for name in ("base", "tuned"):
        result = report["checkpoints"][str(root / name)]
        assert set(result) == {"checkpoint", "response_loss"}  # the document tasks need data.format=text
        scored = result["response_loss"]
        assert scored["examples"] == 9 and scored["skipped"] == {TOO_LONG: 1}
        loss, tokens = direct_loss(root / name, pairs)
        assert scored["tokens"] == tokens
        assert scored["loss"] == pytest.approx(loss, rel=1e-5)
    md = (tmp_path / "eval" / "report.md").read_text()
    assert "## response_loss" in md and "| metric | checkpoint 1 | checkpoint 2 |" in md and "| loss |" in md
    assert "examples scored: 10 of every example; 0 left out as training examples" in md


def test_examples_a_checkpoint_was_trained_on_are_left_out(setup, tmp_path):
    root, pairs = setup
    trained = pairs[:3]
    texts = [{"id": str(i), "text": f"{p['prompt']}\n\n{p['response']}"} for i, p in enumerate(trained)]
    run = tmp_path / "run"
    (run / "hf").mkdir(parents=True)
    for path in (root / "base").iterdir():
        (run / "hf" / path.name).write_bytes(path.read_bytes())
    write_manifest(run, DataConfig(format="sft"), datasets.Dataset.from_list(texts))

    report = evaluate(compose("eval", overrides(root, tmp_path, "eval.documents=all", f"eval.checkpoint={run}")))
    assert report["data"]["excluded_training"] == 3 and report["data"]["documents"] == 7
    loss, tokens = direct_loss(run / "hf", pairs[3:])
    scored = report["checkpoints"][str(run / "hf")]["response_loss"]
    assert scored["tokens"] == tokens and scored["loss"] == pytest.approx(loss, rel=1e-5)


def test_the_heldout_split_is_the_one_fine_tuning_holds_out(setup, tmp_path):
    root, _ = setup
    cfg = compose("eval", overrides(root, tmp_path, "data.heldout_fraction=0.3"))
    report = evaluate(cfg)
    assert report["data"]["scope"] == "heldout" and report["data"]["documents"] == 3  # round(0.3 * 10)
    scored = report["checkpoints"][str(root / "base")]["response_loss"]
    assert scored["examples"] + sum(scored["skipped"].values()) == 3
    assert scored["examples"] == prepare(to_config(cfg).data, str(root / "base")).stats["heldout"]["documents"]
