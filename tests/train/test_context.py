"""Context parallelism in training (legalpt.train.context): the shares of a batch put back together are the batch,
a model on a one-process ring gives the plain packed loss and gradients, two processes train as one does, and the
settings it cannot run with are named."""

import copy
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from train_helpers import tiny_overrides
from transformers import AutoConfig, AutoModelForCausalLM

import legalpt.hf  # noqa: F401 (registers attn_implementation="legalpt")
import legalpt.train.trainer as trainer
from legalpt.attention.ring import unshard
from legalpt.config import ConfigError, compose, to_config
from legalpt.data.pack import IGNORE_INDEX, collate_packed
from legalpt.train.context import ContextParallel
from legalpt.train.loss import target_count, use_loss

VOCAB = 97


def rows(rng, count: int = 2, seq_len: int = 48) -> list[dict]:
    """Packed rows of random documents (one longer than a share), the last row ending in padding."""
    packed = []
    for row in range(count):
        pad = 5 if row == count - 1 else 0
        lens = [30, *([seq_len - 30 - pad] if seq_len - 30 - pad else []), *([pad] if pad else [])]
        packed.append({"input_ids": [rng.randrange(VOCAB) for _ in range(seq_len)], "seq_lens": lens, "num_pad": pad})
    return packed


def group(size: int, rank: int) -> ContextParallel:
    return ContextParallel(size, rank, data_rank=0, data_world=1, group=None)


def test_the_shares_put_together_are_the_batch(rng):
    packed = rows(rng)
    full = collate_packed(packed)
    shares = [group(3, rank).collate(packed) for rank in range(3)]
    for name in ("input_ids", "position_ids"):
        assert torch.equal(unshard([share[name] for share in shares], dim=1), full[name]), name
    expected = F.pad(full["labels"][:, 1:], (0, 1), value=IGNORE_INDEX)
    assert torch.equal(unshard([share["shift_labels"] for share in shares], dim=1), expected)
    assert sum(int(target_count(share)) for share in shares) == int(target_count(full))
    assert shares[0]["segment_lengths"].sum() > 0 and all(share["segment_lengths"].sum() == 0 for share in shares[1:])


def tiny_model(family: str) -> torch.nn.Module:
    config = AutoConfig.for_model(
        family, vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64, sliding_window=None,
    )  # fmt: skip
    return AutoModelForCausalLM.from_config(config, attn_implementation="legalpt", dtype=torch.float32).train()


@pytest.mark.parametrize("loss_impl", ["plain", "chunked"])
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_a_one_process_ring_gives_the_packed_loss_and_gradients(rng, family, loss_impl):
    """Both chunks of every row on one process: ring attention, the shifted labels and the share's positions in the
    model, against the plain packed batch."""
    plain = tiny_model(family)
    ring = copy.deepcopy(plain)
    if loss_impl != "plain":  # after the copy: the loss's forward holds its model
        use_loss(plain, loss_impl, 16)
        use_loss(ring, loss_impl, 16)
    packed = rows(rng)
    batch, share = collate_packed(packed), group(1, 0).collate(packed)
    share.pop("segment_lengths")  # the throughput meter's
    targets = target_count(batch) + 2  # as if other micro-batches held 2 more
    expected = plain(**batch, num_items_in_batch=targets, use_cache=False).loss
    loss = ring(**share, num_items_in_batch=targets, use_cache=False).loss
    expected.backward()
    loss.backward()
    torch.testing.assert_close(loss, expected, rtol=1e-6, atol=1e-6)
    ring_grads = dict(ring.named_parameters())
    for name, param in plain.named_parameters():
        torch.testing.assert_close(ring_grads[name].grad, param.grad, rtol=1e-5, atol=1e-6, msg=name)


def test_a_sliding_window_layer_refuses_the_ring(rng):
    config = AutoConfig.for_model(
        "mistral", vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=64, sliding_window=8,
    )  # fmt: skip
    model = AutoModelForCausalLM.from_config(config, attn_implementation="legalpt")
    share = group(1, 0).collate(rows(rng))
    share.pop("segment_lengths")
    with pytest.raises(ValueError, match=r"^ring_plan: ring attention takes causal or full attention alone"):
        model(**share, use_cache=False)


WORKER = """
import sys
from legalpt.cli import train_main
sys.argv[0] = "legalpt-train"
train_main()
"""


def logged(run_dir, key: str) -> list[tuple[int, float]]:
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(line["step"], line[key]) for line in lines if key in line]


@pytest.mark.slow
@pytest.mark.parametrize("distributed", ["ddp", "fsdp2"])
def test_two_processes_on_a_ring_train_as_one_process_does(tmp_path, distributed):
    """train.context_parallel=2 over two CPU processes (one group, one data replica) against one process: the same
    batches, so the same training and held-out losses up to float rounding (the whole held-out split: the processes
    share it), and the same tokens counted."""
    common = ("train.batch_size=1", "data.seq_len=128", "train.log_every=1", "train.loss_impl=chunked",
              "train.eval_batches=0")  # fmt: skip
    alone = trainer.train(compose("train", tiny_overrides(tmp_path, *common, f"train.output_dir={tmp_path / 'one'}")))
    script = tmp_path / "legalpt_train.py"
    script.write_text(WORKER)
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script)]
    ring_dir = tmp_path / "ring"
    overrides = tiny_overrides(tmp_path, *common, "train.context_parallel=2", f"train.distributed={distributed}",
                               f"train.output_dir={ring_dir}")  # fmt: skip
    launched = subprocess.run([*command, *overrides], capture_output=True, text=True, env=env, timeout=600)
    assert launched.returncode == 0, launched.stdout[-3000:] + launched.stderr[-6000:]
    for key in ("train/loss", "eval/loss", "train/tokens"):
        got, expected = logged(ring_dir, key), logged(alone.run_dir, key)
        assert [step for step, _ in got] == [step for step, _ in expected], key
        for (_, value), (_, want) in zip(got, expected, strict=True):
            assert value == pytest.approx(want, rel=1e-4), key


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["train.context_parallel=0"], "train.context_parallel"),
        (["train.context_parallel=2", "train.compile=true"], "train.context_parallel"),
        (["train.context_parallel=2", "model.attn_implementation=sdpa"], "model.attn_implementation"),
        (["train.context_parallel=3", "data.seq_len=128"], "data.seq_len"),
    ],
)
def test_settings_it_cannot_run_with_are_named(overrides, key):
    with pytest.raises(ConfigError, match="^" + key.replace(".", r"\.") + ": expected"):
        to_config(compose("train", ["model=tiny", *overrides]))


def test_a_group_size_that_does_not_divide_the_processes_is_named():
    class Launched:
        num_processes, process_index = 3, 0

    with pytest.raises(ValueError, match=r"^train\.context_parallel: expected a divisor of the 3 processes"):
        ContextParallel.start(2, Launched())
