"""Building and loading the CUDA kernels of csrc/, and saying why they cannot run where they cannot.

Nothing here runs at import. The first use of a head dimension builds its extension with torch's JIT builder
(ninja + nvcc) into a cache folder and loads it; later processes load the cached build. The extension name carries
a hash of every file under csrc/, so an edited kernel is rebuilt and a stale build is never loaded.
`legalpt-build-kernels` builds every head dimension ahead of time, in parallel.

`fa2_emulated` builds the same kernels for the CPU (csrc/common/emulate.h: each CUDA thread a fiber), so that
tests check their index math, masks and barriers on machines without a GPU.

Environment: LEGALPT_KERNEL_CACHE (the cache folder; default ~/.cache/legalpt/kernels), LEGALPT_CUDA_ARCHS
(compute capabilities to build, default "80;90": sm_80 machine code runs on Ampere and Ada, sm_90a on Hopper,
where it adds the fa3 kernels).
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType

import torch

log = logging.getLogger(__name__)

CSRC = Path(__file__).resolve().parents[2] / "csrc"
HEAD_DIMS = (32, 64, 96, 128, 192, 256)  # instantiated head dims; others are zero-padded up to the next one
CACHE_ENV = "LEGALPT_KERNEL_CACHE"
ARCHS_ENV = "LEGALPT_CUDA_ARCHS"
_loaded: dict[int, ModuleType] = {}
_build_errors: dict[int, str] = {}
_emulated: dict[int, ModuleType] = {}


def padded_head_dim(head_dim: int) -> int | None:
    """The instantiated head dim a head dim runs as (zero-padded), or None above the largest."""
    return next((d for d in HEAD_DIMS if d >= head_dim), None)


def unavailable_reason(device: torch.device) -> str | None:
    """Why the fa2 kernels cannot run on `device` (None when they can, as far as can be told before building)."""
    if device.type != "cuda":
        return f"it needs a CUDA device and the inputs are on {device.type}"
    major, minor = torch.cuda.get_device_capability(device)
    if major < 8:
        name = torch.cuda.get_device_name(device)
        return f"it needs compute capability >= 8.0 (sm80+), and {name} has {major}.{minor}"
    if not CSRC.is_dir():
        return f"the kernel sources are not at {CSRC} (install legalpt from a source checkout: pip install -e .)"
    from torch.utils.cpp_extension import CUDA_HOME

    if CUDA_HOME is None or shutil.which(os.path.join(CUDA_HOME, "bin", "nvcc")) is None:
        return "nvcc was not found to build the kernels (set CUDA_HOME to a CUDA toolkit)"
    return None


@torch.compiler.assume_constant_result  # a constant while torch.compile traces: the GPU and the build settings
def hopper_unavailable_reason(device: torch.device) -> str | None:
    """Why the fa3 kernels cannot run on the CUDA `device` beyond `unavailable_reason`'s reasons (None if they can)."""
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) != (9, 0):
        return f"it needs a Hopper GPU (sm90), and {torch.cuda.get_device_name(device)} has {major}.{minor}"
    if not has_fa3():
        return f"the kernels are not built for sm_90a ({ARCHS_ENV} lacks 90)"
    return None


def fa2(head_dim: int) -> ModuleType:
    """The FA2 extension for an instantiated head dim, built on first use; RuntimeError saying why if that fails."""
    if head_dim in _loaded:
        return _loaded[head_dim]
    if head_dim in _build_errors:
        raise RuntimeError(f"fa2: the build for head_dim {head_dim} failed earlier: {_build_errors[head_dim]}")
    started = time.perf_counter()
    try:
        module = _build(head_dim)
    except Exception as error:  # any build failure becomes one readable error, remembered for the process
        _build_errors[head_dim] = f"{type(error).__name__}: {error}".strip()[-2000:]
        raise RuntimeError(
            f"fa2: building the kernels for head_dim {head_dim} failed: {_build_errors[head_dim]}"
        ) from error
    log.info("fa2 kernels for head_dim %d ready in %.1f s", head_dim, time.perf_counter() - started)
    _loaded[head_dim] = module
    return module


