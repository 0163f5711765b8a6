"""Activation checkpointing and offloading: every mode trains exactly as without, while saving less for backward."""

import copy
import gc
import json
import logging

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import legalpt.train.activations as activations
import legalpt.train.trainer as trainer
from legalpt.config import ConfigError, TrainConfig, compose, to_config
from legalpt.data.pack import collate_packed
from legalpt.data.tokenizer import train_bpe
from legalpt.model import build_model
from legalpt.train.activations import ATTENTION_OPS, apply_activation_checkpointing, chunk_mlps

MODES = [("full", 1), ("selective", 2), ("selective", 3), ("attention", 1)]


@pytest.fixture(scope="module")
def tokenizer():
    return train_bpe(["the parties agree to the terms of this agreement"] * 20, 300)


@pytest.fixture
def model(tiny_model_config, tokenizer):
    """A 5-layer tiny Llama on legalpt attention (the reference backend on CPU), in train mode: selective
    checkpointing recomputes layers 0, 2, 4 every 2nd layer and 0, 3 every 3rd."""
    return build_model(tiny_model_config(num_layers=5), tokenizer).train()


def packed_batch(rng, vocab: int, rows: int = 2, seq_len: int = 48) -> dict:
    """Packed rows of random documents, as the trainer's collator makes them, as model keyword arguments; with a KV
    cache, as transformers' default config builds one (a checkpointed layer must not fill it twice)."""
    packed = []
    for _ in range(rows):
        lens, left = [], seq_len
        while left:
            lens.append(min(left, rng.randint(2, 20)))
            left -= lens[-1]
        packed.append({"input_ids": [rng.randrange(vocab) for _ in range(seq_len)], "seq_lens": lens, "num_pad": 0})
    return {**collate_packed(packed), "use_cache": True}


def loss_and_grads(model, batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    loss = model(**batch).loss
    loss.backward()
    return loss.detach(), {name: p.grad for name, p in model.named_parameters()}


def assert_same_training(got: tuple, expected: tuple) -> None:
    """loss_and_grads's results bit for bit equal."""
    (loss, grads), (expected_loss, expected_grads) = got, expected
    torch.testing.assert_close(loss, expected_loss, rtol=0, atol=0)
    for name, grad in expected_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=0, atol=0, msg=name)


def unpacked(batch: dict) -> dict:
    """A packed batch's tokens and labels alone: rows of one causal document (sdpa and eager keep packed documents
    apart only through a mask, which SDPA's fused kernels do not take on a CPU)."""
    return {"input_ids": batch["input_ids"], "labels": batch["labels"]}


def saved_bytes(model, batch) -> int:
    """Bytes of the tensors a forward saves for backward, parameters excepted, counted as autograd saves them."""
    parameters = {p.data_ptr() for p in model.parameters()}
    total = 0

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal total
        if tensor.data_ptr() not in parameters:
            total += tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(**batch).loss.backward()
    return total


@pytest.mark.parametrize(("mode", "every"), MODES)
def test_every_mode_gives_the_loss_and_gradients_of_none(rng, model, mode, every):
    batch = packed_batch(rng, model.config.vocab_size)
    checkpointed = copy.deepcopy(model)
    apply_activation_checkpointing(checkpointed, mode, every)
    expected_loss, expected_grads = loss_and_grads(model, batch)
    loss, grads = loss_and_grads(checkpointed, batch)
    torch.testing.assert_close(loss, expected_loss, rtol=0, atol=0)
    for name, grad in expected_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-6, atol=1e-8, msg=name)
    assert list(checkpointed.state_dict()) == list(model.state_dict())  # checkpoints do not depend on the mode


def test_checkpointing_saves_less_for_backward(rng, model):
    """Full (5 layers) < selective every 2nd layer (3) < every 3rd (2) < none, and attention-only recompute < none."""
    batch = packed_batch(rng, model.config.vocab_size)
    saved = {}
    for mode, every in [("none", 1), *MODES]:
        checkpointed = copy.deepcopy(model)
        apply_activation_checkpointing(checkpointed, mode, every)
        saved[mode, every] = saved_bytes(checkpointed, batch)
    assert saved["full", 1] < saved["selective", 2] < saved["selective", 3] < saved["none", 1]
    assert saved["attention", 1] < saved["none", 1]


