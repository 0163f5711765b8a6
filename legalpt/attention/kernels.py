"""Loading the CUDA kernels of csrc/, and saying why they cannot run where they cannot.

The kernels are built at `pip install` into the extension module `legalpt._C` (setup.py; build.py says what the
build holds and which environment variables choose it). Nothing here runs at import: the module loads on first
use, once per process, and whether the kernels can serve a (device, head dim, dtype, path) is decided once and
cached, so the attention calls of a training step ask nothing of the machine.

Developer mode: LEGALPT_JIT=1 builds the same sources with torch's JIT builder (ninja + nvcc) into a cache folder
(LEGALPT_KERNEL_CACHE, default ~/.cache/legalpt/kernels) instead, and ninja rebuilds only the files an edit
touched. `emulated(head_dim)` builds the kernels for the CPU (csrc/common/emulate.h: each CUDA thread a fiber), so
that tests check their index math, masks and barriers on machines without a GPU.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import time
from pathlib import Path
from types import ModuleType

import torch

from legalpt.attention import build

log = logging.getLogger(__name__)

JIT_ENV = "LEGALPT_JIT"
CACHE_ENV = "LEGALPT_KERNEL_CACHE"
INSTALL_HINT = (
    "install legalpt where a CUDA toolkit is present with `pip install --no-build-isolation .` "
    f"(or set {JIT_ENV}=1 to build them on first use)"
)


_extension: ModuleType | RuntimeError | None = None  # loaded once per process, or the reason it could not be


def extension() -> ModuleType:
    """The kernels' module: `legalpt._C`, or with LEGALPT_JIT=1 the JIT build. RuntimeError saying why if neither
    loads (remembered: a failed load or build is not retried on every call)."""
    global _extension
    if _extension is None:
        try:
            _extension = _load()
        except RuntimeError as error:
            _extension = error
    if isinstance(_extension, RuntimeError):
        raise _extension
    return _extension


def _load() -> ModuleType:
    if os.environ.get(JIT_ENV, "") not in ("", "0"):
        return jit_build()
    try:
        from legalpt import _C
    except ImportError as error:
        raise RuntimeError(f"the CUDA kernels are not built ({error}); {INSTALL_HINT}") from error
    return _C


def jit_build() -> ModuleType:
    """Build (or load from the cache) the CUDA extension from csrc/ with torch's JIT builder: the developer mode."""
    from torch.utils.cpp_extension import load

    flags = build.nvcc_flags()
    name = "legalpt_C_" + hashlib.sha256(" ".join(flags).encode()).hexdigest()[:12]
    folder = cache_dir() / name
    folder.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    try:
        module = load(
            name=name,
            sources=[str(p) for p in build.sources()],
            extra_cuda_cflags=flags,
            extra_cflags=["-O3"],
            extra_ldflags=build.runtime_link_flags(),
            build_directory=str(folder),
            verbose=False,
        )
    except Exception as error:  # any build failure becomes one readable error
        raise RuntimeError(f"building the CUDA kernels failed: {str(error).strip()[-2000:]}") from error
    log.info("CUDA kernels built or loaded in %.1f s from %s", time.perf_counter() - started, folder)
    return module


@functools.cache
def emulated(head_dim: int) -> ModuleType:
    """The kernels of one head dim compiled for the CPU: the functions of `extension()`, on CPU tensors."""
    from torch.utils.cpp_extension import load

    flags = ["-O1", "-std=c++20", "-Wno-unknown-pragmas", "-DLEGALPT_EMULATE", f"-DLEGALPT_HDIM_{head_dim}"]
    flags.append("-DLEGALPT_SM90")
    name = f"legalpt_emulated_hdim{head_dim}_{_source_hash()}"
    folder = cache_dir() / name
    folder.mkdir(parents=True, exist_ok=True)
    return load(
        name=name,
        sources=[str(build.source_root() / "emulated.cpp")],
        extra_cflags=flags,
        extra_ldflags=build.runtime_link_flags(),
        build_directory=str(folder),
        verbose=False,
    )


def cache_dir() -> Path:
    root = os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "legalpt" / "kernels"
    return Path(root) / f"torch{torch.__version__.split('+')[0]}-cuda{torch.version.cuda}"


def _source_hash() -> str:
    """A hash of every file under csrc/: an emulated build of edited sources gets a name of its own, so that a
    process never loads a stale one."""
    digest = hashlib.sha256()
    root = build.source_root()
    for path in sorted(root.rglob("*")):
        if path.is_file():
            digest.update(path.relative_to(root).as_posix().encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def padded_head_dim(head_dim: int, built: tuple[int, ...] = build.HEAD_DIMS) -> int | None:
    """The instantiated head dim a head dim runs as (zero-padded), or None above the largest."""
    return next((d for d in built if d >= head_dim), None)


# A constant under torch.compile (the GPU and the build), so that Dynamo neither traces torch.cuda's queries nor
# meets the cache inside (it warns of any functools cache it steps through).
@torch.compiler.assume_constant_result
def unavailable_reason(device: torch.device, head_dim: int, dtype: torch.dtype, sm90: bool) -> str | None:
    """Why the kernels cannot serve inputs of this head dim and dtype on `device` on the sm90 (FA3) or sm80 (FA2)
    path; None when they can. Decided once per argument tuple: it reads the GPU's properties and loads the module."""
    return _unavailable_reason(device, head_dim, dtype, sm90)


@functools.cache
def _unavailable_reason(device: torch.device, head_dim: int, dtype: torch.dtype, sm90: bool) -> str | None:
    if device.type != "cuda":
        return f"it needs a CUDA device and the inputs are on {device.type}"
    major, minor = torch.cuda.get_device_capability(device)
    name = torch.cuda.get_device_name(device)
    if major < 8:
        return f"it needs compute capability >= 8.0 (sm80+), and {name} has {major}.{minor}"
    if sm90 and (major, minor) != (9, 0):
        return f"it needs a Hopper GPU (sm90), and {name} has {major}.{minor}"
    try:
        ext = extension()
    except RuntimeError as error:
        return str(error)
    if sm90 and not ext.has_sm90:
        return f"the kernels are not built for sm_90a ({build.ARCHS_ENV} lacked 90 at install)"
    if padded_head_dim(head_dim, ext.head_dims) is None:
        return f"head_dim {head_dim} is above the built head dims {ext.head_dims} ({build.HEAD_DIMS_ENV} at install)"
    return None
