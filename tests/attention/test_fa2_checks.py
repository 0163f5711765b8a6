"""Where fa2 or fa3 cannot run, the error says why before any launch, and `auto` falls back to the reference (CPU
tests: the CUDA inputs are stand-ins that carry only what the checks read)."""

from __future__ import annotations

import logging
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from legalpt.attention import api, build, kernels
from legalpt.attention.backends import AttentionBatch, cuda
from legalpt.attention.masks import MaskSpec


def cuda_batch(dtype=torch.bfloat16, head_dim=64) -> AttentionBatch:
    q = SimpleNamespace(device=torch.device("cuda", 0), dtype=dtype, shape=(2, 16, 4, head_dim), is_cuda=True)
    return AttentionBatch(q, q, q, None, None, 16, 16, MaskSpec(), 1.0)


def built(has_sm90: bool = True, head_dims: tuple[int, ...] = build.HEAD_DIMS) -> SimpleNamespace:
    """A stand-in for the extension module: what the checks read of it."""
    return SimpleNamespace(has_sm90=has_sm90, head_dims=head_dims)


@pytest.fixture
def capable_machine(monkeypatch):
    """A machine that passes every check: an sm90 GPU and the kernels built for it. Every cache starts empty."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: "NVIDIA H200")
    monkeypatch.setattr(kernels, "_extension", None)
    monkeypatch.setattr(kernels, "_load", built)
    monkeypatch.setattr(api, "_auto_reasons_logged", set())
    kernels._unavailable_reason.cache_clear()
    yield
    kernels._unavailable_reason.cache_clear()


def machine(monkeypatch, capability: tuple[int, int], name: str) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: name)
    kernels._unavailable_reason.cache_clear()


def test_an_old_gpu_is_named_with_its_compute_capability(capable_machine, monkeypatch):
    machine(monkeypatch, (7, 5), "Tesla T4")
    with pytest.raises(ValueError, match=r"^backend: fa2 cannot run here: .*>= 8\.0.*Tesla T4 has 7\.5"):
        cuda.FA2.check(cuda_batch())


def test_fa3_needs_a_hopper_gpu_and_a_hopper_build(capable_machine, monkeypatch):
    cpu = torch.zeros(2, 16, 4, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"^backend: fa3 cannot run here: it needs a CUDA device .* cpu"):
        cuda.FA3.check(AttentionBatch(cpu, cpu, cpu, None, None, 16, 16, MaskSpec(), 1.0))
    with pytest.raises(ValueError, match=r"^q: the fa3 backend supports bfloat16 and float16, got torch.float32"):
        cuda.FA3.check(cuda_batch(dtype=torch.float32))
    machine(monkeypatch, (8, 0), "NVIDIA A100")
    with pytest.raises(ValueError, match=r"^backend: fa3 cannot run here: .*Hopper.*NVIDIA A100 has 8\.0"):
        cuda.FA3.check(cuda_batch())
    machine(monkeypatch, (9, 0), "NVIDIA H200")
    monkeypatch.setattr(kernels, "_extension", built(has_sm90=False))
    with pytest.raises(ValueError, match=r"^backend: fa3 cannot run here: .*not built for sm_90a"):
        cuda.FA3.check(cuda_batch())
    cuda.FA2.check(cuda_batch())  # the sm80 path's kernels are there
    machine(monkeypatch, (9, 0), "NVIDIA H200")
    monkeypatch.setattr(kernels, "_extension", built(head_dims=(64,)))
    cuda.FA3.check(cuda_batch(head_dim=50))  # zero-padded to 64
    with pytest.raises(ValueError, match=r"^backend: fa3 cannot run here: head_dim 100 is above the built head dims"):
        cuda.FA3.check(cuda_batch(head_dim=100))


def test_a_missing_build_is_a_clear_error_and_auto_warns_once(capable_machine, monkeypatch, caplog):
    loads = []

    def not_built():
        loads.append(1)
        raise RuntimeError(f"the CUDA kernels are not built (No module named 'legalpt._C'); {kernels.INSTALL_HINT}")

    monkeypatch.setattr(kernels, "_load", not_built)
    with pytest.raises(ValueError, match=r"^backend: fa2 cannot run here: the CUDA kernels are not built .*pip"):
        cuda.FA2.check(cuda_batch(head_dim=50))
    with caplog.at_level(logging.INFO, logger="legalpt.attention.api"):
        assert [api._auto(cuda_batch()).name for _ in range(3)] == ["reference"] * 3
    assert loads == [1]  # a failed load is remembered, not retried on every call
    fallbacks = [r for r in caplog.records if "running the reference" in r.getMessage()]
    assert len(fallbacks) == 1 and "not built" in fallbacks[0].getMessage()
    assert fallbacks[0].levelno == logging.WARNING  # the inputs are on a GPU: never silent


def test_availability_is_decided_once_per_device_head_dim_and_dtype(capable_machine, monkeypatch):
    """The attention calls of a training step ask nothing of the machine after the first."""
    reads = []
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: reads.append(device) or (9, 0))
    for _ in range(5):
        api._auto(cuda_batch())
    assert len(reads) == 1  # fa3's check decided it; fa2's was never needed
    api._auto(cuda_batch(head_dim=128))
    assert len(reads) == 2


def test_auto_runs_fa3_on_hopper(capable_machine, monkeypatch):
    assert api._auto(cuda_batch()).name == "fa3"
    monkeypatch.setattr(kernels, "_extension", built(has_sm90=False))
    kernels._unavailable_reason.cache_clear()
    assert api._auto(cuda_batch()).name == "fa2"
    machine(monkeypatch, (8, 0), "NVIDIA A100")
    monkeypatch.setattr(kernels, "_extension", built())
    assert api._auto(cuda_batch()).name == "fa2"


def test_auto_under_torch_compile_runs_fa3_only_on_hopper(capable_machine, monkeypatch):
    """While torch.compile traces, the checks are constants of the trace (assume_constant_result): auto must not
    pick fa3 for an sm80 GPU, whose op would then refuse it."""
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert api._auto(cuda_batch()).name == "fa3"
    machine(monkeypatch, (8, 0), "NVIDIA A100")
    assert api._auto(cuda_batch()).name == "fa2"
    with pytest.raises(ValueError, match=r"^backend: fa3 cannot run here: .*Hopper.*NVIDIA A100 has 8\.0"):
        cuda.FA3.check(cuda_batch())


def test_auto_runs_fa2_where_it_runs(capable_machine, monkeypatch):
    machine(monkeypatch, (8, 0), "NVIDIA A100")  # no fa3 there
    assert api._auto(cuda_batch()).name == "fa2"
    assert api._auto(cuda_batch(dtype=torch.float32)).name == "reference"
    assert api._auto(cuda_batch(head_dim=320)).name == "reference"


@pytest.mark.parametrize("varlen", [False, True], ids=["batch", "varlen"])
def test_more_documents_than_a_launch_grid_holds_is_refused_before_launch(varlen: bool):
    """Checked by `check`, which forward and backward run before anything else."""
    documents = cuda.MAX_GRID_YZ + 1
    shape = (documents, 1, 8) if varlen else (documents, 1, 1, 8)  # (total, H, D) one token a document, (B, S, H, D)
    q = SimpleNamespace(device=torch.device("cuda", 0), dtype=torch.bfloat16, shape=shape, is_cuda=True)
    cu = torch.arange(documents + 1, dtype=torch.int32)
    args, name = ((cu, cu, 1, 1), "cu_seqlens_q") if varlen else ((None, None, 1, 1), "q")
    with pytest.raises(ValueError, match=rf"^{name}: the fa2 kernels take at most 65535 documents .* got 65536"):
        cuda.FA2.check(AttentionBatch(q, q, q, *args, MaskSpec(), 1.0))


def test_availability_is_a_constant_under_compile(recwarn):
    """torch.compile takes the decision as a constant in one graph, without stepping into its cache (Dynamo warns
    of any functools cache it traces: "silent incorrectness" in a training log)."""
    torch._dynamo.reset()

    @torch.compile(fullgraph=True, backend="eager")
    def step(x: torch.Tensor) -> torch.Tensor:
        return x + (1 if kernels.unavailable_reason(x.device, x.shape[-1], x.dtype, True) else 0)

    assert torch.equal(step(torch.zeros(2, 64)), torch.ones(2, 64))  # on a CPU: a reason, so + 1
    assert not [w for w in recwarn if "lru_cache" in str(w.message)]


@pytest.mark.cuda
def test_the_extension_raises_for_a_head_dim_it_lacks():
    """A C++ check that fails inside the built extension raises a RuntimeError naming its cause; it must not take
    the process down (a child process, so that a crash fails this test alone). Built by a GCC that links libstdc++
    statically, the module had a C++ runtime of its own and died here with a segmentation fault; the build now links
    the runtime torch loaded (build.runtime_link_flags)."""
    built = kernels.extension().head_dims
    missing = next((d for d in build.HEAD_DIMS if d not in built), None)
    if missing is None:
        pytest.skip("every head dim is built")
    code = f"import torch\nfrom legalpt.attention import kernels\nkernels.extension().tiles({missing}, True)"
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert child.returncode == 1, f"exit {child.returncode}: {child.stderr[-2000:]}"
    assert f"head_dim {missing} is not built" in child.stderr
