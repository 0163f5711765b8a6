"""Training metrics: FLOPs and real tokens against hand counts, the GPU peak table, MFU's arithmetic, and what a run
logs (the learning rate the optimizer applied, no MFU or GPU memory on a CPU)."""

import json

import pytest
import torch
from accelerate import Accelerator
from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config

import legalpt.train.metrics as metrics
import legalpt.train.trainer as trainer
from legalpt.config import ConfigError, TrainConfig, compose
from legalpt.data.pack import collate_packed
from legalpt.train.metrics import ModelFlops, Peak, Throughput, device_peak, peak_for_name, visible_pairs

HIDDEN, HEADS, KV_HEADS, INTERMEDIATE, LAYERS, VOCAB = 32, 4, 2, 48, 2, 50


def tiny(config_class, **fields):
    config = config_class(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS,
        **fields,
    )
    return AutoModelForCausalLM.from_config(config)


@pytest.fixture
def packed_batch():
    """Two rows of 10: documents of 5 and 3 tokens then 2 pads, and one document of 10 tokens."""
    rows = [
        {"input_ids": [3, 4, 5, 6, 7, 8, 9, 10, 0, 0], "seq_lens": [5, 3, 2], "num_pad": 2},
        {"input_ids": list(range(11, 21)), "seq_lens": [10], "num_pad": 0},
    ]
    return collate_packed(rows)


def test_visible_pairs_equal_a_count_of_the_mask(rng):
    lengths = [rng.randint(1, 40) for _ in range(6)]
    for window in (None, 1, rng.randint(2, 12), 64):
        expected = [
            sum(1 for i in range(n) for j in range(n) if j <= i and (window is None or i - j < window)) for n in lengths
        ]
        assert visible_pairs(torch.tensor(lengths), window).tolist() == expected


def test_matmul_parameters_by_hand():
    head_dim = HIDDEN // HEADS
    per_layer = 2 * HIDDEN * HIDDEN + 2 * HIDDEN * KV_HEADS * head_dim + 3 * HIDDEN * INTERMEDIATE + 2 * HIDDEN
    expected = LAYERS * per_layer + HIDDEN + VOCAB * HIDDEN  # layers, final norm, LM head; no input embedding
    for tied in (True, False):
        flops = ModelFlops.of(tiny(LlamaConfig, tie_word_embeddings=tied))
        assert (flops.matmul_params, flops.num_heads, flops.head_dim) == (expected, HEADS, head_dim)
        assert flops.windows == (None, None)


def test_frozen_parameters_skip_their_weight_gradient():
    model = tiny(LlamaConfig, tie_word_embeddings=False)
    trainable = ModelFlops.of(model)
    model.requires_grad_(False)  # a frozen base, as LoRA leaves it; its embedding is still no matmul
    adapter = model.model.layers[0].self_attn.q_proj.weight
    adapter.requires_grad_(True)
    frozen = ModelFlops.of(model)
    assert frozen.frozen_params == trainable.matmul_params - adapter.numel() and trainable.frozen_params == 0
    per_token = 6 * adapter.numel() + 4 * frozen.frozen_params  # forward 2N; backward 2N (input) + 2N (weight)
    assert frozen.flops(tokens=10, layer_pairs=0) == 10 * per_token


def test_layer_windows_follow_the_config():
    assert ModelFlops.of(tiny(MistralConfig, sliding_window=3)).windows == (3, 3)
    assert ModelFlops.of(tiny(MistralConfig, sliding_window=None)).windows == (None, None)
    qwen = tiny(Qwen2Config, use_sliding_window=True, sliding_window=3, max_window_layers=1)
    assert ModelFlops.of(qwen).windows == (None, 3)


def test_step_flops_by_hand_for_causal_and_sliding_documents(packed_batch):
    # Real tokens: 5 + 3 + 10, the 2 pads left out. Visible pairs per layer:
    # causal: 15 + 6 + 55 = 76; window 3: (1+2+3+3+3) + (1+2+3) + (1+2+3*8) = 12 + 6 + 27 = 45.
    causal = ModelFlops(matmul_params=1000, num_heads=4, head_dim=8, windows=(None, None))
    sliding = ModelFlops(matmul_params=1000, num_heads=4, head_dim=8, windows=(3, 3))
    mixed = ModelFlops(matmul_params=1000, num_heads=4, head_dim=8, windows=(None, 3))
    assert causal.count(packed_batch).tolist() == [18, 2 * 76]
    assert sliding.count(packed_batch).tolist() == [18, 2 * 45]
    assert mixed.count(packed_batch).tolist() == [18, 76 + 45]
    # 6 N per token; per layer 3 (forward + backward) x 4 pairs x head_dim x heads
    assert sliding.flops(18, 2 * 45) == 6 * 1000 * 18 + 2 * 3 * 4 * 45 * 8 * 4


