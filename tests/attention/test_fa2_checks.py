"""Where fa2 or fa3 cannot run, the error says why before any launch, and `auto` falls back to the reference (CPU
tests: the CUDA inputs are stand-ins that carry only what the checks read)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from legalpt.attention import api, fa2, fa3, kernels
from legalpt.attention.masks import MaskSpec


def cuda_input(dtype=torch.bfloat16, head_dim=64) -> SimpleNamespace:
    return SimpleNamespace(device=torch.device("cuda", 0), dtype=dtype, shape=(2, 16, 4, head_dim))


@pytest.fixture
def capable_machine(monkeypatch):
    """A machine that passes every check before the build: sm90, sources and nvcc present."""
    monkeypatch.setattr(kernels, "unavailable_reason", lambda device: None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: "NVIDIA H200")
    monkeypatch.setattr(kernels, "_loaded", {})
    monkeypatch.setattr(kernels, "_build_errors", {})
    monkeypatch.setattr(api, "_auto_reasons_logged", set())


def test_an_old_gpu_is_named_with_its_compute_capability(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: (7, 5))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: "Tesla T4")
    with pytest.raises(ValueError, match=r"^backend: fa2 cannot run here: .*>= 8\.0.*Tesla T4 has 7\.5"):
        fa2.check(cuda_input())


def test_fa3_needs_a_hopper_gpu_and_a_hopper_build(capable_machine, monkeypatch):
    with pytest.raises(ValueError, match=r"^backend: fa3 cannot run here: it needs a CUDA device .* cpu"):
        fa3.check(torch.zeros(2, 16, 4, 64, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"^q: the fa3 backend supports bfloat16 and float16, got torch.float32"):
        fa3.check(cuda_input(dtype=torch.float32))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: "NVIDIA A100")
    with pytest.raises(ValueError, match=r"^backend: fa3 cannot run here: .*Hopper.*NVIDIA A100 has 8\.0"):
        fa3.check(cuda_input())
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: (9, 0))
    monkeypatch.setenv(kernels.ARCHS_ENV, "80")
    with pytest.raises(ValueError, match=r"^backend: fa3 cannot run here: .*not built for sm_90a"):
        fa3.check(cuda_input())
    builds = []
    monkeypatch.setattr(kernels, "_build", lambda head_dim: builds.append(head_dim) or SimpleNamespace())
    monkeypatch.setenv(kernels.ARCHS_ENV, "80;90")
    fa3.check(cuda_input(head_dim=100))
    assert builds == [128]  # zero-padded to the extension of head dim 128, which holds fa3's kernels


@pytest.mark.parametrize(("archs", "fa3"), [("80;90", True), ("90", True), ("80", False), ("80,86", False)], ids=str)
def test_hopper_builds_sm90a_with_the_fa3_kernels(monkeypatch, archs: str, fa3: bool):
    monkeypatch.setenv(kernels.ARCHS_ENV, archs)
    flags = kernels._gencode_flags()
    assert ("-gencode=arch=compute_90a,code=sm_90a" in flags) == fa3
    assert not any(f.endswith("sm_90") for f in flags), "Hopper's target is sm_90a"
    assert kernels.has_fa3() == fa3 == ("-DLEGALPT_FA3" in flags)


def test_a_failed_build_is_a_clear_error_and_auto_falls_back_once(capable_machine, monkeypatch, caplog):
    builds = []

    def failing_build(head_dim):
        builds.append(head_dim)
        raise OSError("nvcc fatal: unsupported gpu architecture")

    monkeypatch.setattr(kernels, "_build", failing_build)
    with pytest.raises(ValueError, match=r"^backend: fa2 cannot run here: fa2: building .* head_dim 64 failed.*nvcc"):
        fa2.check(cuda_input(head_dim=50))  # padded to 64
    with caplog.at_level(logging.INFO, logger="legalpt.attention.api"):
        assert [api._auto(cuda_input()) for _ in range(3)] == ["reference"] * 3
    assert builds == [64]  # a failed build is remembered, not retried on every call
    fallbacks = [r.getMessage() for r in caplog.records if "running the reference" in r.getMessage()]
    assert len(fallbacks) == 1 and "unsupported gpu architecture" in fallbacks[0]


def test_auto_runs_fa3_on_hopper(capable_machine, monkeypatch):
    monkeypatch.setattr(kernels, "_build", lambda head_dim: SimpleNamespace(head_dim=head_dim))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: (9, 0))
    monkeypatch.setenv(kernels.ARCHS_ENV, "80;90")
    assert api._auto(cuda_input()) == "fa3"
    monkeypatch.setenv(kernels.ARCHS_ENV, "80")
    assert api._auto(cuda_input()) == "fa2"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: "NVIDIA A100")
    monkeypatch.setenv(kernels.ARCHS_ENV, "80;90")
    assert api._auto(cuda_input()) == "fa2"


def test_auto_under_torch_compile_runs_fa3_only_on_hopper(capable_machine, monkeypatch):
    """While torch.compile traces, the build checks are left to the op, but the GPU's generation is known: auto must
    not pick fa3 for an sm80 GPU, whose op would then refuse it."""
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    monkeypatch.setenv(kernels.ARCHS_ENV, "80;90")
    assert api._auto(cuda_input()) == "fa3"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: "NVIDIA A100")
    assert api._auto(cuda_input()) == "fa2"
    with pytest.raises(ValueError, match=r"^backend: fa3 cannot run here: .*Hopper.*NVIDIA A100 has 8\.0"):
        fa3.check(cuda_input())


def test_auto_runs_fa2_where_it_builds(capable_machine, monkeypatch):
    monkeypatch.setattr(kernels, "_build", lambda head_dim: SimpleNamespace(head_dim=head_dim))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: (8, 0))  # no fa3 there
    assert api._auto(cuda_input()) == "fa2"
    assert api._auto(cuda_input(dtype=torch.float32)) == "reference"
    assert api._auto(cuda_input(head_dim=320)) == "reference"


@pytest.mark.parametrize("varlen", [False, True], ids=["batch", "varlen"])
def test_more_documents_than_a_launch_grid_holds_is_refused_before_launch(varlen: bool):
    documents = fa2.MAX_GRID_YZ + 1
    if varlen:
        q = torch.empty(documents, 1, 8)  # (total, H, D): one token per document
        cu = torch.arange(documents + 1, dtype=torch.int32)
        args, name = (cu, cu, 1, 1), "cu_seqlens_q"
    else:
        q = torch.empty(documents, 1, 1, 8)  # (B, S, H, D)
        args, name = (None, None, 1, 1), "q"
    with pytest.raises(ValueError, match=rf"^{name}: the fa2 kernels take at most 65535 documents .* got 65536"):
        fa2.forward(q, q, q, *args, MaskSpec(), 1.0, 0.0)
