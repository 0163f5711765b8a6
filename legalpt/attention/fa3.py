"""The `fa3` backend: our Hopper attention kernels (csrc/fa3: wgmma on sm90a) behind the attention custom ops.

Forward and backward run on warpgroup MMAs at head dims 64 and 128, and so at the head dims zero-padded to them
(33-63, 97-127); the others (up to 32, 65-96, 129-256) run fa2's kernels, as does the deterministic backward's dQ
pass. The kernels come from the same extension as fa2's (kernels.py builds sm_90a for Hopper), so the schedules,
checks and padding are fa2.py's.
"""

from __future__ import annotations

from functools import partial

from torch import Tensor

from legalpt.attention import fa2


def check(q: Tensor) -> None:
    """ValueError naming what keeps the fa3 backend from running on these inputs (called before any launch): fa2's
    checks, and a Hopper GPU with an sm_90a build."""
    fa2.check(q, "fa3")


# fa2.forward's and fa2.backward's contracts, on the Hopper kernels (which they check the inputs for, as fa3's)
forward = partial(fa2.forward, hopper=True)
backward = partial(fa2.backward, hopper=True)
