"""The chunked and fused losses against HF's own causal-LM loss: values and gradients, ignored tokens, odd chunks,
families. The fused loss (Liger-Kernel's Triton kernels) runs on a GPU, or on a CPU in Triton's interpreter, which
must be switched on before Triton is imported: a CPU-only machine runs those tests in a child pytest."""

import copy
import importlib.util
import os
import subprocess
import sys

import pytest
import torch
from train_helpers import tiny_overrides
from transformers import AutoConfig, AutoModelForCausalLM

import legalpt.train.loss as loss_module
import legalpt.train.trainer as trainer
from legalpt.config import ConfigError, TrainConfig, compose
from legalpt.data.pack import IGNORE_INDEX, collate_packed
from legalpt.train.loss import chunked_cross_entropy, use_loss
from legalpt.train.loss import fused_cross_entropy as fused_loss

VOCAB = 97


def tiny_model(family: str, **extra) -> torch.nn.Module:
    """A 2-layer model of `family` in float32 with random weights; Qwen2 with its qkv biases and an untied head."""
    config = AutoConfig.for_model(
        family,
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        tie_word_embeddings=family == "llama",
        **extra,
    )
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32).train()


def packed_batch(rng, rows: int = 2, seq_len: int = 37) -> dict:
    """Packed rows of random documents, the last row ending in padding, and some extra labels ignored, as model
    keyword arguments."""
    packed = []
    for row in range(rows):
        pad = 5 if row == rows - 1 else 0
        lens, left = [], seq_len - pad
        while left:
            lens.append(min(left, rng.randint(1, 15)))
            left -= lens[-1]
        ids = [rng.randrange(VOCAB) for _ in range(seq_len)]
        packed.append({"input_ids": ids, "seq_lens": lens + ([pad] if pad else []), "num_pad": pad})
    batch = collate_packed(packed)
    batch["labels"][torch.rand(batch["labels"].shape) < 0.2] = IGNORE_INDEX
    # No KV cache: with one, transformers does not see the packing in position_ids and sdpa attends across documents
    # (the chunked forward builds none), and the comparison would be of attention instead of the loss.
    return {**batch, "use_cache": False}


def grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() for name, p in model.named_parameters()}


def backpropagated_losses(plain: torch.nn.Module, other: torch.nn.Module, batch: dict) -> list[torch.Tensor]:
    """HF's loss (`plain`) and `other`'s on `batch`, each backpropagated; divided by the batch's targets plus 3, as if
    other micro-batches held 3 more."""
    targets = (batch["labels"][:, 1:] != IGNORE_INDEX).sum() + 3
    losses = [model(**batch, num_items_in_batch=targets).loss for model in (plain, other)]
    for loss in losses:
        loss.backward()
    return losses


@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral"])
@pytest.mark.parametrize("chunk_tokens", [1, 7, 30, 1000])
def test_chunked_loss_and_gradients_equal_hf_loss(rng, family, chunk_tokens):
    plain = tiny_model(family)
    chunked = copy.deepcopy(plain)
    use_loss(chunked, "chunked", chunk_tokens)
    expected, loss = backpropagated_losses(plain, chunked, packed_batch(rng))
    torch.testing.assert_close(loss, expected, rtol=1e-6, atol=1e-6)
    plain_grads, chunked_grads = grads(plain), grads(chunked)
    for name, grad in plain_grads.items():
        torch.testing.assert_close(chunked_grads[name], grad, rtol=1e-5, atol=1e-7, msg=name)


def test_without_num_items_the_loss_is_the_mean_over_targets(rng):
    plain = tiny_model("llama")
    chunked = copy.deepcopy(plain)
    use_loss(chunked, "chunked", 16)
    batch = packed_batch(rng)
    torch.testing.assert_close(chunked(**batch).loss, plain(**batch).loss, rtol=1e-6, atol=1e-6)


