"""torch.compile of the decoder layers: one graph per layer shape, no graph break, legalpt attention inside as the
custom op, the loss and gradients of eager, and no recompilation when the next batch packs other documents.

The layers compile with backend="aot_eager": Dynamo and AOTAutograd trace, partition and differentiate the same graph
as inductor does, without generating kernels (inductor takes ~40 s per graph on two CPU cores; the trainer uses it)."""

import copy
import json

import pytest
import torch
from functorch.compile import make_boxed_func, min_cut_rematerialization_partition
from test_trainer import tiny_overrides
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.backends.registry import lookup_backend
from torch._dynamo.utils import counters

import legalpt.attention.ops  # noqa: F401 (registers torch.ops.legalpt)
import legalpt.train.trainer as trainer
from legalpt.attention import backends
from legalpt.config import ConfigError, TrainConfig, compose
from legalpt.data.pack import collate_packed
from legalpt.data.tokenizer import train_bpe
from legalpt.model import build_model
from legalpt.train.activations import ATTENTION_OPS, apply_activation_checkpointing, chunk_mlps
from legalpt.train.compile import compile_decoder_layers

LAYERS = 3
CASES = [  # attn_implementation, activation_checkpointing, save_attention, mlp_chunk_tokens
    ("legalpt", "none", False, 0),
    ("legalpt", "full", False, 0),
    ("legalpt", "full", True, 0),
    ("legalpt", "selective", False, 0),
    ("legalpt", "attention", False, 0),
    ("sdpa", "none", False, 0),
    ("legalpt", "none", False, 16),
    ("legalpt", "full", False, 16),
]
LEGALPT_OPS = {torch.ops.legalpt.attention_forward, torch.ops.legalpt.attention_forward.default}


@pytest.fixture(autouse=True)
def fresh_dynamo(monkeypatch):
    """No compiled code, counters or lazily loaded attention backend (flex) from an earlier test: each test compiles
    from the start, the backends as a fresh process has them."""
    torch._dynamo.reset()
    counters.clear()
    monkeypatch.setattr(backends, "_loaded", {n: b for n, b in backends._loaded.items() if n != "flex"})
    yield
    torch._dynamo.reset()


@pytest.fixture(scope="module")
def tokenizer():
    return train_bpe(["the parties agree to the terms of this agreement"] * 20, 300)


class RecordingBackend:
    """aot_eager, keeping each graph Dynamo hands over."""

    def __init__(self):
        self.graphs: list[torch.fx.GraphModule] = []

    def __call__(self, graph: torch.fx.GraphModule, example_inputs):
        self.graphs.append(graph)
        return lookup_backend("aot_eager")(graph, example_inputs)


def packed_batch(rng, vocab: int, doc_lens: list[list[int]]) -> dict:
    """Rows of random tokens packed with documents of `doc_lens` (one list per row), as the trainer's collator packs."""
    rows = [
        {"input_ids": [rng.randrange(vocab) for _ in range(sum(lens))], "seq_lens": lens, "num_pad": 0}
        for lens in doc_lens
    ]
    return collate_packed(rows)


def models_for(
    tiny_model_config, tokenizer, attn_implementation: str, checkpointing: str, copies: int = 1, save: bool = False,
    mlp_chunks: int = 0,
):  # fmt: skip
    """`copies` equal tiny Llamas (in train mode), each checkpointed by `checkpointing` (`save`: keeping attention's
    outputs; `mlp_chunks`: train.mlp_chunk_tokens, 0 = off) after copying: a copy would share its original's
    checkpointing closures, which hold the original's layers."""
    config = tiny_model_config(num_layers=LAYERS, attn_implementation=attn_implementation, attention_backend="auto")
    model = build_model(config, tokenizer).train()
    models = [model, *(copy.deepcopy(model) for _ in range(copies - 1))]
    for each in models:
        apply_activation_checkpointing(each, checkpointing, every=2, save_attention=save)
        if mlp_chunks:
            chunk_mlps(each, mlp_chunks)
    return models


def loss_and_grads(model, batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    loss = model(**batch).loss
    loss.backward()
    return loss.detach(), {name: p.grad for name, p in model.named_parameters()}


@pytest.mark.parametrize(("attn_implementation", "checkpointing", "save_attention", "mlp_chunks"), CASES)
def test_compiled_layers_are_one_graph_each_and_train_as_eager(
    rng, tiny_model_config, tokenizer, attn_implementation, checkpointing, save_attention, mlp_chunks
):
    """Layers of one kind share one graph (selective checkpointing makes two kinds), Dynamo breaks none, legalpt
    attention sits in it as the custom op, and loss and gradients equal the eager model's."""
    eager, compiled = models_for(
        tiny_model_config, tokenizer, attn_implementation, checkpointing, copies=2, save=save_attention,
        mlp_chunks=mlp_chunks,
    )  # fmt: skip
    backend = RecordingBackend()
    compile_decoder_layers(compiled, backend=backend)
    batch = packed_batch(rng, eager.config.vocab_size, [[30, 2, 16], [9, 20, 19]])

    loss, grads = loss_and_grads(compiled, batch)
    expected_loss, expected_grads = loss_and_grads(eager, batch)

    assert dict(counters["graph_break"]) == {}
    assert len(backend.graphs) == (2 if checkpointing == "selective" else 1)
    if attn_implementation == "legalpt":
        for graph in backend.graphs:
            # the op itself, or inside the checkpoint's subgraph
            targets = {node.target for module in graph.modules() for node in module.graph.nodes}
            assert targets & LEGALPT_OPS
    torch.testing.assert_close(loss, expected_loss, rtol=1e-5, atol=1e-6)
    for name, grad in expected_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)
    assert list(compiled.state_dict()) == list(eager.state_dict())  # checkpoints do not depend on train.compile


