"""non-finite: where NaN or Inf first appeared, and on which rank it was born.

Rule: the first step with a non-finite logged scalar or parameter fingerprint on any rank. The
origin is the rank(s) whose logged scalar (the loss) was non-finite at that step; only when no
scalar was, the ranks whose fingerprints were. A NaN born in one rank's loss reaches every
rank's parameters through the gradient all-reduce in the same step, so fingerprints alone would
name every rank. Always an error.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dtprof.analysis.report import Finding
from dtprof.analysis.summarize import RunSummary


def _bad_scalars(run: RunSummary) -> pd.DataFrame:
    s = run.scalars
    return s[~np.isfinite(s["value"].to_numpy(dtype=float))] if not s.empty else s


def _bad_fingerprints(run: RunSummary) -> pd.DataFrame:
    f = run.fingerprints
    if f.empty:
        return f
    ok = np.isfinite(f["sum"].to_numpy(dtype=float)) & np.isfinite(f["sumsq"].to_numpy(dtype=float))
    return f[~ok]


def check(run: RunSummary) -> list[Finding]:
    scalars, prints = _bad_scalars(run), _bad_fingerprints(run)
    if scalars.empty and prints.empty:
        return []
    first = int(min(d["step"].min() for d in (scalars, prints) if not d.empty))
    born = scalars[scalars["step"] == first]
    where = "logged " + ", ".join(sorted(born["name"].unique())) if not born.empty else ""
    if born.empty:
        born = prints[prints["step"] == first]
        where = "parameters (" + ", ".join(sorted(born["tensor"].unique())[:3]) + ")"
    origin = sorted(int(r) for r in born["rank"].unique())
    affected = sorted(int(r) for r in pd.concat([scalars["rank"], prints["rank"]]).unique())
    last = int(max(d["step"].max() for d in (scalars, prints) if not d.empty))
    spread = [r for r in affected if r not in origin]
    who = "rank" if len(origin) == 1 else "ranks"
    message = (
        f"non-finite values first appeared at step {first} in {who} "
        f"{', '.join(map(str, origin))}'s {where}"
    )
    if spread:
        message += f"; from there they reached rank(s) {', '.join(map(str, spread))}"
    return [
        Finding(
            code="non-finite",
            severity="error",
            ranks=origin,
            first_step=first,
            last_step=last,
            message=message,
            suggestion=(
                f"replay step {first} on rank {origin[0]} with the same batch and "
                "torch.autograd.set_detect_anomaly(True); check its inputs and the learning rate"
            ),
            evidence={
                "origin_ranks": origin,
                "first_step": first,
                "in": "scalars" if where.startswith("logged") else "fingerprints",
                "names": sorted(born["name" if "name" in born else "tensor"].unique().tolist()),
                "ranks_affected": affected,
                "steps_affected": int(pd.concat([scalars["step"], prints["step"]]).nunique()),
            },
        )
    ]
