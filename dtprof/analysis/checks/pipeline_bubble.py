"""pipeline-bubble: time pipeline stages sit idle inside a step, against the schedule's theory.

Rule: per rank and step, busy time is the union of its pipeline actions (forward, backward,
backward_input, backward_weight) and idle time the rest of the step; the measured bubble is
idle over step time, averaged over ranks and the steps after the first 10% (at least 2). The
theory for p stages, m microbatches and v stages per rank: (p-1)/(m+p-1) for GPipe and 1F1B,
(p-1)/(v*m+p-1) for interleaved schedules, about a third of 1F1B's for zero-bubble ones. Idle is
split into the schedule's bubble (theory x step, at most the idle), waiting on slower stages
(every rank idles the difference between the busiest rank's busy time and its own, in each of
the schedule's slots: 1 / (1 - theory) times per step's worth of microbatches) and the rest,
waiting for activations and gradients to arrive. Info below 20% measured,
warning from 20%, error from 50%.
"""

from __future__ import annotations

import numpy as np

from dtprof.analysis.columns import groups, rows, values, warmup_steps
from dtprof.analysis.pipeline import busy_ns, schedule_bubble
from dtprof.analysis.report import Finding
from dtprof.analysis.summarize import RunSummary

INFO_FROM = 0.05
WARN_FROM = 0.20
ERROR_FROM = 0.50


def check(run: RunSummary) -> list[Finding]:
    pipes = {r: m.pipeline for r, m in run.meta.items() if m.pipeline}
    if not pipes or not run.actions.num_rows:
        return []
    info = next(iter(pipes.values()))
    skip = warmup_steps(values(run.steps, "step"))
    steps = rows(run.steps, values(run.steps, "step") >= skip)
    actions = rows(run.actions, values(run.actions, "step") >= skip)
    step_ns = values(steps, "step_ns", np.float64)
    if not actions.num_rows or np.nansum(step_ns) <= 0:
        return []  # every step still in warm-up
    busy = busy_ns(actions, steps)
    idle = np.maximum(step_ns - busy, 0)
    measured = float(np.nansum(idle) / np.nansum(step_ns))
    expected = schedule_bubble(
        info.schedule,
        info.stages,
        info.microbatches,
        info.virtual_stages_per_rank,
    )
    if measured < INFO_FROM:
        return []

    total_idle = float(np.nansum(idle))
    schedule_ns = min(expected * float(np.nansum(step_ns)), total_idle)
    # the pipeline runs at its slowest rank's pace: a rank with less work waits out the
    # difference in every slot of the schedule, the m microbatches' and the fill and drain's
    # (m + p - 1 of them in GPipe and 1F1B: 1 / (1 - theory) per microbatch)
    slots = 1 / (1 - expected)
    step_of = values(steps, "step")
    (_,), by_step = groups(step_of)
    slowest = np.zeros(int(by_step.max()) + 1 if len(by_step) else 0)
    np.maximum.at(slowest, by_step, busy)
    slow_ns = min(slots * float(np.nansum(slowest[by_step] - busy)), total_idle - schedule_ns)
    comm_ns = total_idle - schedule_ns - slow_ns

    p, m = info.stages, info.microbatches
    v = info.virtual_stages_per_rank
    more = 4 * m
    predicted = schedule_bubble(info.schedule, p, more, v)
    severity = "error" if measured >= ERROR_FROM else "warning" if measured >= WARN_FROM else "info"
    analysed = np.unique(values(actions, "step"))
    return [
        Finding(
            code="pipeline-bubble",
            severity=severity,
            ranks=sorted(int(r) for r in pipes),
            first_step=int(analysed[0]),
            last_step=int(analysed[-1]),
            message=(
                f"pipeline stages are idle {measured:.0%} of each step ({info.schedule}, "
                f"{p} stages, {m} microbatches; the schedule itself implies {expected:.0%}): "
                f"{schedule_ns / total_idle:.0%} of the idle time is the schedule's bubble, "
                f"{comm_ns / total_idle:.0%} waiting for activations and gradients, "
                f"{slow_ns / total_idle:.0%} waiting on slower stages"
            ),
            suggestion=(
                f"use {more} microbatches (theory: {predicted:.0%} bubble) or an interleaved or "
                f"zero-bubble schedule (ScheduleInterleaved1F1B with 2 stages per rank: "
                f"{schedule_bubble('ScheduleInterleaved1F1B', 2 * p, m, 2):.0%})"
            ),
            evidence={
                "schedule": info.schedule,
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