def _build(head_dim: int) -> ModuleType:
    from torch.utils.cpp_extension import load

    name = f"legalpt_fa2_hdim{head_dim}_{_source_hash()}"
    build_dir = cache_dir() / name
    build_dir.mkdir(parents=True, exist_ok=True)
    flags = ["-O3", "--use_fast_math", "-lineinfo", f"-DLEGALPT_HEAD_DIM={head_dim}", *_gencode_flags()]
    return load(
        name=name,
        sources=[str(CSRC / "fa2" / "fa2.cu")],
        extra_cuda_cflags=flags,
        extra_cflags=["-O3"],
        build_directory=str(build_dir),
        verbose=False,
    )


def fa2_emulated(head_dim: int) -> ModuleType:
    """The FA2 kernels of one head dim compiled for the CPU (same signatures as `fa2`'s; they take CPU tensors)."""
    if head_dim not in _emulated:
        from torch.utils.cpp_extension import load

        name = f"legalpt_fa2_emulated_hdim{head_dim}_{_source_hash()}"
        build_dir = cache_dir() / name
        build_dir.mkdir(parents=True, exist_ok=True)
        flags = ["-O1", "-std=c++20", "-Wno-unknown-pragmas", "-DLEGALPT_EMULATE", f"-DLEGALPT_HEAD_DIM={head_dim}"]
        _emulated[head_dim] = load(
            name=name,
            sources=[str(CSRC / "fa2" / "emulated.cpp")],
            extra_cflags=flags,
            build_directory=str(build_dir),
            verbose=False,
        )
    return _emulated[head_dim]


def cache_dir() -> Path:
    root = os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "legalpt" / "kernels"
    return Path(root) / f"torch{torch.__version__.split('+')[0]}-cuda{torch.version.cuda}"


def _source_hash() -> str:
    digest = hashlib.sha256()
    for path in sorted(CSRC.rglob("*")):
        if path.is_file():
            digest.update(path.relative_to(CSRC).as_posix().encode())
            digest.update(path.read_bytes())
    digest.update(" ".join(_gencode_flags()).encode())
    return digest.hexdigest()[:12]


def _gencode_flags() -> list[str]:
    """nvcc's targets; Hopper's is sm_90a, whose wgmma the fa3 kernels need (LEGALPT_FA3 tells the host code)."""
    archs = [a.strip() for a in os.environ.get(ARCHS_ENV, "80;90").replace(",", ";").split(";") if a.strip()]
    archs = ["90a" if a == "90" else a for a in archs]
    flags = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
    return [*flags, "-DLEGALPT_FA3"] if "90a" in archs else flags


def has_fa3() -> bool:
    """Whether the builds target Hopper (sm_90a), which the fa3 kernels run on."""
    return "-DLEGALPT_FA3" in _gencode_flags()


def build_all(head_dims: tuple[int, ...] = HEAD_DIMS, jobs: int | None = None) -> dict[int, float]:
    """Build (or load from the cache) every head dim's extension in parallel; seconds per head dim."""

    def timed(head_dim: int) -> float:
        started = time.perf_counter()
        fa2(head_dim)
        return time.perf_counter() - started

    with ThreadPoolExecutor(max_workers=jobs or len(head_dims)) as pool:
        return dict(zip(head_dims, pool.map(timed, head_dims), strict=True))


def build_main() -> None:
    """`legalpt-build-kernels`: build the CUDA kernels ahead of time into the cache."""
    parser = argparse.ArgumentParser(
        description=f"Build legalpt's CUDA attention kernels ahead of time into {cache_dir()} "
        f"({CACHE_ENV}), for the compute capabilities in {ARCHS_ENV} (default 80;90)."
    )
    parser.add_argument("--head-dims", type=int, nargs="+", default=list(HEAD_DIMS), choices=HEAD_DIMS)
    parser.add_argument("--jobs", type=int, default=None, help="parallel builds (default: one per head dim)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("legalpt-build-kernels: no CUDA device is visible; the kernels build where they run")
    reason = unavailable_reason(torch.device("cuda"))
    if reason is not None:
        raise SystemExit(f"legalpt-build-kernels: cannot build the fa2 kernels: {reason}")
    started = time.perf_counter()
    seconds = build_all(tuple(args.head_dims), args.jobs)
    for head_dim, s in seconds.items():
        print(f"head_dim {head_dim:>3}: {s:6.1f} s")
    print(f"all built in {time.perf_counter() - started:.1f} s into {cache_dir()}")
