"""The attention backends behind one contract (base.py: `AttentionBatch` in, output and logsumexp out).

- reference: exact block-sparse attention in PyTorch, O(N) memory, any device and dtype (reference.py)
- fa2, fa3: our CUDA kernels, the FA2 path (sm80+) and the FA3 path (Hopper) (cuda.py, csrc/)
- sdpa, flex: torch's scaled_dot_product_attention and FlexAttention on the same mask, for comparison

Each is built on first use (FlexAttention's imports alone cost a quarter second), once per process.
"""

from __future__ import annotations

import importlib

from legalpt.attention.backends.base import AttentionBatch, Backend

# name -> (module, attribute) of the backend object
_WHERE = {
    "reference": ("reference", "REFERENCE"),
    "fa2": ("cuda", "FA2"),
    "fa3": ("cuda", "FA3"),
    "sdpa": ("sdpa", "SDPA"),
    "flex": ("flex", "FLEX"),
}
NAMES = tuple(_WHERE)


_loaded: dict[str, Backend] = {}  # a plain dict, which torch.compile traces (it would inline a functools.cache)


def get(name: str) -> Backend:
    """The backend called `name` (one of NAMES)."""
    if name not in _loaded:
        if name not in _WHERE:
            raise ValueError(f"backend: expected one of {', '.join(NAMES)}, got {name!r}")
        module, attribute = _WHERE[name]
        _loaded[name] = getattr(importlib.import_module(f"{__name__}.{module}"), attribute)
    return _loaded[name]


__all__ = ["NAMES", "AttentionBatch", "Backend", "get"]
