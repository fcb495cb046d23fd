"""non-finite: where NaN or Inf first appeared, and on which rank it was born.

Rule: the first step with a non-finite logged scalar or parameter fingerprint on any rank. The
origin is the rank(s) whose logged scalar (the loss) was non-finite at that step; only when no
scalar was, the ranks whose fingerprints were. A NaN born in one rank's loss reaches every
rank's parameters through the gradient all-reduce in the same step, so fingerprints alone would
name every rank. Always an error.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dtprof.analysis.columns import rows, values
from dtprof.analysis.report import Finding
from dtprof.analysis.summarize import RunSummary


def _bad_scalars(run: RunSummary) -> pa.Table:
    s = run.scalars
    return rows(s, ~np.isfinite(values(s, "value", float))) if s.num_rows else s


def _bad_fingerprints(run: RunSummary) -> pa.Table:
    f = run.fingerprints
    if not f.num_rows:
        return f
    ok = np.isfinite(values(f, "sum", float)) & np.isfinite(values(f, "sumsq", float))
    return rows(f, ~ok)


def _distinct(*tables: pa.Table, column: str) -> list:
    """The distinct values of a column of some tables, sorted, without nulls (as pandas'
    unique, sorted, gave them for these ints and strings)."""
    chunks = [c for t in tables for c in t.column(column).chunks]
    joined = pa.chunked_array(chunks, type=tables[0].schema.field(column).type)
    return sorted(pc.unique(joined).drop_null().to_pylist())


def check(run: RunSummary) -> list[Finding]:
    scalars, prints = _bad_scalars(run), _bad_fingerprints(run)
    found = [t for t in (scalars, prints) if t.num_rows]
    if not found:
        return []
    first = int(min(np.nanmin(values(t, "step")) for t in found))
    born = rows(scalars, values(scalars, "step") == first) if scalars.num_rows else scalars
    in_scalars = born.num_rows > 0
    if not in_scalars:
        born = rows(prints, values(prints, "step") == first)
    names = _distinct(born, column="name" if in_scalars else "tensor")
    where = f"logged {', '.join(names)}" if in_scalars else f"parameters ({', '.join(names[:3])})"
    origin = _distinct(born, column="rank")
    affected = _distinct(*found, column="rank")
    last = int(max(np.nanmax(values(t, "step")) for t in found))
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
                "in": "scalars" if in_scalars else "fingerprints",
                "names": names,
                "ranks_affected": affected,
                "steps_affected": len(_distinct(*found, column="step")),
            },
        )
    ]