def test_evaluation_without_grad_and_generation_without_labels_are_unchanged(rng):
    plain = tiny_model("qwen2").eval()
    chunked = copy.deepcopy(plain)
    use_loss(chunked, "chunked", 8)
    batch = packed_batch(rng)
    with torch.no_grad():
        # heldout_loss asks for the summed loss this way
        summed = chunked(**batch, num_items_in_batch=1).loss
        torch.testing.assert_close(summed, plain(**batch, num_items_in_batch=1).loss, rtol=1e-6, atol=1e-5)
        unlabelled = {k: v for k, v in batch.items() if k != "labels"}
        torch.testing.assert_close(chunked(**unlabelled).logits, plain(**unlabelled).logits, rtol=0, atol=0)


def test_no_full_logits_are_saved_for_backward(rng):
    """Logits saved for backward (a last dimension of vocab size): the plain loss keeps all tokens' logits, the
    chunked one at most a chunk's (its recompute happens in backward)."""
    batch = packed_batch(rng, rows=4, seq_len=50)
    tokens, chunk = batch["input_ids"].numel(), 16
    saved: list[int] = []

    def save(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.dim() >= 2 and tensor.shape[-1] == VOCAB:
            saved.append(tensor.numel())
        return tensor

    def largest_saved_logits(model) -> int:
        saved.clear()
        with torch.autograd.graph.saved_tensors_hooks(save, lambda t: t):
            model(**batch, num_items_in_batch=1).loss.backward()
        return max(saved, default=0)

    plain = tiny_model("llama")
    chunked = copy.deepcopy(plain)
    use_loss(chunked, "chunked", chunk)
    assert largest_saved_logits(plain) >= tokens * VOCAB
    assert largest_saved_logits(chunked) <= chunk * VOCAB


def test_chunks_sum_the_reference_cross_entropy(rng):
    """An independent reference: log-softmax written out, targets shifted by hand within each row."""
    hidden = torch.randn(3, 11, 8, dtype=torch.float64, requires_grad=True)
    head = torch.nn.Linear(8, 13, bias=False, dtype=torch.float64)
    labels = torch.randint(0, 13, (3, 11))
    labels[torch.rand(labels.shape) < 0.3] = IGNORE_INDEX
    loss = chunked_cross_entropy(hidden, head, labels, num_items_in_batch=40, chunk_tokens=5)

    logprobs = torch.log_softmax(head(hidden).float(), -1)[:, :-1]  # (3, 10, 13): position t predicts t + 1
    targets = labels[:, 1:]
    kept = targets != IGNORE_INDEX
    expected = -logprobs[kept].gather(-1, targets[kept][:, None]).sum() / 40
    torch.testing.assert_close(loss, expected, rtol=1e-6, atol=1e-7)
    (grad,) = torch.autograd.grad(loss, hidden)
    (expected_grad,) = torch.autograd.grad(expected, hidden)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-6, atol=1e-9)


def test_families_with_scaled_or_capped_logits_are_refused():
    gemma = AutoModelForCausalLM.from_config(
        AutoConfig.for_model(
            "gemma2", vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
            num_key_value_heads=1, head_dim=16, intermediate_size=64,
        )
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"train\.loss_impl=chunked .*'gemma2'"):
        use_loss(gemma, "chunked", 16)


@pytest.mark.parametrize(
    ("field", "value"), [("loss_impl", "cut"), ("loss_chunk_tokens", 0), ("activation_checkpointing", "some")]
)
def test_bad_loss_and_checkpointing_values_are_named(field, value):
    with pytest.raises(ConfigError, match=rf"^train\.{field}: expected"):
        TrainConfig(**{field: value}).validate()


HAS_LIGER = importlib.util.find_spec("liger_kernel") is not None
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
FUSED_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_fused = pytest.mark.skipif(
    not HAS_LIGER or not (torch.cuda.is_available() or INTERPRETED),
    reason="the fused loss needs liger-kernel, and a GPU or TRITON_INTERPRET=1 (see the test that sets it)",
)


