"""LoRA through peft (`train.lora`): the config's checks, frozen base and adapter count, the same gradients under
activation checkpointing, the chunked loss and torch.compile, checkpoints of the adapters alone, exact resume over an
unchanged base, and both exports loaded without legalpt (the merged folder by transformers alone, the adapter folder
by peft over the base checkpoint)."""

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file
from test_distributed import launch_two_cpu_processes, logged
from torch._dynamo.backends.registry import lookup_backend
from torch._dynamo.utils import counters
from torch.distributed.checkpoint import FileSystemReader
from train_helpers import tiny_overrides
from transformers import AutoModelForCausalLM

import legalpt.train.trainer as trainer
from legalpt.config import ConfigError, DataConfig, LoraConfig, TrainConfig, compose, to_config
from legalpt.data.pack import collate_packed
from legalpt.data.pipeline import prepare
from legalpt.eval.run import evaluate
from legalpt.model import build_model
from legalpt.train.activations import apply_activation_checkpointing, chunk_mlps
from legalpt.train.checkpoint import CheckpointError, folder_bytes, latest_checkpoint, state_bytes
from legalpt.train.compile import compile_decoder_layers, graph_breaks
from legalpt.train.lora import adapter_dir, add_adapters
from legalpt.train.loss import use_loss
from legalpt.train.optim import build_optimizer

# The tiny preset's shapes (conf/model/tiny.yaml): what each projection maps, in features and out features
HIDDEN, KV, MLP, LAYERS = 64, 2 * 16, 128, 2
PROJECTIONS = {"q_proj": (HIDDEN, HIDDEN), "k_proj": (HIDDEN, KV), "v_proj": (HIDDEN, KV), "o_proj": (HIDDEN, HIDDEN),
               "gate_proj": (HIDDEN, MLP), "up_proj": (HIDDEN, MLP), "down_proj": (MLP, HIDDEN)}  # fmt: skip
ADAPTERS = 2 * LAYERS * len(PROJECTIONS)  # an A and a B per projection and layer
ADAPTER_PARAMETERS = LAYERS * sum(4 * (i + o) for i, o in PROJECTIONS.values())  # at r = 4
# AdamW's state of one run at r = 4: float32 adapters, their two moments, and a float32 step count per adapter
ADAPTER_STATE_BYTES = 3 * 4 * ADAPTER_PARAMETERS + 4 * ADAPTERS
CHECKPOINT_OVERHEAD = 64 << 10  # RNG states, scheduler, trainer state, file headers


@pytest.fixture(scope="module")
def base(tmp_path_factory, tiny_model_config):
    """A tiny checkpoint with the demo corpus's tokenizer: the model.pretrained the adapters train over."""
    root = tmp_path_factory.mktemp("base")
    data = prepare(DataConfig(synthetic_documents=6, seq_len=128, vocab_size=400, cache_dir=str(root / "cache")))
    torch.manual_seed(0)
    model = build_model(tiny_model_config(), data.tokenizer)
    model.save_pretrained(root / "hf")
    data.tokenizer.save_pretrained(root / "hf")
    return root / "hf"


def lora_overrides(tmp_path, base, *extra: str, rows: int = 2) -> list[str]:
    """train_helpers' tiny run as LoRA fine-tuning of `base`, in micro-batches of `rows` rows."""
    lora = ("train.lora.enabled=true", "train.lora.r=4", "train.lora.alpha=8", "train.lr=1e-2")
    return tiny_overrides(tmp_path, f"train.batch_size={rows}", f"model.pretrained={base}", *lora, *extra)


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("train.lora.r=0", "train.lora.r"),
        ("train.lora.alpha=0", "train.lora.alpha"),
        ("train.lora.dropout=1.0", "train.lora.dropout"),
        ("train.lora.target_modules=[]", "train.lora.target_modules"),
        ("train.lora.export=gguf", "train.lora.export"),
        ("data.extend_tokenizer=true", "data.extend_tokenizer"),
        ("model.rope_scaling.type=linear", "model.rope_scaling.type"),
    ],
)
def test_bad_lora_values_are_named(tmp_path, base, override, key):
    extra = [override] + (["train.lora.export=adapter", "model.rope_scaling.factor=2"] if "rope" in override else [])
    with pytest.raises(ConfigError, match="^" + key.replace(".", r"\.") + ":"):
        to_config(compose("train", lora_overrides(tmp_path, base, *extra)))


