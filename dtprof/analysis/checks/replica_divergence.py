"""replica-divergence: data-parallel replicas whose parameters stopped being identical.

Rule: only for DDP runs (model_kind ddp), whose replicas hold bit-identical parameters while
they agree. At each fingerprinted step where every rank's fingerprints are finite, a rank is
odd when its (sum, sum of squares) of some tensor differs from the value most ranks share.
Reported once per odd rank set: the first step seen, the tensors, and whether it persists (odd
at >= 50% of the later finite fingerprinted steps) or was a one-off. Always an error.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dtprof.analysis.report import Finding
from dtprof.analysis.summarize import RunSummary

PERSISTENT_SHARE = 0.5


def odd_ranks(fingerprints: pd.DataFrame) -> pd.DataFrame:
    """(step, tensor, rank) rows whose fingerprint differs from the majority's."""
    f = fingerprints.copy()
    finite = np.isfinite(f["sum"].to_numpy(dtype=float)) & np.isfinite(
        f["sumsq"].to_numpy(dtype=float)
    )
    bad_steps = set(f.loc[~finite, "step"])
    f = f[~f["step"].isin(bad_steps)]
    if f.empty:
        return f
    counts = f.groupby(["step", "tensor", "sum", "sumsq"])["rank"].transform("size")
    majority = counts.groupby([f["step"], f["tensor"]]).transform("max")
    return f[counts < majority]


def check(run: RunSummary) -> list[Finding]:
    kinds = {m.get("model_kind") for m in run.meta.values()}
    if kinds != {"ddp"} or run.fingerprints.empty or len(run.ranks) < 2:
        return []
    odd = odd_ranks(run.fingerprints)
    if odd.empty:
        return []
    ranks = sorted(int(r) for r in odd["rank"].unique())
    first = int(odd["step"].min())
    finite_steps = sorted(
        set(run.fingerprints["step"])
        - set(run.fingerprints.loc[~np.isfinite(run.fingerprints["sum"].astype(float)), "step"])
    )
    later = [s for s in finite_steps if s >= first]
    odd_steps = sorted(int(s) for s in odd["step"].unique())
    persistent = len(odd_steps) >= PERSISTENT_SHARE * len(later)
    tensors = sorted(odd.loc[odd["step"] == first, "tensor"].unique().tolist())
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