@pytest.mark.skipif(not HAS_LIGER or torch.cuda.is_available() or INTERPRETED, reason="the fused tests run directly")
def test_fused_loss_in_tritons_interpreter_on_a_cpu():
    """The fused tests below, in a child pytest whose Triton interprets its kernels on the CPU."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    selected = ["-k", "fused and not interpreter", "-m", "not cuda"]
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, *selected]
    child = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert child.returncode == 0, child.stdout[-4000:] + child.stderr[-2000:]
    assert " passed" in child.stdout and "skipped" not in child.stdout, child.stdout[-2000:]


@needs_fused
@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral"])
def test_fused_loss_and_gradients_equal_hf_loss(rng, family):
    plain = tiny_model(family).to(FUSED_DEVICE)
    fused = copy.deepcopy(plain)
    use_loss(fused, "fused")
    batch = {k: v.to(FUSED_DEVICE) if torch.is_tensor(v) else v for k, v in packed_batch(rng).items()}
    expected, loss = backpropagated_losses(plain, fused, batch)
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)
    fused_grads = grads(fused)
    for name, grad in grads(plain).items():
        torch.testing.assert_close(fused_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)
    with torch.no_grad():  # evaluation: the mean over targets, no gradients computed
        torch.testing.assert_close(fused(**batch).loss, plain(**batch).loss, rtol=1e-5, atol=1e-6)


@needs_fused
def test_fused_loss_trains_like_the_plain_one(tmp_path, monkeypatch):
    """`train.loss_impl=fused` through the trainer: the same held-out losses as the default, up to float rounding."""
    calls = []

    def counted(*args, **kwargs):
        calls.append(1)
        return fused_loss(*args, **kwargs)

    monkeypatch.setattr(loss_module, "fused_cross_entropy", counted)
    runs = {}
    for loss_impl in ("plain", "fused"):
        extra = (f"train.output_dir={tmp_path / loss_impl}", f"train.loss_impl={loss_impl}")
        runs[loss_impl] = trainer.train(compose("train", tiny_overrides(tmp_path, *extra, steps=4))).eval_losses
    assert [step for step, _ in runs["fused"]] == [step for step, _ in runs["plain"]] == [0, 2, 4]
    for (_, loss), (_, expected) in zip(runs["fused"], runs["plain"], strict=True):
        assert loss == pytest.approx(expected, rel=1e-4)
    assert len(calls) == 4 + 3 * 2  # a training step each, and 2 held-out batches at each evaluation


@pytest.mark.cuda
@needs_fused
def test_fused_loss_under_bf16_autocast_matches_the_chunked_loss(rng):
    """Both multiply by the head in bfloat16 (as autocast does for HF's head) and take the cross-entropy in float32."""
    chunked = tiny_model("llama").cuda()
    fused = copy.deepcopy(chunked)
    use_loss(chunked, "chunked", 16)
    use_loss(fused, "fused")
    batch = {k: v.cuda() if torch.is_tensor(v) else v for k, v in packed_batch(rng).items()}
    with torch.autocast("cuda", torch.bfloat16):
        expected, loss = chunked(**batch).loss, fused(**batch).loss
    expected.backward()
    loss.backward()
    torch.testing.assert_close(loss, expected, rtol=1e-3, atol=1e-3)
    fused_grads = grads(fused)
    for name, grad in grads(chunked).items():
        torch.testing.assert_close(fused_grads[name], grad, rtol=2e-2, atol=1e-3, msg=name)


def test_fused_loss_needs_liger_and_a_device_its_kernels_run_on(monkeypatch):
    model = tiny_model("llama")  # on the CPU
    if HAS_LIGER:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
        with pytest.raises(ValueError, match=r"^train\.loss_impl=fused runs Liger-Kernel's Triton kernels.* on cpu"):
            use_loss(model, "fused")
    monkeypatch.setitem(sys.modules, "liger_kernel", None)  # import fails, as when it is not installed
    with pytest.raises(ValueError, match=r"^train\.loss_impl=fused needs Liger-Kernel: pip install"):
        use_loss(model, "fused")