@pytest.mark.parametrize(("mode", "save_attention"), [("none", False), ("full", False), ("selective", True)])
@pytest.mark.parametrize("tokens", [7, 48])
def test_chunked_mlps_give_the_loss_and_gradients_of_whole_rows(rng, model, mode, save_attention, tokens):
    """train.mlp_chunk_tokens, alone and inside recomputed layers: 7 leaves a short last chunk, 48 is one row."""
    batch = packed_batch(rng, model.config.vocab_size)
    chunked = copy.deepcopy(model)  # before wrapping: a copied wrapper would still run the original's layers
    for candidate in (model, chunked):
        apply_activation_checkpointing(candidate, mode, save_attention=save_attention)
    chunk_mlps(chunked, tokens)
    expected_loss, expected_grads = loss_and_grads(model, batch)
    loss, grads = loss_and_grads(chunked, batch)
    torch.testing.assert_close(loss, expected_loss, rtol=1e-6, atol=0)
    for name, grad in expected_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-5, atol=1e-7, msg=name)
    assert list(chunked.state_dict()) == list(model.state_dict())


def test_chunked_mlps_save_less_for_backward(rng, model):
    """Without checkpointing an MLP saves its intermediates (three times its width per token); chunked, its input."""
    batch = packed_batch(rng, model.config.vocab_size)
    chunked = copy.deepcopy(model)
    chunk_mlps(chunked, 16)
    hidden, width = model.config.hidden_size, model.config.intermediate_size
    tokens, floats = batch["input_ids"].numel(), 4 * model.config.num_hidden_layers
    assert saved_bytes(model, batch) - saved_bytes(chunked, batch) >= tokens * floats * (3 * width - hidden)


def test_chunked_mlps_in_evaluation_recompute_nothing(rng, model, monkeypatch):
    """Without gradients the chunks run in turn, with no checkpoint: the logits of whole rows."""
    batch = packed_batch(rng, model.config.vocab_size)
    chunked = copy.deepcopy(model)
    chunk_mlps(chunked, 5)
    calls = []
    monkeypatch.setattr(activations, "checkpoint", lambda *args, **kwargs: calls.append(args))
    with torch.no_grad():
        logits = chunked.eval()(**batch).logits
        torch.testing.assert_close(logits, model.eval()(**batch).logits, rtol=1e-6, atol=1e-6)
    assert calls == []


def test_mixtures_of_experts_are_not_chunked(model):
    model.model.layers[0].mlp.experts = torch.nn.ModuleList()
    with pytest.raises(ValueError, match=r"^train\.mlp_chunk_tokens: expected dense MLPs"):
        chunk_mlps(model, 16)


def test_bad_mlp_chunks_are_named(model):
    with pytest.raises(ConfigError, match=r"^train\.mlp_chunk_tokens: expected"):
        TrainConfig(mlp_chunk_tokens=-1).validate()
    with pytest.raises(ValueError, match=r"^train\.mlp_chunk_tokens: expected"):
        chunk_mlps(model, 0)


