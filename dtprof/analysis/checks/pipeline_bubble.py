"""pipeline-bubble: time pipeline stages sit idle inside a step, against the schedule's theory.

Rule: per rank and step, busy time is the union of its pipeline actions (forward, backward,
backward_input, backward_weight) and idle time the rest of the step; the measured bubble is
idle over step time, averaged over ranks and the steps after the first 10% (at least 2). The
theory for p stages, m microbatches and v stages per rank: (p-1)/(m+p-1) for GPipe and 1F1B,
(p-1)/(v*m+p-1) for interleaved schedules, about a third of 1F1B's for zero-bubble ones. Idle is
split into the schedule's bubble (theory x step, at most the idle), communication wait (p2p
transfers outside actions) and the rest, waiting on a slower stage. Info below 20% measured,
warning from 20%, error from 50%.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dtprof.analysis.checks.poor_overlap import intervals_by_rank, overlap_per_rank
from dtprof.analysis.checks.straggler import warmup_steps
from dtprof.analysis.report import Finding
from dtprof.analysis.summarize import RunSummary

INFO_FROM = 0.05
WARN_FROM = 0.20
ERROR_FROM = 0.50


def theory(schedule: str, stages: int, microbatches: int, per_rank: int) -> float:
    """The idle fraction the schedule itself implies."""
    p, m, v = stages // max(per_rank, 1), microbatches, max(per_rank, 1)
    if p <= 1:
        return 0.0
    if "ZeroBubble" in schedule or "ZBV" in schedule or "DualPipe" in schedule:
        return (p - 1) / (3 * (v * m + p - 1))
    if v > 1:
        return (p - 1) / (v * m + p - 1)
    return (p - 1) / (m + p - 1)


def _union_ns(intervals: pd.DataFrame, keys: list[str]) -> pd.Series:
    """Length of the union of [start_ns, end_ns) per key, by a sorted sweep."""
    df = intervals.sort_values([*keys, "start_ns"])
    reach = df.groupby(keys)["end_ns"].cummax()
    prev = reach.groupby([df[k] for k in keys]).shift(1)
    start = np.maximum(df["start_ns"].to_numpy(), prev.fillna(-np.inf).to_numpy())
    length = np.clip(df["end_ns"].to_numpy() - start, 0, None)
    return pd.Series(length, index=df.index).groupby([df[k] for k in keys]).sum()


def check(run: RunSummary) -> list[Finding]:
    pipes = {r: m["pipeline"] for r, m in run.meta.items() if m.get("pipeline")}
    if not pipes or run.actions.empty:
        return []
    info = next(iter(pipes.values()))
    skip = warmup_steps(run.steps["step"])
    steps = run.steps[run.steps["step"] >= skip].set_index(["rank", "step"])["step_ns"]
    actions = run.actions[run.actions["step"] >= skip]
    if actions.empty or steps.sum() <= 0:
        return []  # every step still in warm-up
    busy = _union_ns(actions, ["rank", "step"]).reindex(steps.index, fill_value=0)
    idle = (steps - busy).clip(lower=0)
    measured = float(idle.sum() / steps.sum())
    expected = theory(
        info["schedule"],
        info["stages"],
        info["microbatches"],
        info.get("virtual_stages_per_rank", 1),
    )
    if measured < INFO_FROM:
        return []

    p2p = run.collectives[run.collectives["peer"].notna() & (run.collectives["step"] >= skip)]
    comm_outside = 0.0
    if not p2p.empty:
        per = overlap_per_rank(
            intervals_by_rank(p2p),
            actions[["rank", "step", "start_ns", "end_ns"]],
        )
        comm_outside = float((per["comm_ns"] - per["overlap_ns"]).sum())
    total_idle = float(idle.sum())
    schedule_ns = min(expected * float(steps.sum()), total_idle)
    comm_ns = min(comm_outside, total_idle - schedule_ns)
    slow_ns = total_idle - schedule_ns - comm_ns

    p, m = info["stages"], info["microbatches"]
    v = info.get("virtual_stages_per_rank", 1)
    more = 4 * m
    predicted = theory(info["schedule"], p, more, v)
    severity = "error" if measured >= ERROR_FROM else "warning" if measured >= WARN_FROM else "info"
    analysed = sorted(actions["step"].unique())
    return [
        Finding(
            code="pipeline-bubble",
            severity=severity,
            ranks=sorted(int(r) for r in pipes),
            first_step=int(analysed[0]) if analysed else None,
            last_step=int(analysed[-1]) if analysed else None,
            message=(
                f"pipeline stages are idle {measured:.0%} of each step ({info['schedule']}, "
                f"{p} stages, {m} microbatches; the schedule itself implies {expected:.0%}): "
                f"{schedule_ns / total_idle:.0%} of the idle time is the schedule's bubble, "
                f"{comm_ns / total_idle:.0%} waiting for activations and gradients, "
                f"{slow_ns / total_idle:.0%} waiting on slower stages"
            ),
            suggestion=(
                f"use {more} microbatches (theory: {predicted:.0%} bubble) or an interleaved or "
                f"zero-bubble schedule (ScheduleInterleaved1F1B with 2 stages per rank: "
                f"{theory('ScheduleInterleaved1F1B', 2 * p, m, 2):.0%})"
            ),
            evidence={
                "schedule": info["schedule"],
                "stages": p,
                "microbatches": m,
                "bubble_fraction": round(measured, 4),
                "theoretical_bubble_fraction": round(expected, 4),
                "idle_split": {
                    "schedule": round(schedule_ns / total_idle, 4),
                    "communication_wait": round(comm_ns / total_idle, 4),
                    "slow_stage": round(slow_ns / total_idle, 4),
                },
                "suggested_microbatches": more,
                "suggested_bubble_fraction": round(predicted, 4),
            },
        )
    ]