def test_lora_needs_a_checkpoint_to_adapt(tmp_path):
    overrides = tiny_overrides(tmp_path, "train.lora.enabled=true")
    with pytest.raises(ConfigError, match=r"^model\.pretrained: expected a checkpoint with train\.lora\.enabled=true"):
        to_config(compose("train", overrides))
    LoraConfig().validate()  # the defaults pass


def test_adapters_alone_train_and_start_from_the_checkpoint(base):
    """The trainable parameters are r x (in + out) per target projection and layer, which the optimizer alone sees;
    B starts at zero, so the wrapped model computes what the checkpoint does."""
    model = AutoModelForCausalLM.from_pretrained(base)
    ids = torch.randint(3, 400, (2, 24))
    with torch.no_grad():
        expected = model(ids).logits
    wrapped = add_adapters(model, LoraConfig(r=4, alpha=8))
    trainable = [(name, p) for name, p in wrapped.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in name or ".lora_B." in name for name, _ in trainable)
    assert sum(p.numel() for _, p in trainable) == ADAPTER_PARAMETERS
    optimized = {id(p) for group in build_optimizer(wrapped, TrainConfig()).param_groups for p in group["params"]}
    assert optimized == {id(p) for _, p in trainable}
    with torch.no_grad():
        torch.testing.assert_close(wrapped(ids).logits, expected, rtol=0, atol=0)


def test_the_first_checkpoint_estimate_counts_the_adapters_and_their_adamw_state(base):
    wrapped = add_adapters(AutoModelForCausalLM.from_pretrained(base), LoraConfig(r=4, alpha=8))
    optimizer = build_optimizer(wrapped, TrainConfig())
    wrapped(torch.randint(3, 400, (2, 24)), labels=torch.randint(3, 400, (2, 24))).loss.backward()
    optimizer.step()
    assert state_bytes(wrapped, optimizer) == ADAPTER_STATE_BYTES


def assert_holds_the_adapters_alone(checkpoint, base) -> None:
    """A LoRA checkpoint's model state is the adapters alone, and it records the base it was trained over. Unsharded
    it is about as large as the adapters and their AdamW state, well below the base's weights; sharded, each tensor's
    file carries kilobytes of torch.distributed.checkpoint framing, which the tiny adapters do not outweigh."""
    assert json.loads((checkpoint / "lora_base.json").read_text())["folder"] == str(base.resolve())
    if (checkpoint / "model.safetensors").is_file():  # one process and DDP
        saved = load_file(checkpoint / "model.safetensors")
        shapes = {name: tensor.shape for name, tensor in saved.items()}
        assert ADAPTER_STATE_BYTES <= folder_bytes(checkpoint) <= ADAPTER_STATE_BYTES + CHECKPOINT_OVERHEAD
        assert folder_bytes(checkpoint) < (base / "model.safetensors").stat().st_size / 2
    else:
        metadata = FileSystemReader(checkpoint / "pytorch_model_fsdp_0").read_metadata().state_dict_metadata
        shapes = {name: entry.size for name, entry in metadata.items()}
    assert len(shapes) == ADAPTERS and all(".lora_A." in name or ".lora_B." in name for name in shapes)
    assert sum(shape.numel() for shape in shapes.values()) == ADAPTER_PARAMETERS


def test_a_target_that_names_no_layer_is_named(base):
    model = AutoModelForCausalLM.from_pretrained(base)
    with pytest.raises(ValueError, match=r"^train\.lora\.target_modules: expected linear layers .* got 'qkv_proj'"):
        add_adapters(model, LoraConfig(target_modules=["q_proj", "qkv_proj"]))


def adapter_gradients(base, batch: dict, patch) -> dict[str, torch.Tensor]:
    """Gradients of the adapters of a LoRA model of `base` (A and B drawn at random, the same every call: a B of zeros
    would leave A without gradient), after `patch` altered the HF model as the trainer would."""
    model = AutoModelForCausalLM.from_pretrained(base, attn_implementation="legalpt").train()
    patch(model)
    torch.manual_seed(0)  # peft draws A
    wrapped = add_adapters(model, LoraConfig(r=4, alpha=8, dropout=0.0))
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in wrapped.named_parameters():
            if ".lora_B." in name:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.1)
    wrapped(**batch).loss.backward()
    return {name: p.grad for name, p in wrapped.named_parameters() if p.requires_grad}


