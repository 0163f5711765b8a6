"""DDP and FSDP2 runs: the launch guard, the plugin and precision policy built from the config, evaluation in
lockstep, the 8B preset, and FSDP2 end to end on two CPU processes (gloo): sharded checkpoints, exact resume in fresh
processes, the gathered HF export, and agreement with a one-process run of the same global batch."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from accelerate.utils import FullyShardedDataParallelPlugin
from safetensors.torch import load_file
from torch.distributed.fsdp import CPUOffloadPolicy, StateDictType
from train_helpers import tiny_overrides
from transformers import AutoModelForCausalLM

import legalpt.train.trainer as trainer
from legalpt.config import ConfigError, TrainConfig, compose, to_config
from legalpt.data.pack import IGNORE_INDEX, collate_packed
from legalpt.eval.perplexity import heldout_loss
from legalpt.model import build_model, count_parameters
from legalpt.train.distributed import (
    accelerate_precision,
    build_accelerator,
    check_world_size,
    decoder_layer_classes,
    fsdp_plugin,
    in_lockstep,
)


class Vocabulary:
    """What a new model takes from its tokenizer: a size and three special token ids."""

    bos_token_id, eos_token_id, pad_token_id = 0, 1, 2

    def __init__(self, size: int):
        self.size = size

    def __len__(self) -> int:
        return self.size


def test_a_launch_split_into_separate_jobs_stops_before_the_run_folder(tmp_path, monkeypatch):
    """torchrun or `--multi_gpu` on a host without GPUs: WORLD_SIZE=2, but accelerate sees one process per job."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    run_dir = tmp_path / "run"
    with pytest.raises(RuntimeError, match=r"WORLD_SIZE=2 processes were launched, but accelerate joined 1"):
        trainer.train(compose("train", tiny_overrides(tmp_path, f"train.output_dir={run_dir}")))
    assert not run_dir.exists()