class CountAttention(TorchDispatchMode):
    """Counts the attention ops that run (an op whose output selective checkpointing saved does not run again)."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls += func.overloadpacket in ATTENTION_OPS
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("attn_implementation", ["legalpt", "sdpa"])
@pytest.mark.parametrize(("mode", "every", "recomputed"), [("full", 1, 5), ("selective", 2, 3)])
def test_saved_attention_is_not_recomputed(rng, tiny_model_config, tokenizer, attn_implementation, mode, every,
                                           recomputed):  # fmt: skip
    """train.save_attention: the loss and gradients of plain checkpointing, and attention run once per layer instead
    of again in each recomputed layer."""
    config = tiny_model_config(num_layers=5, attn_implementation=attn_implementation)
    model = build_model(config, tokenizer).train()
    batch = packed_batch(rng, model.config.vocab_size)
    if attn_implementation == "sdpa":
        batch = unpacked(batch)
    runs, results = {}, {}
    for save in (False, True):
        checkpointed = copy.deepcopy(model)
        apply_activation_checkpointing(checkpointed, mode, every, save_attention=save)
        with CountAttention() as counter:
            results[save] = loss_and_grads(checkpointed, batch)
        runs[save] = counter.calls
    assert runs == {False: 5 + recomputed, True: 5}
    assert_same_training(results[True], results[False])


def test_evaluation_runs_the_layers_plainly(rng, model):
    """Without grad nothing is recomputed, and the KV cache a generation needs is kept."""
    apply_activation_checkpointing(model, "full")
    model.eval()
    ids = torch.randint(0, model.config.vocab_size, (1, 9))
    with torch.no_grad():
        out = model(ids, use_cache=True)
    assert out.past_key_values.get_seq_length() == 9


def test_offloading_on_cpu_warns_and_changes_nothing(rng, model, caplog):
    batch = packed_batch(rng, model.config.vocab_size)
    offloaded = copy.deepcopy(model)
    with caplog.at_level(logging.WARNING, logger="legalpt.train.activations"):
        apply_activation_checkpointing(offloaded, "full", offload=True)
    assert "train.offload_activations" in caplog.text
    expected_loss, _ = loss_and_grads(model, batch)
    loss, _ = loss_and_grads(offloaded, batch)
    torch.testing.assert_close(loss, expected_loss, rtol=0, atol=0)


@pytest.mark.cuda
@pytest.mark.parametrize("mlp_chunks", [0, 16])
@pytest.mark.parametrize("mode", ["none", "full", "attention"])
def test_offloading_moves_saved_activations_off_the_gpu(rng, model, mode, mlp_chunks, deterministic_mode):
    """The same loss and gradients bit for bit with and without offloading (in deterministic mode: the attention
    backward's atomics would otherwise add in a different order each run), and less GPU memory held between forward
    and backward; with chunked MLPs too, whose chunks' inputs are offloaded."""
    deterministic_mode()
    model = model.cuda()
    batch = {k: v.cuda() if torch.is_tensor(v) else v for k, v in packed_batch(rng, model.config.vocab_size).items()}
    copy.deepcopy(model)(**batch).loss.backward()  # lazy allocations (cuBLAS workspace, caches) before measuring
    held = {}
    results = {}
    for offload in (False, True):
        candidate = copy.deepcopy(model)
        apply_activation_checkpointing(candidate, mode, offload=offload)
        if mlp_chunks:
            chunk_mlps(candidate, mlp_chunks)
        gc.collect()  # the last candidate's reference cycles, else freed by a collection inside the measured forward
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        loss = candidate(**batch).loss
        held[offload] = torch.cuda.memory_allocated() - before
        loss.backward()
        results[offload] = (loss.detach(), [p.grad for p in candidate.parameters()])
    assert held[True] < held[False]
    torch.testing.assert_close(results[True][0], results[False][0], rtol=0, atol=0)
    for grad, expected in zip(results[True][1], results[False][1], strict=True):
        torch.testing.assert_close(grad, expected, rtol=0, atol=0)


@pytest.mark.cuda
def test_chunked_mlps_lower_the_peak_of_recomputed_layers(rng, tiny_model_config, tokenizer):
    """Under full checkpointing the peak is one layer's recompute, most of it the MLP's intermediates (an MLP wider
    than the logits of the 300-token vocabulary makes them the peak): chunks of 256 tokens hold a fraction of them
    (tokens x intermediate x 4 bytes each, float32 here)."""
    model = build_model(tiny_model_config(num_layers=5, intermediate_size=1024), tokenizer).train().cuda()
    batch = packed_batch(rng, model.config.vocab_size, seq_len=4096)
    batch = {k: v.cuda() if torch.is_tensor(v) else v for k, v in batch.items()}
    peaks, results = {}, {}
    for tokens in (0, 256):
        candidate = copy.deepcopy(model)
        apply_activation_checkpointing(candidate, "full")
        if tokens:
            chunk_mlps(candidate, tokens)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        results[tokens] = loss_and_grads(candidate, batch)
        peaks[tokens] = torch.cuda.max_memory_allocated() - before
    intermediate = batch["input_ids"].numel() * model.config.intermediate_size * 4
    assert peaks[0] - peaks[256] >= intermediate
    torch.testing.assert_close(results[256][0], results[0][0], rtol=1e-6, atol=0)


def test_a_model_without_decoder_layers_is_refused():
    model = torch.nn.Linear(2, 2)
    model.get_decoder = lambda: model
    with pytest.raises(ValueError, match=r"train\.activation_checkpointing"):
        apply_activation_checkpointing(model, "full")


@pytest.mark.parametrize(("field", "value"), [("activation_checkpointing", "half"), ("checkpoint_every", 0)])
def test_bad_checkpointing_values_are_named(field, value):
    with pytest.raises(ConfigError, match=rf"^train\.{field}: expected"):
        TrainConfig(**{field: value}).validate()


@pytest.mark.parametrize("mode", ["none", "attention"])
def test_saving_attention_needs_recomputed_layers(mode, model):
    with pytest.raises(ConfigError, match=r"^train\.activation_checkpointing: expected full or selective with "
                       r"train\.save_attention=true, got"):  # fmt: skip
        TrainConfig(activation_checkpointing=mode, save_attention=True).validate()
    with pytest.raises(ValueError, match=r"train\.save_attention=true"):
        apply_activation_checkpointing(model, mode, save_attention=True)


def test_saved_attention_is_not_offloaded(model):
    """Selective checkpointing's saved outputs bypass save_on_cpu's hooks: refused rather than left on the GPU."""
    with pytest.raises(ConfigError, match=r"^train\.offload_activations: expected false with train\.save_attention"):
        TrainConfig(activation_checkpointing="full", save_attention=True, offload_activations=True).validate()
    with pytest.raises(ValueError, match=r"^train\.offload_activations: expected false with train\.save_attention"):
        apply_activation_checkpointing(model, "full", offload=True, save_attention=True)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        (["model.attn_implementation=eager"], "model.attn_implementation"),
        (["train.context_parallel=2", "data.seq_len=128"], "train.context_parallel"),
    ],
)
def test_saved_attention_needs_one_attention_op(overrides, field):
    """Eager attention is many ops and ring attention runs its own steps: neither is one op to save."""
    composed = compose("train", ["train.activation_checkpointing=full", "train.save_attention=true", *overrides])
    with pytest.raises(ConfigError, match=rf"^{field}: expected .* with train\.save_attention=true"):
        to_config(composed)


