"""legalpt attention: flash-attn 2.x compatible functions with exact block-sparse masks.

    from legalpt.attention import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache

Importing this package compiles and loads no CUDA code. api.py holds the public functions and the backend choice,
kvcache.py attention over a KV cache (decoding), fp8.py the FP8 forward's quantization and numerics, masks.py the
element rule, backends/ the implementations behind one contract (reference, fa2 and fa3 on our kernels, sdpa and
flex), ops.py the torch.library custom ops, blocks.py the block-sparse schedules, build.py and kernels.py the CUDA
build and its loading.
"""

from legalpt.attention.api import (
    BACKEND_ENV,
    BACKENDS,
    flash_attn_func,
    flash_attn_varlen_func,
    get_backend,
    set_backend,
)
from legalpt.attention.kvcache import flash_attn_with_kvcache

__all__ = [
    "BACKENDS",
    "BACKEND_ENV",
    "flash_attn_func",
    "flash_attn_varlen_func",
    "flash_attn_with_kvcache",
    "get_backend",
    "set_backend",
]