def test_bf16_parameters_in_an_unlaunched_process_are_refused(tmp_path):
    """bf16-fsdp needs FSDP2's process group: a plain process would autocast float32 parameters instead, so it stops
    and names the one-rank launch (in its own process: accelerate's state is one per process)."""
    run_dir = tmp_path / "run"
    code = "import sys; from legalpt.cli import train_main; sys.argv[0] = 'legalpt-train'; train_main()"
    env = {k: v for k, v in os.environ.items() if k != "WORLD_SIZE"} | {"WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
    precision = ["train.distributed=fsdp2", "train.precision=bf16-fsdp", f"train.output_dir={run_dir}"]
    args = [sys.executable, "-c", code, *tiny_overrides(tmp_path, *precision)]
    result = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert "train.precision: bf16-fsdp needs FSDP2" in last and "torchrun --standalone --nproc-per-node 1" in last
    assert not (run_dir / "checkpoints").exists()


def test_legalpt_train_stops_a_split_launch_before_hydra_makes_the_run_folder(tmp_path):
    """The console script: Hydra would create the run folder (its config, train.log) before the command runs."""
    run_dir = tmp_path / "run"
    code = "import sys; from legalpt.cli import train_main; sys.argv[0] = 'legalpt-train'; train_main()"
    env = {**os.environ, "WORLD_SIZE": "2", "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
    args = [sys.executable, "-c", code, "model=tiny", f"train.output_dir={run_dir}"]
    result = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode != 0
    assert "WORLD_SIZE=2 processes were launched, but accelerate joined 1" in result.stderr.splitlines()[-1]
    assert not run_dir.exists()


def test_the_guard_passes_a_job_that_holds_every_launched_process(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    check_world_size(SimpleNamespace(num_processes=1))
    monkeypatch.setenv("WORLD_SIZE", "4")
    check_world_size(SimpleNamespace(num_processes=4))
    with pytest.raises(RuntimeError, match="WORLD_SIZE=4"):
        check_world_size(SimpleNamespace(num_processes=2))


def test_ddp_refuses_a_launcher_configured_for_fsdp(monkeypatch):
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    with pytest.raises(ConfigError, match=r"^train\.distributed: expected fsdp2"):
        build_accelerator(TrainConfig(distributed="ddp"), None)


def test_launch_configs_describe_processes_not_sharding():
    """scripts/launch/'s accelerate configs load, and leave sharding to train.distributed (no FSDP launch)."""
    from accelerate.commands.config.config_args import load_config_from_file

    launch = Path(__file__).resolve().parents[2] / "scripts" / "launch"
    for name, machines in [("one_node", 1), ("two_nodes", 2)]:
        config = load_config_from_file(str(launch / f"{name}.yaml"))
        assert (config.distributed_type, config.num_machines) == ("MULTI_GPU", machines)
        assert config.num_processes == 8 * machines and not config.use_cpu and config.fsdp_config == {}


@pytest.mark.parametrize(
    ("fields", "key"),
    [
        ({"distributed": "zero3"}, "train.distributed"),
        ({"precision": "fp8"}, "train.precision"),
        ({"precision": "bf16-fsdp"}, "train.distributed"),  # DDP has no parameter casting
        ({"precision": "bf16-fsdp", "distributed": "fsdp2", "mixed_precision": "fp16"}, "train.mixed_precision"),
    ],
)
def test_bad_distributed_and_precision_values_are_named(fields, key):
    with pytest.raises(ConfigError, match="^" + key.replace(".", r"\.") + ":"):
        TrainConfig(**fields).validate()


def test_fsdp2_plugin_comes_from_the_config_alone(monkeypatch):
    """FSDP_* variables that a launcher exports (here: all set against the config) change nothing."""
    for name, value in [("VERSION", "1"), ("STATE_DICT_TYPE", "FULL_STATE_DICT"), ("OFFLOAD_PARAMS", "true"),
                        ("ACTIVATION_CHECKPOINTING", "true"), ("CPU_RAM_EFFICIENT_LOADING", "true"),
                        ("RESHARD_AFTER_FORWARD", "true")]:  # fmt: skip
        monkeypatch.setenv(f"FSDP_{name}", value)
    tc = TrainConfig(distributed="fsdp2", precision="bf16-fsdp", reshard_after_forward=False)
    plugin = fsdp_plugin(tc)
    assert isinstance(plugin, FullyShardedDataParallelPlugin)
    assert plugin.fsdp_version == 2
    assert plugin.state_dict_type == StateDictType.SHARDED_STATE_DICT
    assert plugin.reshard_after_forward is False
    assert not plugin.activation_checkpointing and not plugin.cpu_ram_efficient_loading
    assert not isinstance(plugin.cpu_offload, CPUOffloadPolicy)
    assert plugin.auto_wrap_policy.__name__ == "transformer_auto_wrap_policy"
    policy = plugin.mixed_precision_policy
    assert (policy.param_dtype, policy.reduce_dtype) == (torch.bfloat16, torch.float32)


def test_autocast_keeps_fsdp2_in_float32_and_ddp_has_no_plugin(monkeypatch):
    monkeypatch.setenv("FSDP_CPU_RAM_EFFICIENT_LOADING", "false")  # the plugin exports its value: restored after
    policy = fsdp_plugin(TrainConfig(distributed="fsdp2")).mixed_precision_policy
    assert (policy.param_dtype, policy.reduce_dtype, policy.output_dtype) == (None, None, None)
    assert fsdp_plugin(TrainConfig()) is None


def test_accelerate_precision_follows_the_precision_mode():
    assert accelerate_precision(TrainConfig(distributed="fsdp2", precision="bf16-fsdp")) == "bf16"
    assert accelerate_precision(TrainConfig(mixed_precision="fp16")) == "fp16"
    assert accelerate_precision(TrainConfig(mixed_precision="no")) == "no"


def test_fsdp2_units_are_the_decoder_layers_of_each_arch(tiny_model_config):
    expected = {"llama": "LlamaDecoderLayer", "mistral": "MistralDecoderLayer", "qwen2": "Qwen2DecoderLayer"}
    for arch, layer in expected.items():
        model = build_model(tiny_model_config(arch=arch), Vocabulary(300))
        assert decoder_layer_classes(model) == [layer]
        assert all(type(block).__name__ == layer for block in model.model.layers)
    with pytest.raises(ValueError, match=r"train\.distributed=fsdp2: Linear names no decoder layer class"):
        decoder_layer_classes(torch.nn.Linear(2, 2))


def test_ranks_with_fewer_heldout_batches_run_target_free_ones(tiny_model_config):
    """A rank with one batch, while another has three, runs two more forwards that add nothing to the loss sums."""
    model = build_model(tiny_model_config(attn_implementation="sdpa"), Vocabulary(300))
    rows = [{"input_ids": torch.randint(3, 300, (16,)).tolist(), "seq_lens": [10, 6], "num_pad": 0} for _ in range(2)]
    real = collate_packed(rows[1:])
    accelerator = SimpleNamespace(device=torch.device("cpu"), gather=lambda own: torch.cat([own, torch.tensor([3])]))
    batches = list(in_lockstep([real], rows, accelerator, max_batches=0))
    assert len(batches) == 3 and batches[0] is real
    assert all((b["labels"] == IGNORE_INDEX).all() and b["input_ids"].shape == (1, 16) for b in batches[1:])
    assert heldout_loss(model, batches) == heldout_loss(model, [real])

    alone = SimpleNamespace(device=torch.device("cpu"), gather=lambda own: own)
    assert list(in_lockstep([real, real, real], rows, alone, max_batches=2)) == [real, real]


def test_8b_preset_is_llama_3_8b_shaped():
    """Built on the meta device (no memory) at Llama 3's vocabulary: the count published for Llama-3-8B, which the
    closed form of a Llama with untied embeddings gives too."""
    cfg = to_config(compose("train", ["model=8b"])).model
    vocab, hidden, layers, heads, kv_heads, mlp = 128256, 4096, 32, 32, 8, 14336
    with torch.device("meta"):
        model = build_model(cfg, Vocabulary(vocab))
    config = model.config
    assert (config.hidden_size, config.num_hidden_layers, config.intermediate_size) == (hidden, layers, mlp)
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (heads, kv_heads, 128)
    assert config.rope_parameters["rope_theta"] == 500000.0 and not config.tie_word_embeddings
    head_dim = hidden // heads
    attention = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim  # q, o and k, v projections
    per_layer = attention + 3 * hidden * mlp + 2 * hidden  # + gate, up, down and two RMSNorm gains
    closed_form = layers * per_layer + hidden + 2 * vocab * hidden  # + final norm, embedding and LM head
    assert count_parameters(model) == closed_form == 8_030_261_248


WORKER = """
import json, sys
from torch.distributed.fsdp import FSDPModule
import legalpt.train.trainer as trainer
from legalpt.cli import train_main

prepare = trainer.prepare_model_and_optimizer

def say(line):  # one write per line: print's separate newline write lets the ranks' lines interleave
    sys.stdout.write(line + "\\n")
    sys.stdout.flush()

def report_units(accelerator, model, optimizer, tc):
    model, optimizer = prepare(accelerator, model, optimizer, tc)
    units = [name for name, module in model.named_modules() if isinstance(module, FSDPModule)]
    dtypes = sorted({str(p.dtype) for p in model.parameters()} | {str(p.dtype) for g in optimizer.param_groups
                                                                     for p in g["params"]})

    def report_compute(layer, args, output):  # the first decoder layer's output dtype, once
        say("FSDP_COMPUTE " + str(output[0].dtype if isinstance(output, tuple) else output.dtype))
        handle.remove()

    # unwrapped and through get_decoder: the same layer under DDP, FSDP2 and peft's LoRA wrapper
    handle = accelerator.unwrap_model(model).get_decoder().layers[0].register_forward_hook(report_compute)
    say("FSDP_UNITS " + json.dumps({"rank": accelerator.process_index, "units": units, "dtypes": dtypes}))
    return model, optimizer

trainer.prepare_model_and_optimizer = report_units
sys.argv[0] = "legalpt-train"
train_main()
"""


def launch_two_cpu_processes(tmp_path, *overrides) -> list[dict]:
    """`legalpt-train` under torchrun with two CPU processes, as the README's CPU recipe runs it; returns, per rank, its
    FSDP units, the dtypes of its parameters and its optimizer's, and the dtypes the first decoder layer computed in
    (over both ranks)."""
    script = tmp_path / "legalpt_train.py"
    script.write_text(WORKER)
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script)]
    result = subprocess.run([*command, *overrides], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    ranks = [json.loads(line.split(" ", 1)[1]) for line in result.stdout.splitlines() if line.startswith("FSDP_UNITS")]
    computed = {line.split(" ", 1)[1] for line in result.stdout.splitlines() if line.startswith("FSDP_COMPUTE")}
    return sorted(({**rank, "compute": computed} for rank in ranks), key=lambda rank: rank["rank"])


def logged(run_dir, key: str) -> dict[int, float]:
    """Step → the value of `key` in the run's metrics.jsonl, for the steps that logged it."""
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {line["step"]: line[key] for line in lines if key in line}


@pytest.mark.slow
def test_fsdp2_on_two_cpu_processes_resumes_exactly_and_exports_a_plain_hf_folder(tmp_path):
    run_dir = tmp_path / "fsdp2"
    overrides = tiny_overrides(tmp_path, "train.batch_size=1", "train.distributed=fsdp2", f"train.output_dir={run_dir}")
    ranks = launch_two_cpu_processes(tmp_path, *overrides)

    # One FSDP2 unit per decoder layer, the root, and the embedding tied to the LM head with the final norm.
    assert [rank["rank"] for rank in ranks] == [0, 1]
    assert ranks[0]["compute"] == {"torch.float32"}  # autocast follows train.mixed_precision: none on a CPU
    assert {"", "model.layers.0", "model.layers.1", "model.embed_tokens", "lm_head"} <= set(ranks[0]["units"])
    # Sharded checkpoints: each rank wrote its own shard of the model and of AdamW's state, nobody a full copy.
    for step in ("step_000003", "step_000006"):
        for part in ("pytorch_model_fsdp_0", "optimizer_0"):
            assert {p.name for p in (run_dir / "checkpoints" / step / part).glob("*.distcp")} == {
                "__0_0.distcp",
                "__1_0.distcp",
            }
        assert not list((run_dir / "checkpoints" / step).glob("*.safetensors"))

    # The same global batch (2 rows a step) on one process: sharding changes only the order of float sums, so the
    # loss, the gradient norm (which a wrong gradient averaging would scale), evaluation and weights agree closely.
    reference = trainer.train(
        compose("train", tiny_overrides(tmp_path, "train.batch_size=2", f"train.output_dir={tmp_path / 'one'}"))
    )
    for key in ("train/loss", "train/grad_norm", "train/tokens", "eval/loss"):
        assert logged(run_dir, key) == pytest.approx(logged(reference.run_dir, key), rel=1e-5), key
    sharded = logged(run_dir, "eval/loss")
    assert list(sharded) == [0, 3, 6]
    exported = load_file(run_dir / "hf" / "model.safetensors")
    expected = load_file(reference.export_dir / "model.safetensors")
    assert exported.keys() == expected.keys()  # the LM head tied to the embedding is not saved twice
    for name, tensor in expected.items():
        torch.testing.assert_close(exported[name], tensor, rtol=1e-4, atol=1e-6, msg=name)

    # Killed after step 3: fresh processes resume from its sharded checkpoint and end bit for bit where the run did.
    shutil.rmtree(run_dir / "checkpoints" / "step_000006")
    shutil.move(run_dir / "hf", tmp_path / "straight_hf")
    launch_two_cpu_processes(tmp_path, *overrides)
    resumed_from = run_dir.resolve() / "checkpoints" / "step_000003"
    assert f"resumed from {resumed_from} at step 3" in (run_dir / "train.log").read_text()
    assert logged(run_dir, "eval/loss") == sharded
    resumed = load_file(run_dir / "hf" / "model.safetensors")
    straight = load_file(tmp_path / "straight_hf" / "model.safetensors")
    assert all(torch.equal(resumed[name], straight[name]) for name in straight)

    # A plain HF folder: transformers alone loads it, float32 as trained, and it runs.
    model = AutoModelForCausalLM.from_pretrained(run_dir / "hf", attn_implementation="sdpa")
    assert model.config.architectures == ["LlamaForCausalLM"] and model.dtype == torch.float32
    assert torch.isfinite(model(torch.randint(400, (1, 16))).logits).all()


@pytest.mark.slow
def test_bf16_fsdp_computes_in_bfloat16_on_float32_master_weights(tmp_path):
    """train.precision=bf16-fsdp: FSDP2 gathers bfloat16 copies for compute; the sharded parameters AdamW steps stay
    float32, and so does the export. The loss stays within bfloat16's reach of a float32 run of the same batches."""
    run_dir = tmp_path / "bf16"
    precision = ("train.distributed=fsdp2", "train.precision=bf16-fsdp")
    fsdp2 = (*precision, "train.batch_size=1", f"train.output_dir={run_dir}")
    ranks = launch_two_cpu_processes(tmp_path, *tiny_overrides(tmp_path, *fsdp2, steps=2))
    assert [rank["dtypes"] for rank in ranks] == [["torch.float32"]] * 2  # parameters and AdamW's, on both ranks
    assert ranks[0]["compute"] == {"torch.bfloat16"}
    assert {"model.layers.0", "model.layers.1"} <= set(ranks[0]["units"])

    one_process = ("train.batch_size=2", f"train.output_dir={tmp_path / 'fp32'}")
    reference = trainer.train(compose("train", tiny_overrides(tmp_path, *one_process, steps=2)))
    bf16 = logged(run_dir, "eval/loss")
    assert bf16 == pytest.approx(dict(reference.eval_losses), rel=1e-2)
    assert bf16 != pytest.approx(dict(reference.eval_losses), rel=1e-5)  # bfloat16 rounding did happen
    exported = load_file(run_dir / "hf" / "model.safetensors")
    assert {tensor.dtype for tensor in exported.values()} == {torch.float32}