@pytest.mark.slow
def test_checkpointing_chunked_loss_and_compile_give_the_adapters_eager_gradients(base):
    """The patched forwards (checkpointing, chunked loss, MLP chunks) and the compiled one run peft's layers inside:
    the same gradients, and no graph break."""
    torch._dynamo.reset()
    counters.clear()
    rows = [{"input_ids": torch.randint(3, 400, (48,)).tolist(), "seq_lens": [30, 18], "num_pad": 0} for _ in range(2)]
    batch = collate_packed(rows)
    expected = adapter_gradients(base, batch, lambda model: None)
    patches = {
        "full checkpointing": lambda model: apply_activation_checkpointing(model, "full"),
        "attention checkpointing": lambda model: apply_activation_checkpointing(model, "attention"),
        "chunked loss": lambda model: use_loss(model, "chunked", 16),
        "MLP chunks": lambda model: chunk_mlps(model, 20),
        "compile": lambda model: compile_decoder_layers(model, backend=lookup_backend("aot_eager")),
    }
    try:
        for name, patch in patches.items():
            got = adapter_gradients(base, batch, patch)
            assert got.keys() == expected.keys()
            for key, grad in expected.items():
                torch.testing.assert_close(got[key], grad, rtol=1e-4, atol=1e-6, msg=f"{name}: {key}")
        assert counters["stats"]["unique_graphs"] >= 1 and not graph_breaks()
    finally:
        torch._dynamo.reset()


@pytest.mark.slow
def test_resumed_lora_run_equals_uninterrupted_run(tmp_path, base, train_until_first_checkpoint):
    """Adapter dropout draws random numbers: the checkpoint's RNG state makes the resumed steps draw the same."""
    run_b = tmp_path / "b"

    def config(run_dir):
        extra = ("train.lora.dropout=0.1", "train.lora.export=adapter", f"train.output_dir={run_dir}")
        return compose("train", lora_overrides(tmp_path, base, *extra))

    straight = trainer.train(config(tmp_path / "a"))
    train_until_first_checkpoint(config(run_b))
    assert latest_checkpoint(run_b).name == "step_000003"
    resumed = trainer.train(config(run_b))

    assert resumed.eval_losses[-1] == straight.eval_losses[-1]
    assert resumed.export_dir == adapter_dir(run_b) and not (run_b / "hf").exists()
    a = load_file(straight.export_dir / "adapter_model.safetensors")
    b = load_file(resumed.export_dir / "adapter_model.safetensors")
    assert a.keys() == b.keys() and len(a) == 2 * LAYERS * len(PROJECTIONS)
    assert all(torch.equal(a[name], b[name]) for name in a)


@pytest.mark.slow
def test_a_lora_resume_over_a_changed_base_is_refused(tmp_path, base, train_until_first_checkpoint):
    """The checkpoint holds the adapters alone: resuming them over other base weights would train another model."""
    changed = shutil.copytree(base, tmp_path / "base")
    config = compose("train", lora_overrides(tmp_path, changed, f"train.output_dir={tmp_path / 'run'}"))
    train_until_first_checkpoint(config)
    assert_holds_the_adapters_alone(latest_checkpoint(tmp_path / "run"), changed)
    weights = changed / "model.safetensors"
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))  # rewritten, same size
    with pytest.raises(CheckpointError, match=r"^train\.resume: .* has changed since \(weights ") as error:
        trainer.train(config)
    assert "\n" not in str(error.value)


MERGED_LOGITS = """
import sys
import torch
sys.modules["peft"] = sys.modules["legalpt"] = None  # an import of either fails: transformers alone loads the folder
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained(sys.argv[1])
torch.save(model(torch.load(sys.argv[2])).logits, sys.argv[3])
"""


