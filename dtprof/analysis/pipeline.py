"""Pipeline stages' busy and idle time, and the idle time a schedule's shape implies: one
statement of each, for the checks and the dashboard.

A rank is busy in a step for the union of its pipeline actions there (forward, backward,
backward_input, backward_weight), and idle for the rest of the step.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from dtprof.analysis.columns import group_median, group_union_ns, groups, rows, values


def schedule_bubble(schedule: str, stages: int, microbatches: int, per_rank: int) -> float:
    """The share of a step a pipeline schedule leaves each stage idle, by its own shape: for p
    stages, m microbatches and v stages per rank, (p-1)/(m+p-1) for GPipe and 1F1B,
    (p-1)/(v*m+p-1) for interleaved schedules, about a third of that for zero-bubble ones."""
    p, m, v = stages // max(per_rank, 1), microbatches, max(per_rank, 1)
    if p <= 1:
        return 0.0
    if "ZeroBubble" in schedule or "ZBV" in schedule or "DualPipe" in schedule:
        return (p - 1) / (3 * (v * m + p - 1))
    if v > 1:
        return (p - 1) / (v * m + p - 1)
    return (p - 1) / (m + p - 1)


def busy_ns(actions: pa.Table, steps: pa.Table) -> np.ndarray:
    """Per row of ``steps`` (rank, step): how long that rank was busy in that step, 0 without
    any action. Times as float64, as the bubble has always been measured (at wall-clock
    magnitudes each rounds to 256 ns)."""
    n = actions.num_rows
    _, inverse = groups(
        np.concatenate([values(actions, "rank"), values(steps, "rank")]),
        np.concatenate([values(actions, "step"), values(steps, "step")]),
    )
    start, end = values(actions, "start_ns", np.float64), values(actions, "end_ns", np.float64)
    size = int(inverse.max()) + 1 if len(inverse) else 0
    return group_union_ns(inverse[:n], size, start, end)[inverse[n:]]


def idle_share_by_rank(actions: pa.Table, steps: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """The ranks with actions (sorted) and each one's idle share of its steps' time."""
    ranks = np.unique(values(actions, "rank"))
    steps = rows(steps, np.isin(values(steps, "rank"), ranks))
    step_ns = values(steps, "step_ns", np.float64)
    idle = np.maximum(step_ns - busy_ns(actions, steps), 0)
    at = np.searchsorted(ranks, values(steps, "rank"))
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.bincount(at, idle, len(ranks)) / np.bincount(at, step_ns, len(ranks))
    return ranks, share


def median_busy_by_rank(actions: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """The ranks with actions (sorted) and each one's median busy ns per step."""
    (rank, _), inverse = groups(values(actions, "rank"), values(actions, "step"))
    start, end = values(actions, "start_ns", np.int64), values(actions, "end_ns", np.int64)
    busy = group_union_ns(inverse, len(rank), start, end)
    (ranks,), by_rank = groups(rank)
    return ranks, group_median(by_rank, len(ranks), busy)


def idle_gaps(actions: pa.Table, steps: pa.Table) -> pa.Table:
    """rank, step, start_ns, end_ns of every stretch of a step in which its rank ran no action:
    before the first, between actions, after the last (rank-steps with actions only)."""
    out: list[tuple[int, int, int, int]] = []
    a_rank, a_step = values(actions, "rank"), values(actions, "step")
    a_start, a_end = values(actions, "start_ns", np.int64), values(actions, "end_ns", np.int64)
    bounds = {
        (int(r), int(s)): (int(b), int(e))
        for r, s, b, e in zip(
            values(steps, "rank"),
            values(steps, "step"),
            values(steps, "start_ns", np.int64),
            values(steps, "end_ns", np.int64),
            strict=True,
        )
    }
    order = np.lexsort((a_start, a_step, a_rank))
    keys = np.stack([a_rank[order], a_step[order]], axis=1)
    cuts = np.flatnonzero(np.any(np.diff(keys, axis=0) != 0, axis=1)) + 1
    for part in np.split(order, cuts):
        if not len(part):
            continue
        rank, step = int(a_rank[part[0]]), int(a_step[part[0]])
        if (rank, step) not in bounds:
            continue
        first, last = bounds[(rank, step)]
        reach = first
        for start, end in zip(a_start[part].tolist(), a_end[part].tolist(), strict=True):
            if start > reach:
                out.append((rank, step, reach, start))
            reach = max(reach, end)
        if last > reach:
            out.append((rank, step, reach, last))
    names = ["rank", "step", "start_ns", "end_ns"]
    return pa.table({n: pa.array([g[i] for g in out], pa.int64()) for i, n in enumerate(names)})