@pytest.mark.parametrize("attn_implementation", ["legalpt", "sdpa"])
def test_compiled_backward_reruns_attention_only_without_saving_it(rng, tiny_model_config, tokenizer,
                                                                    attn_implementation):  # fmt: skip
    """Under full checkpointing and Inductor's partitioner (min-cut), the backward graph recomputes the attention op;
    with train.save_attention it does not."""
    reruns = {}
    for save in (False, True):
        torch._dynamo.reset()
        (model,) = models_for(tiny_model_config, tokenizer, attn_implementation, "full", save=save)
        backward: list[torch.fx.GraphModule] = []

        def keep(graph, example_inputs, graphs=backward):
            graphs.append(graph)
            return make_boxed_func(graph.forward)

        forward = lambda graph, example_inputs: make_boxed_func(graph.forward)
        backend = aot_autograd(fw_compiler=forward, bw_compiler=keep, partition_fn=min_cut_rematerialization_partition)
        compile_decoder_layers(model, backend=backend)
        batch = packed_batch(rng, model.config.vocab_size, [[30, 2, 16], [9, 20, 19]])
        if attn_implementation == "sdpa":  # one causal document per row: SDPA's fused CPU kernel, not its math
            batch = {"input_ids": batch["input_ids"], "labels": batch["labels"]}
        loss_and_grads(model, batch)
        reruns[save] = sum(
            getattr(node.target, "overloadpacket", None) in ATTENTION_OPS for g in backward for node in g.graph.nodes
        )
    assert reruns[False] >= 1 and reruns[True] == 0


@pytest.mark.parametrize("attn_implementation", ["legalpt", "sdpa"])
def test_a_batch_of_other_documents_reuses_the_graph(rng, tiny_model_config, tokenizer, attn_implementation):
    """cu_seq_lens of another length and another longest document: the graph of the first batch serves."""
    (model,) = models_for(tiny_model_config, tokenizer, attn_implementation, "none")
    compile_decoder_layers(model, backend="aot_eager")
    vocab = model.config.vocab_size
    loss_and_grads(model, packed_batch(rng, vocab, [[30, 2, 16], [9, 20, 19]]))  # 6 documents, the longest 30
    with torch.compiler.set_stance("fail_on_recompile"):
        loss, _ = loss_and_grads(model, packed_batch(rng, vocab, [[4, 4, 4, 4, 32], [10, 10, 10, 10, 8]]))  # 10, 32
        loss_and_grads(model, packed_batch(rng, vocab, [[48], [40, 8]]))  # 3, 48
    assert counters["stats"]["unique_graphs"] == 1
    assert torch.isfinite(loss)


def test_compile_mode_and_offloading_are_checked():
    with pytest.raises(ConfigError, match=r"^train\.compile_mode: expected one of default, max-autotune"):
        TrainConfig(compile=True, compile_mode="reduce-overhead").validate()
    with pytest.raises(ConfigError, match=r"^train\.offload_activations: expected false with train\.compile=true"):
        TrainConfig(compile=True, offload_activations=True).validate()
    TrainConfig(compile=False, offload_activations=True).validate()
    with pytest.raises(ValueError, match=r"^train\.compile_mode"):
        compile_decoder_layers(torch.nn.Module(), "max-autotune")


def test_training_compiled_logs_the_first_step_apart_and_follows_eager(tmp_path, monkeypatch):
    """The first step's window is logged alone with its time (train/compile_s); the losses are those of eager."""

    def compile_on_aot_eager(model, mode):
        compile_decoder_layers(model, mode, backend="aot_eager")

    monkeypatch.setattr(trainer, "compile_decoder_layers", compile_on_aot_eager)
    losses = {}
    for compiled in (False, True):
        run_dir = tmp_path / f"compile_{compiled}"
        options = [f"train.output_dir={run_dir}", f"train.compile={compiled}", "train.steps=4", "train.save_every=4"]
        trainer.train(compose("train", tiny_overrides(tmp_path, *options)))
        lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        losses[compiled] = {m["step"]: m["train/loss"] for m in lines if "train/loss" in m}
        timed = [m for m in lines if "train/compile_s" in m]
        if compiled:
            assert [m["step"] for m in timed] == [1]
            assert timed[0]["train/compile_s"] > 0
        else:
            assert timed == []
    assert list(losses[True]) == [1, 2, 4]  # step 1 alone, then every log_every=2 steps
    assert list(losses[False]) == [2, 4]
    for step, loss in losses[False].items():
        assert losses[True][step] == pytest.approx(loss, rel=1e-4)
