"""The ahead-of-time build of legalpt's CUDA kernels (csrc/) into the extension module `legalpt._C`.

Everything else about the package is in pyproject.toml. The kernels build when torch and a CUDA toolkit are there
(`pip install --no-build-isolation .`, so that the build sees the installed torch); elsewhere the package installs
without them, and its CPU paths need none. What is built, and the environment variables that choose it
(LEGALPT_CUDA_ARCHS, LEGALPT_HEAD_DIMS, LEGALPT_SKIP_CUDA_BUILD, MAX_JOBS): legalpt/attention/build.py.
The sources travel in sdists and wheels as the package `legalpt._csrc` (for the JIT developer build), the Hydra
configs as `legalpt._conf`.
"""

import importlib.util
import os
from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).resolve().parent


def _build_module():
    """legalpt/attention/build.py by its path: neither torch nor legalpt need be importable to read it."""
    spec = importlib.util.spec_from_file_location("_legalpt_build", ROOT / "legalpt" / "attention" / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cuda_extension() -> tuple[list, dict]:
    """(ext_modules, cmdclass): the kernels' extension, or none, saying why."""
    build = _build_module()
    if build.skip_cuda_build():
        return _without(f"{build.SKIP_ENV} is set")
    try:
        import torch
        from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CUDAExtension
    except ImportError:
        return _without("torch is not importable here (build with --no-build-isolation to use the installed torch)")
    if torch.version.cuda is None or CUDA_HOME is None or not (Path(CUDA_HOME) / "bin" / "nvcc").is_file():
        return _without("no CUDA toolkit (nvcc) or a CPU-only torch")
    sources = [str(path.relative_to(ROOT)) for path in build.sources(ROOT / "csrc")]
    extension = CUDAExtension(
        "legalpt._C",
        sources,
        extra_compile_args={"cxx": ["-O3"], "nvcc": build.nvcc_flags()},
        extra_link_args=build.runtime_link_flags(),
    )
    print(f"legalpt: building the CUDA kernels from {len(sources)} files (MAX_JOBS={os.environ.get('MAX_JOBS', '-')})")
    return [extension], {"build_ext": BuildExtension}


def _without(reason: str) -> tuple[list, dict]:
    print(f"legalpt: installing without the CUDA kernels: {reason}")
    return [], {}


ext_modules, cmdclass = _cuda_extension()
setup(
    ext_modules=ext_modules,
    cmdclass=cmdclass,
    # csrc/ and conf/ travel inside the package, so that an installed legalpt finds its sources and its Hydra configs
    packages=[*find_packages(include=["legalpt*"]), "legalpt._csrc", "legalpt._conf"],
    package_dir={"legalpt._csrc": "csrc", "legalpt._conf": "conf"},
)
