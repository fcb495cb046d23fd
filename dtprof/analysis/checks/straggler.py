"""straggler: the rank the others wait for, found by arrival time at matched collectives.

Rule: match each collective across ranks by (group, seq); the rank that entered it last is
that collective's culprit, and every other member's wait (last arrival - its own arrival) is
charged to it. A rank is a straggler when it was last at >= 50% of the analysed steps (chronic)
and its own compute (forward + backward + optimizer, no waiting) is >= 1.10x the median of the
ranks (warning; >= 1.20x: error). Never by the longest collective: the culprit has the
shortest ones, since the others are already waiting when it arrives. The first steps (10%,
at least 2) are skipped: DDP rebuilds its buckets and caches are cold.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dtprof.analysis.report import Finding
from dtprof.analysis.summarize import RunSummary

WARN_SLOWDOWN = 1.10
ERROR_SLOWDOWN = 1.20
CHRONIC_SHARE = 0.5
MIN_STEPS = 5


def warmup_steps(steps: pd.Series) -> int:
    """How many first steps to skip: 10% of them, at least 2."""
    n = int(steps.nunique())
    return max(2, n // 10)


def arrivals(collectives: pd.DataFrame, world_size: int) -> pd.DataFrame:
    """Collectives seen on every member rank, with each rank's wait and the last arriver.

    Only collectives on the world group's size are matched here (every rank takes part):
    p2p operations and subgroups are left out.
    """
    coll = collectives[collectives["peer"].isna()]
    coll = coll[["rank", "step", "group", "seq", "op", "start_ns", "end_ns"]]
    members = coll.groupby(["group", "seq"])["rank"].transform("size")
    coll = coll[members == world_size].copy()
    if coll.empty:
        return coll.assign(
            last_start_ns=pd.Series(dtype="int64"),
            wait_ns=pd.Series(dtype="int64"),
            is_last=pd.Series(dtype=bool),
        )
    coll["last_start_ns"] = coll.groupby(["group", "seq"])["start_ns"].transform("max")
    coll["wait_ns"] = coll["last_start_ns"] - coll["start_ns"]
    coll["is_last"] = coll["wait_ns"] == 0
    return coll


def check(run: RunSummary) -> list[Finding]:
    world = run.world_size
    if world < 2 or run.collectives.empty or run.steps.empty:
        return []
    skip = warmup_steps(run.steps["step"])
    steps = run.steps[run.steps["step"] >= skip]
    coll = arrivals(run.collectives[run.collectives["step"] >= skip], world)
    if coll.empty or steps["step"].nunique() < MIN_STEPS:
        return []

    # the culprit of each collective, and the waiting charged to it
    last = coll[coll["is_last"]]
    culprit = last.drop_duplicates(["group", "seq"])[["group", "seq", "rank"]]
    waits = coll.groupby(["group", "seq"])["wait_ns"].sum().rename("caused_ns").reset_index()
    charged = culprit.merge(waits, on=["group", "seq"])
    caused_by = charged.groupby("rank")["caused_ns"].sum()
    suspect = int(caused_by.idxmax())

    # chronic: last arriver at most collectives of most steps
    per_step = last.groupby(["step", "rank"]).size().unstack(fill_value=0)
    step_culprit = per_step.idxmax(axis=1)
    share = float((step_culprit == suspect).mean())

    compute = steps.groupby("rank")["compute_ns"].median()
    if compute.isna().all():
        return []  # no phases recorded: no model given to profile()
    slowdown = float(compute[suspect] / compute.median())
    if share < CHRONIC_SHARE or slowdown < WARN_SLOWDOWN:
        return []

    # what-if: the culprit at the median compute; the others wait at most that much less
    step_ns = steps.groupby("step")["step_ns"].median()
    excess = steps[steps["rank"] == suspect].set_index("step")["compute_ns"] - compute.median()
    waited = coll[coll["rank"] != suspect].groupby(["step", "rank"])["wait_ns"].sum()
    waited = waited.groupby("step").max().reindex(step_ns.index, fill_value=0)
    saving = np.minimum(excess.reindex(step_ns.index).clip(lower=0).fillna(0), waited)
    speedup = float(step_ns.sum() / (step_ns - saving).sum())

    caused_s = float(caused_by[suspect]) / 1e9
    analysed = sorted(steps["step"].unique())
    # share of collectives it entered last (a tie for last counts)
    last_share = float(last["rank"].eq(suspect).groupby([last["group"], last["seq"]]).any().mean())
    severity = "error" if slowdown >= ERROR_SLOWDOWN else "warning"
    host = run.meta[suspect].get("host", "?")
    return [
        Finding(
            code="straggler",
            severity=severity,
            ranks=[suspect],
            first_step=int(analysed[0]),
            last_step=int(analysed[-1]),
            message=(
                f"rank {suspect} is a straggler: its compute is {slowdown:.2f}x the median and it "
                f"arrived last at {last_share:.0%} of {len(culprit)} collectives; the other ranks "
                f"waited {caused_s:.2f} s for it, and steps would be {speedup:.2f}x faster if it "
                f"ran at the median"
            ),
            suggestion=(
                f"look at rank {suspect}'s host ({host}) and device: clocks and temperature "
                "(NVML samples), another process on it, or larger inputs on that rank"
            ),
            evidence={
                "slowdown": round(slowdown, 4),
                "wait_caused_s": round(caused_s, 6),
                "speedup_if_fixed": round(speedup, 4),
                "chronic": share >= CHRONIC_SHARE,
                "last_arrival_share": round(last_share, 4),
                "steps_last": round(share, 4),
                "collectives_matched": len(culprit),
                "median_compute_ms": {int(r): round(v / 1e6, 3) for r, v in compute.items()},
            },
        )
    ]
