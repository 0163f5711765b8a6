"""The attention backends behind one contract (base.py: `AttentionBatch` in, output and logsumexp out).

- reference: exact block-sparse attention in PyTorch, O(N) memory, any device and dtype (reference.py)
- fa2, fa3: our CUDA kernels, the FA2 path (sm80+) and the FA3 path (Hopper) (cuda.py, csrc/)
- sdpa, flex: torch's scaled_dot_product_attention and FlexAttention on the same mask, for comparison
"""

from __future__ import annotations

import importlib

from legalpt.attention.backends import cuda, reference, sdpa
from legalpt.attention.backends.base import AttentionBatch, Backend

NAMES = ("reference", "fa2", "fa3", "sdpa", "flex")
# Loaded at import, so that torch.compile traces `get` as a dict lookup (an import inside a compiled region is a
# graph break); flex alone is loaded on first use: FlexAttention's imports cost a quarter second.
_loaded: dict[str, Backend] = {"reference": reference.REFERENCE, "fa2": cuda.FA2, "fa3": cuda.FA3, "sdpa": sdpa.SDPA}


def get(name: str) -> Backend:
    """The backend called `name` (one of NAMES)."""
    if name not in _loaded:
        if name != "flex":
            raise ValueError(f"backend: expected one of {', '.join(NAMES)}, got {name!r}")
        _loaded[name] = importlib.import_module(f"{__name__}.flex").FLEX
    return _loaded[name]


__all__ = ["NAMES", "AttentionBatch", "Backend", "get"]
