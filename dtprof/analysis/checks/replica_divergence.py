"""replica-divergence: data-parallel replicas whose parameters stopped being identical.

Rule: only for DDP runs (model_kind ddp), whose replicas hold bit-identical parameters while
they agree. At each fingerprinted step where every rank's fingerprints are finite, a rank is
odd when its (sum, sum of squares) of some tensor differs from the value most ranks share.
Reported once per odd rank set: the first step seen, the tensors, and whether it persists (odd
at >= 50% of the later finite fingerprinted steps) or was a one-off. Always an error.
"""

from __future__ import annotations

import numpy as np

from dtprof.analysis.columns import values
from dtprof.analysis.fingerprints import odd_ranks
from dtprof.analysis.report import Finding
from dtprof.analysis.summarize import RunSummary

PERSISTENT_SHARE = 0.5


def check(run: RunSummary) -> list[Finding]:
    kinds = {m.model_kind for m in run.meta.values()}
    if kinds != {"ddp"} or not run.fingerprints.num_rows or len(run.ranks) < 2:
        return []
    odd = odd_ranks(run.fingerprints)
    if not odd.num_rows:
        return []
    ranks = np.unique(values(odd, "rank")).tolist()
    odd_steps = np.unique(values(odd, "step")).tolist()
    first = odd_steps[0]
    step = values(run.fingerprints, "step")
    infinite = ~np.isfinite(values(run.fingerprints, "sum", float))
    finite_steps = sorted(set(step.tolist()) - set(step[infinite].tolist()))
    later = [s for s in finite_steps if s >= first]
    persistent = len(odd_steps) >= PERSISTENT_SHARE * len(later)
    tensors = sorted(set(values(odd, "tensor")[values(odd, "step") == first].tolist()))
    how = "from then on" if persistent else "once"
    return [
        Finding(
            code="replica-divergence",
            severity="error",
            ranks=ranks,
            first_step=first,
            last_step=odd_steps[-1],
            message=(
                f"rank(s) {', '.join(map(str, ranks))} hold different parameters from the other "
                f"replicas {how}, first seen at step {first} ({', '.join(tensors[:3])})"
            ),
            suggestion=(
                "look for code that changes parameters outside DDP on one rank (an in-place edit, "
                "a rank-dependent update), or hardware faults on that rank's device"
            ),
            evidence={
                "first_step": first,
                "persistent": persistent,
                "odd_steps": len(odd_steps),
                "fingerprinted_steps_since": len(later),
                "tensors": tensors,
            },
        )
    ]
