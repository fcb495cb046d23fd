"""slow-stage: a pipeline rank whose stage work takes longer than the others', who wait for it.

Rule: per pipeline rank, its busy time in each step (the union of its pipeline actions: forward,
backward, backward_input, backward_weight), median over the steps after the first 10% (at least
2). A rank is slow when that is >= 1.15x the median over the pipeline ranks (warning; >= 1.5x:
error). Every microbatch passes every stage, so the slowest stage sets the pace: in GPipe and
1F1B a step takes about (m - 1) x the slowest stage's work per microbatch plus one pass through
every stage. The balanced prediction puts the slow rank's work at the median in that formula
(ranks that hold the same stages, data-parallel replicas of it, run side by side: a stage's
work is its slowest replica's).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from dtprof.analysis.columns import groups, rows, values, warmup_steps
from dtprof.analysis.pipeline import median_busy_by_rank
from dtprof.analysis.report import Finding
from dtprof.analysis.summarize import RunSummary
from dtprof.trace.meta import Pipeline

WARN_SLOWER = 1.15
ERROR_SLOWER = 1.50
BACKWARD = ("backward", "backward_input", "backward_weight")


def per_microbatch_ms(actions: pa.Table, rank: int, names: tuple[str, ...]) -> float:
    """A rank's median time per microbatch in actions of these names (summed per step, stage
    and microbatch), in ms."""
    name = values(actions, "name")
    mine = rows(actions, (values(actions, "rank") == rank) & np.isin(name, names))
    if not mine.num_rows:
        return float("nan")
    keys, inverse = groups(*(values(mine, c) for c in ("step", "stage", "microbatch")))
    ns = np.bincount(
        inverse,
        weights=values(mine, "end_ns", np.float64) - values(mine, "start_ns", np.float64),
        minlength=len(keys[0]),
    )
    return float(np.median(ns)) / 1e6


def check(run: RunSummary) -> list[Finding]:
    pipes = {r: m.pipeline for r, m in run.meta.items() if m.pipeline}
    if len(pipes) < 2 or not run.actions.num_rows:
        return []
    skip = warmup_steps(values(run.steps, "step"))
    actions = rows(run.actions, values(run.actions, "step") >= skip)
    if not actions.num_rows:
        return []
    ranks, busy = median_busy_by_rank(actions)
    median = float(np.median(busy))
    if median <= 0:
        return []
    slower = busy / median
    if not set(ranks.tolist()) <= set(pipes):
        return []  # actions from ranks that did not describe their schedule
    stage_of = {int(r): pipes[int(r)].stage_indices or (int(r),) for r in ranks}
    step_ns = values(rows(run.steps, values(run.steps, "step") >= skip), "step_ns", np.float64)
    step_ms = float(np.nanmedian(step_ns)) / 1e6 if len(step_ns) else float("nan")
    findings = []
    for i in np.flatnonzero(slower >= WARN_SLOWER):
        rank = int(ranks[i])
        findings.append(
            _finding(actions, pipes[rank], stage_of, ranks, busy, rank, median, step_ms, skip)
        )
    return findings


def _finding(
    actions: pa.Table,
    info: Pipeline,
    stage_of: dict[int, tuple[int, ...]],
    ranks: np.ndarray,
    busy: np.ndarray,
    rank: int,
    median: float,
    step_ms: float,
    skip: int,
) -> Finding:
    own = float(busy[np.searchsorted(ranks, rank)])
    slower = own / median
    m, p = info.microbatches, info.stages
    predicted = _balanced_step_ms(stage_of, ranks, busy, rank, median, m, step_ms)
    saved = step_ms - predicted
    stages = stage_of[rank]
    replicas = sorted(r for r, s in stage_of.items() if s == stages)
    where = f"stage {', '.join(map(str, stages))} of {p}"
    if len(replicas) > 1:
        where += (
            f", data-parallel replica {replicas.index(rank)} of the {len(replicas)} ranks "
            f"holding it ({', '.join(map(str, replicas))})"
        )
    forward = per_microbatch_ms(actions, rank, ("forward",))
    backward = per_microbatch_ms(actions, rank, BACKWARD)
    others = [int(r) for r in ranks if int(r) != rank]
    med_forward = float(np.nanmedian([per_microbatch_ms(actions, r, ("forward",)) for r in others]))
    med_backward = float(np.nanmedian([per_microbatch_ms(actions, r, BACKWARD) for r in others]))
    steps = np.unique(values(actions, "step"))
    return Finding(
        code="slow-stage",
        severity="error" if slower >= ERROR_SLOWER else "warning",
        ranks=[rank],
        first_step=int(steps[0]),
        last_step=int(steps[-1]),
        message=(
            f"rank {rank} ({where}) is the pipeline's slow stage: its work per step is "
            f"{slower:.2f}x the median rank's (forward {forward:.1f} ms and backward "
            f"{backward:.1f} ms per microbatch, against {med_forward:.1f} and {med_backward:.1f} "
            f"ms on the others); every other stage idles about {saved:.0f} ms a step waiting "
            f"for it, and balanced, a step would take about {predicted:.0f} ms instead of "
            f"{step_ms:.0f} ({step_ms / predicted:.2f}x faster)"
        ),
        suggestion=(
            f"move layers off stage {stages[0]} to its neighbours (split the model where the "
            f"stages' forward and backward times come out even)"
            if len(replicas) == 1
            else f"look at rank {rank}'s device and host first: its replicas of the same stage "
            "are faster, so the stage's split is not the cause"
        ),
        evidence={
            "stage_indices": list(stages),
            "replicas": replicas,
            "slowdown": round(slower, 4),
            "busy_ms_per_step": {
                int(r): round(float(b) / 1e6, 3) for r, b in zip(ranks, busy, strict=True)
            },
            "forward_ms_per_microbatch": round(forward, 3),
            "backward_ms_per_microbatch": round(backward, 3),
            "median_forward_ms_per_microbatch": round(med_forward, 3),
            "median_backward_ms_per_microbatch": round(med_backward, 3),
            "step_ms": round(step_ms, 3),
            "balanced_step_ms": round(predicted, 3),
            "idle_caused_ms_per_step": round(saved, 3),
            "analysed_from_step": skip,
        },
    )


def _balanced_step_ms(
    stage_of: dict[int, tuple[int, ...]],
    ranks: np.ndarray,
    busy: np.ndarray,
    rank: int,
    median: float,
    microbatches: int,
    step_ms: float,
) -> float:
    """The step time with ``rank``'s work at the median: the measured step less what the
    pipeline formula (m - 1) x slowest + sum over stages loses to its excess."""

    def pace(work: dict[int, float]) -> float:
        per_stage: dict[tuple[int, ...], float] = {}
        for r, w in work.items():
            per_stage[stage_of[r]] = max(per_stage.get(stage_of[r], 0.0), w / microbatches)
        return (microbatches - 1) * max(per_stage.values()) + sum(per_stage.values())

    work = {int(r): float(b) for r, b in zip(ranks, busy, strict=True)}
    balanced = {**work, rank: min(work[rank], median)}
    return step_ms - (pace(work) - pace(balanced)) / 1e6