@pytest.mark.slow
def test_lora_run_exports_a_merged_hf_folder_and_a_peft_adapter(tmp_path, base, caplog):
    run_dir = tmp_path / "run"
    caplog.set_level("INFO", logger="legalpt")
    result = trainer.train(compose("train", lora_overrides(tmp_path, base, "train.lora.export=both",
                                                           f"train.output_dir={run_dir}")))  # fmt: skip
    assert result.export_dir == run_dir / "hf"
    assert f"LoRA: training {ADAPTER_PARAMETERS:,} of" in caplog.text
    assert result.eval_losses[-1][1] < result.eval_losses[0][1]

    # The adapter folder: peft over the base checkpoint, which it names.
    config = json.loads((run_dir / "adapter" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(base) and config["r"] == 4 and config["lora_alpha"] == 8
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), run_dir / "adapter").eval()
    ids = torch.randint(3, 400, (2, 32))
    with torch.no_grad():
        expected = adapted(ids).logits
        plain = AutoModelForCausalLM.from_pretrained(base)(ids).logits
    assert not torch.allclose(expected, plain, atol=1e-3)  # training moved the adapters away from B = 0

    # The merged folder: transformers alone, without peft or legalpt importable, computes the adapted logits.
    torch.save(ids, tmp_path / "ids.pt")
    files = [str(path) for path in (run_dir / "hf", tmp_path / "ids.pt", tmp_path / "out.pt")]
    command = [sys.executable, "-c", MERGED_LOGITS, *files]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    torch.testing.assert_close(torch.load(tmp_path / "out.pt"), expected, rtol=1e-4, atol=1e-5)

    # Frozen: the weights without adapters are the checkpoint's, bit for bit; the adapted ones moved.
    merged, original = load_file(run_dir / "hf" / "model.safetensors"), load_file(base / "model.safetensors")
    assert merged.keys() == original.keys()
    for name, tensor in original.items():
        adapted_weight = name.rsplit(".", 2)[-2] in PROJECTIONS
        assert torch.equal(merged[name], tensor) != adapted_weight, name

    # legalpt-eval reads the run folder's merged export.
    eval_overrides = ["model=tiny", "logger=none", "eval.tasks=[perplexity]", "eval.max_documents=2",
                      "eval.perplexity_context=128", "eval.bootstrap=0", "data.synthetic_documents=6",
                      f"data.cache_dir={tmp_path / 'cache'}", f"eval.checkpoint={run_dir}",
                      f"eval.output_dir={tmp_path / 'eval'}"]  # fmt: skip
    report = evaluate(compose("eval", eval_overrides))
    perplexity = report["checkpoints"][str(run_dir / "hf")]["perplexity"]["by_kind"]["all"]
    assert perplexity["tokens"] > 0 and torch.isfinite(torch.tensor(perplexity["perplexity"]))


@pytest.fixture(scope="module")
def one_process(tmp_path_factory, base):
    """A LoRA run of two rows a step on one process, without dropout: what two processes of one row each compute."""
    tmp_path = tmp_path_factory.mktemp("one_process")
    overrides = ("train.lora.dropout=0", "train.lora.export=adapter", f"train.output_dir={tmp_path / 'run'}")
    return trainer.train(compose("train", lora_overrides(tmp_path, base, *overrides))).run_dir


@pytest.mark.slow
@pytest.mark.parametrize("distributed", ["ddp", "fsdp2"])
def test_lora_on_two_cpu_processes_matches_one_process(tmp_path, base, one_process, distributed):
    """DDP reduces the adapters' gradients; FSDP2 shards layers holding frozen and trainable weights. Either way the
    run agrees with one process of the same global batch, checkpoints the adapters alone, and resumes exactly."""
    run_dir = tmp_path / distributed
    settings = ("train.lora.dropout=0", "train.lora.export=adapter", f"train.distributed={distributed}")
    overrides = lora_overrides(tmp_path, base, *settings, f"train.output_dir={run_dir}", rows=1)
    ranks = launch_two_cpu_processes(tmp_path, *overrides)
    layers = {f"base_model.model.model.layers.{i}" for i in range(LAYERS)}
    assert layers <= set(ranks[0]["units"]) if distributed == "fsdp2" else not ranks[0]["units"]

    for key in ("train/loss", "train/grad_norm", "eval/loss"):
        assert logged(run_dir, key) == pytest.approx(logged(one_process, key), rel=1e-5), key
    adapters = load_file(run_dir / "adapter" / "adapter_model.safetensors")
    expected = load_file(one_process / "adapter" / "adapter_model.safetensors")
    assert adapters.keys() == expected.keys()
    for name, tensor in expected.items():
        torch.testing.assert_close(adapters[name], tensor, rtol=1e-4, atol=1e-6, msg=name)
    assert_holds_the_adapters_alone(latest_checkpoint(run_dir), base)
    assert_holds_the_adapters_alone(latest_checkpoint(one_process), base)

    shutil.rmtree(run_dir / "checkpoints" / "step_000006")
    shutil.move(run_dir / "adapter", tmp_path / "straight")
    launch_two_cpu_processes(tmp_path, *overrides)
    assert "at step 3" in (run_dir / "train.log").read_text()
    resumed = load_file(run_dir / "adapter" / "adapter_model.safetensors")
    straight = load_file(tmp_path / "straight" / "adapter_model.safetensors")
    assert all(torch.equal(resumed[name], straight[name]) for name in straight)