def test_tokens_exclude_padding_and_count_context(packed_batch):
    flops = ModelFlops(matmul_params=1, num_heads=1, head_dim=1, windows=(None,))
    assert packed_batch["input_ids"].numel() == 20 and flops.count(packed_batch)[0] == 18
    # A chunk that starts with 2 context tokens is attended through: all its tokens are real.
    continued = collate_packed([{"input_ids": [1, 2, 3, 4, 5, 6], "seq_lens": [4, 2], "context_lens": [2, 0],
                                 "num_pad": 0}])  # fmt: skip
    assert flops.count(continued)[0] == 6
    # A row of padding after a lone token (no target, context for nothing) trains on nothing.
    padding = collate_packed([{"input_ids": [2, 0, 0, 0], "seq_lens": [1, 3], "num_pad": 3}])
    assert flops.count(padding).tolist() == [0, 0]


def test_peak_table_names_known_gpus_only():
    assert peak_for_name("NVIDIA H100 80GB HBM3").tflops == 989.4
    assert peak_for_name("NVIDIA H200").tflops == 989.4
    assert peak_for_name("NVIDIA H100 PCIe").tflops == 756.5
    assert peak_for_name("NVIDIA A100-SXM4-80GB").tflops == 312.0
    assert peak_for_name("NVIDIA L40S").tflops == 362.1
    assert peak_for_name("NVIDIA L4").tflops == 121.0
    assert peak_for_name("NVIDIA GeForce GTX 1080") is None
    assert "H200" in peak_for_name("NVIDIA H200").name
    assert device_peak(torch.device("cpu"), None) is None
    assert device_peak(torch.device("cpu"), 123.0) == Peak("train.peak_tflops", 123.0)


def test_peak_tflops_must_be_positive():
    TrainConfig(peak_tflops=None).validate()
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ConfigError, match=r"^train\.peak_tflops"):
            TrainConfig(peak_tflops=bad).validate()


def test_throughput_reads_the_window_and_starts_another(packed_batch, monkeypatch):
    clock = iter([10.0, 12.0, 12.0])  # start; first read (2 s later); the next window's start
    monkeypatch.setattr(metrics.time, "perf_counter", lambda: next(clock))
    flops = ModelFlops(matmul_params=1000, num_heads=4, head_dim=8, windows=(3, 3))
    meter = Throughput(flops, Peak("test", 1e-6), Accelerator(cpu=True))
    assert list(meter.counted(iter([packed_batch, packed_batch]))) == [packed_batch, packed_batch]
    values = meter.read()
    tflops = flops.flops(36, 4 * 45) / 2.0 / 1e12
    assert values["train/tokens_per_s"] == 36 / 2.0
    assert values["train/tflops"] == pytest.approx(tflops)
    assert values["train/mfu"] == pytest.approx(tflops / 1e-6)
    assert (values["train/mfu_peak"], values["train/mfu_peak_tflops"]) == ("test", 1e-6)
    assert meter.counts.tolist() == [0, 0]


@pytest.mark.cuda
def test_peak_memory_is_this_runs_not_the_processes():
    """A benchmark trains several runs in one process: an earlier run's peak must not show in a later one's."""
    earlier = torch.empty(2**30, dtype=torch.uint8, device="cuda")  # 1 GiB, freed before the run starts
    del earlier
    meter = Throughput(ModelFlops(1000, 4, 8, (None,)), None, Accelerator())
    assert meter.read()["train/peak_gib"] < 0.5


def test_run_logs_the_applied_lr_and_no_mfu_on_cpu(tmp_path, monkeypatch):
    """The optimizer's own rate, read as each step begins, is the logged one (not the next step's)."""
    applied, build_optimizer = [], trainer.build_optimizer

    def recording_optimizer(model, cfg):
        optimizer = build_optimizer(model, cfg)
        optimizer.register_step_pre_hook(lambda opt, args, kwargs: applied.append(opt.param_groups[0]["lr"]))
        return optimizer

    monkeypatch.setattr(trainer, "build_optimizer", recording_optimizer)
    run_dir = tmp_path / "run"
    overrides = [
        "model=tiny",
        "data.synthetic_documents=6",
        "data.seq_len=128",
        "data.vocab_size=400",
        f"data.cache_dir={tmp_path / 'cache'}",
        f"train.output_dir={run_dir}",
        "train.steps=4",
        "train.batch_size=2",
        "train.warmup_steps=2",
        "train.eval_every=100",
        "train.save_every=100",
        "train.log_every=1",
        "logger=none",
    ]
    trainer.train(compose("train", overrides))
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    logged = [m for m in lines if "train/lr" in m]
    assert len(applied) == 4 and len(set(applied)) > 1  # warmup and decay: the rate differs from step to step
    assert [m["train/lr"] for m in logged] == applied
    assert all(m["train/tokens_per_s"] > 0 and m["train/tflops"] > 0 for m in logged)
    assert not any(key.startswith(("train/mfu", "train/peak_gib")) for m in logged for key in m)