def test_saved_attention_refuses_attention_dropout(model):
    """A skipped attention op draws no random numbers, so the recompute's later dropout masks would differ."""
    model.config.attention_dropout = 0.1
    with pytest.raises(ValueError, match=r"^train\.save_attention: expected a model without attention dropout"):
        apply_activation_checkpointing(model, "full", save_attention=True)


def test_attention_that_is_no_saved_op_warns_and_is_recomputed(rng, tiny_model_config, tokenizer, caplog):
    """Eager attention (refused by the config, possible through the function) saves nothing: a warning, once, and
    the gradients of plain checkpointing."""
    model = build_model(tiny_model_config(num_layers=3, attn_implementation="eager"), tokenizer).train()
    batch = unpacked(packed_batch(rng, model.config.vocab_size))
    plain, saving = copy.deepcopy(model), copy.deepcopy(model)
    apply_activation_checkpointing(plain, "full")
    apply_activation_checkpointing(saving, "full", save_attention=True)
    with caplog.at_level(logging.WARNING, logger="legalpt.train.activations"):
        loss, grads = loss_and_grads(saving, batch)
    assert [r.message for r in caplog.records].count(
        "train.save_attention: the layers' attention ran as no op it saves (SDPA's math fallback or legalpt's flex "
        "backend?); it is recomputed in backward as without the option"
    ) == 1
    assert_same_training((loss, grads), loss_and_grads(plain, batch))


def test_trainer_with_checkpointing_and_chunked_loss_resumes_exactly(tmp_path, train_until_first_checkpoint):
    """The memory options train like the defaults (same eval losses up to float rounding) and resume bit-exactly."""
    from transformers import AutoModelForCausalLM

    def overrides(name: str, *extra: str) -> list[str]:
        return [
            "model=tiny", "data.synthetic_documents=6", "data.seq_len=128", "data.vocab_size=400",
            f"data.cache_dir={tmp_path / 'cache'}", "train.steps=4", "train.batch_size=2", "train.warmup_steps=1",
            "train.eval_every=2", "train.eval_batches=2", "train.save_every=2", "logger=none",
            f"train.output_dir={tmp_path / name}", *extra,
        ]  # fmt: skip

    memory = ("train.activation_checkpointing=selective", "train.save_attention=true", "train.loss_impl=chunked",
              "train.loss_chunk_tokens=100", "train.mlp_chunk_tokens=60")  # fmt: skip
    default = trainer.train(compose("train", overrides("default")))
    straight = trainer.train(compose("train", overrides("straight", *memory)))
    for (step, loss), (expected_step, expected) in zip(straight.eval_losses, default.eval_losses, strict=True):
        assert step == expected_step and loss == pytest.approx(expected, rel=1e-4)

    train_until_first_checkpoint(compose("train", overrides("resumed", *memory)))
    resumed = trainer.train(compose("train", overrides("resumed", *memory)))
    assert resumed.eval_losses[-1] == straight.eval_losses[-1]
    a = AutoModelForCausalLM.from_pretrained(straight.export_dir)
    b = AutoModelForCausalLM.from_pretrained(resumed.export_dir)
    for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        torch.testing.assert_close(pa, pb, rtol=0, atol=0, msg=name)
    config = json.loads((straight.export_dir / "config.json").read_text())
    assert config.get("use_cache", True)  # generation from the export keeps its KV cache
