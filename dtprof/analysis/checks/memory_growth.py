"""memory-growth: memory that keeps growing from step to step, the road to an out-of-memory.

Rule: per rank and memory metric (RSS; CUDA allocated and reserved), over the steps after the
first 10% (at least 2): the last reading exceeds the first by at least 20% and 256 MiB, and the
second half of the steps still adds at least 30% of that growth (so a plateau after warm-up is
not a leak). Warning. Its first step is where the growth began: the hinge of the best fit of
"flat, then a straight rise" to the worst rank's readings. The 10% are of the run's steps, and
the growth per step counts steps, not readings: a fast job's memory is read every few steps.
"""

from __future__ import annotations

import numpy as np

from dtprof.analysis.columns import codes, rows, sort_order, values, warmup_steps
from dtprof.analysis.report import Finding
from dtprof.analysis.summarize import RunSummary

MIN_GROWTH = 0.20
MIN_BYTES = 256 * 2**20
STILL_GROWING = 0.30
MAX_FIT_READINGS = 1024  # the onset fit is quadratic in the readings


def check(run: RunSummary) -> list[Finding]:
    mem = run.memory
    if not mem.num_rows:
        return []
    # the warm-up is a share of the run's steps, not of the readings (a few steps apart
    # where steps are fast)
    run_steps = run.steps if run.steps.num_rows else mem
    mem = rows(mem, values(mem, "step") >= warmup_steps(values(run_steps, "step")))
    mem = mem.take(sort_order(mem, "step"))
    code, names = codes(mem, "metric")
    step, rank, value = values(mem, "step"), values(mem, "rank"), values(mem, "value", float)
    findings = []
    for c in sorted(np.unique(code[code >= 0]), key=lambda c: names[c]):
        metric, pick = str(names[c]), code == c
        ranks, first, mid, last = _first_mid_last(rank[pick], value[pick])
        growth = last - first
        leaking = np.flatnonzero(
            (growth >= MIN_GROWTH * first)
            & (growth >= MIN_BYTES)
            & ((last - mid) >= STILL_GROWING * growth)
        )
        if not len(leaking):
            continue
        steps = np.unique(step[pick])
        # readings come at most every 50 ms (dtprof.record.memory): a fast job's are a few
        # steps apart, so the steps are counted from the first reading's to the last's
        span = int(steps[-1] - steps[0]) + 1
        worst = leaking[np.argmax(growth[leaking])]  # the first of equals, as max() gave
        mine = pick & (rank == ranks[worst])
        began = growth_onset(step[mine], value[mine])
        findings.append(
            Finding(
                code="memory-growth",
                severity="warning",
                ranks=ranks[leaking].tolist(),
                first_step=began,
                last_step=int(steps[-1]),
                message=(
                    f"{metric} grows on {len(leaking)} rank(s): rank {ranks[worst]} went from "
                    f"{first[worst] / 2**30:.2f} to {last[worst] / 2**30:.2f} GiB over "
                    f"{span} steps, growing from step {began} on, and is still growing"
                ),
                suggestion=(
                    "look for tensors kept across steps: a loss appended without .item() or "
                    ".detach(), growing caches or lists, or a data loader that accumulates"
                ),
                evidence={
                    "metric": metric,
                    "growth_from_step": began,
                    "growth_bytes": {int(ranks[i]): float(growth[i]) for i in leaking},
                    "bytes_per_step": {
                        int(ranks[i]): round(float(growth[i]) / max(span - 1, 1), 1)
                        for i in leaking
                    },
                },
            )
        )
    return findings


def growth_onset(step: np.ndarray, value: np.ndarray) -> int:
    """The step where readings that were flat start to rise: the hinge of the least-squares
    fit of value = a + b * max(0, step - hinge), over every reading's step as the hinge (the
    reading after it is the first that grew)."""
    known = ~np.isnan(value)
    step, value = step[known].astype(np.float64), value[known]
    order = np.argsort(step, kind="stable")
    step, value = step[order], value[order]
    every = -(-len(step) // MAX_FIT_READINGS)  # long runs: every k-th reading, a k-step grain
    step, value = step[::every], value[::every]
    if len(step) < 3:
        return int(step[0])
    ramp = np.maximum(step[None, :] - step[:-1, None], 0)  # row k: the hinge at step[k]
    ramp_mean = ramp.mean(axis=1, keepdims=True)
    centred = ramp - ramp_mean
    rise = value - value.mean()
    slope = (centred @ rise) / np.maximum((centred**2).sum(axis=1), 1e-30)
    sse = ((rise[None, :] - slope[:, None] * centred) ** 2).sum(axis=1)
    return int(step[int(np.argmin(sse)) + 1])


def _first_mid_last(
    rank: np.ndarray, value: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The ranks (sorted) and, per rank, in the rows' order: the first value that is not NaN,
    the value of the middle row (``len // 2``) and the last value that is not NaN, as pandas'
    groupby first, iloc and last took them. A stable sort keeps the rows' order within a rank."""
    order = np.argsort(rank, kind="stable")
    rank, value = rank[order], np.asarray(value, np.float64)[order]
    ranks, starts, counts = np.unique(rank, return_index=True, return_counts=True)
    first, last = np.full(len(ranks), np.nan), np.full(len(ranks), np.nan)
    known = ~np.isnan(value)
    if known.any():
        some, at, n = np.unique(rank[known], return_index=True, return_counts=True)
        where = np.searchsorted(ranks, some)
        first[where] = value[known][at]
        last[where] = value[known][at + n - 1]
    return ranks, first, value[starts + counts // 2], last
