"""Profiling a few training steps: the window, the files it writes, the kinds and busy time it reports."""

import json

import pytest
import torch
from train_helpers import tiny_overrides

import legalpt.train.trainer as trainer
from legalpt.config import compose
from legalpt.train.profiling import StepProfiler, busy_us, kind_of


def test_a_run_profiles_the_steps_asked_for(tmp_path):
    run_dir = tmp_path / "run"
    overrides = tiny_overrides(
        tmp_path, f"train.output_dir={run_dir}", "train.profile_steps=2", "train.profile_start=1"
    )
    trainer.train(compose("train", overrides))

    folder = run_dir / "profile"
    assert sorted(p.name for p in folder.iterdir()) == ["ops-rank0.txt", "summary-rank0.json", "trace-rank0.json"]
    summary = json.loads((folder / "summary-rank0.json").read_text())
    assert summary["steps"] == 2 and summary["wall_ms"] > 0
    trace = json.loads((folder / "trace-rank0.json").read_text())
    # the model's forward ran inside the window: its linear layers are in the trace
    assert any(event.get("name") == "aten::linear" for event in trace["traceEvents"])
    assert "aten::" in (folder / "ops-rank0.txt").read_text()


def test_no_profile_unless_asked(tmp_path):
    run_dir = tmp_path / "run"
    trainer.train(compose("train", tiny_overrides(tmp_path, f"train.output_dir={run_dir}")))
    assert not (run_dir / "profile").exists()


def test_the_window_must_end_within_the_run(tmp_path):
    overrides = tiny_overrides(
        tmp_path, f"train.output_dir={tmp_path}", "train.profile_steps=4", "train.profile_start=3"
    )
    with pytest.raises(ValueError, match=r"train\.profile_start.*at most train\.steps - train\.profile_steps = 2"):
        trainer.train(compose("train", overrides))


def test_profiler_starts_and_stops_at_its_steps(tmp_path):
    profiler = StepProfiler(tmp_path, start=2, count=1, rank=0)
    for completed in range(2):
        profiler.before_step(completed)
        assert profiler.profiler is None
        profiler.after_step(completed + 1)
    profiler.before_step(2)
    assert profiler.profiler is not None
    torch.ones(8).sum()
    profiler.after_step(3)
    assert profiler.profiler is None and (tmp_path / "summary-rank0.json").exists()


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("void legalpt::fa3::fwd_kernel<cutlass::bfloat16_t, 64>(legalpt::fa3::FwdArgs)", "attention"),
        ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16", "attention"),
        ("nvjet_sm90_tst_128x256_64x4_1x2_h_bz_coopA_NNT", "matmul"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "matmul"),
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "communication"),
        ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdam>", "optimizer"),
        ("Memcpy DtoH (Device -> Pinned)", "memory"),
        ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>", "other"),
    ],
)
def test_kernels_are_sorted_by_kind(name, kind):
    assert kind_of(name) == kind


def test_busy_time_counts_overlapping_kernels_once():
    assert busy_us([]) == 0
    assert busy_us([(0, 10), (5, 15), (20, 30), (22, 25)]) == 25
    assert busy_us([(20, 30), (0, 10)]) == 20
