"""Who arrived last at each collective, and who waited how long for whom.

The member that entered a matched collective last is that collective's culprit, and every
other member's wait (the last arrival - its own arrival) is charged to it: the rank the others
wait for arrives last, and has the shortest collectives, since the others are already waiting.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dtprof.analysis.columns import group_sum_ns, groups
from dtprof.analysis.summarize import RunSummary


@dataclass(frozen=True)
class Arrivals:
    """Who arrived last at each complete collective, and who waited how long, per step."""

    step: np.ndarray  # per complete collective: its step,
    culprit: np.ndarray  # the rank that entered it last (ties: the lowest),
    caused_ns: np.ndarray  # and the others' waiting for it
    wait_step: np.ndarray  # per (step, member rank), sorted: the step,
    wait_rank: np.ndarray  # the rank,
    wait_ns: np.ndarray  # and its waiting at the step's collectives
    last_share: dict[int, float]  # by rank: share of the collectives it entered last


def last_arrival_shares(run: RunSummary, first_step: int) -> dict[int, float]:
    """By rank: the share of the complete collectives from first_step on that it took part in
    and entered last (a tie counts for every rank in it)."""
    last_counts: dict[int, int] = {}
    member_rows: dict[int, int] = {}
    for g in run.matched:
        keep = g.complete & (g.step >= first_step)
        if not keep.any():
            continue
        start, kept = g.start[keep], int(keep.sum())
        last = (start == start.max(axis=1, keepdims=True)).sum(axis=0)
        for rank, n in zip(g.ranks.tolist(), last.tolist(), strict=True):
            last_counts[rank] = last_counts.get(rank, 0) + n
            member_rows[rank] = member_rows.get(rank, 0) + kept
    return {rank: last_counts[rank] / member_rows[rank] for rank in sorted(last_counts)}


def arrivals(run: RunSummary, first_step: int) -> Arrivals:
    """Charge the waiting at every complete collective from first_step on to its last arriver."""
    culprits, waited = [], []
    for g in run.matched:
        keep = g.complete & (g.step >= first_step)
        if not keep.any():
            continue
        start, step = g.start[keep], g.step[keep]
        last = start.max(axis=1)
        wait = last[:, None] - start
        culprits.append((step, g.ranks[start.argmax(axis=1)], wait.sum(axis=1)))
        order = np.argsort(step, kind="stable")
        steps, bounds = np.unique(step[order], return_index=True)
        per_step = np.add.reduceat(wait[order], bounds, axis=0)
        waited.append(
            (np.repeat(steps, len(g.ranks)), np.tile(g.ranks, len(steps)), per_step.ravel())
        )
    shares = last_arrival_shares(run, first_step)
    if not culprits:
        none = np.zeros(0, np.int64)
        return Arrivals(none, none, none, none, none, none, shares)
    step, culprit, caused = (np.concatenate(c) for c in zip(*culprits, strict=True))
    w_step, w_rank, w_ns = (np.concatenate(c) for c in zip(*waited, strict=True))
    (wait_step, wait_rank), inverse = groups(w_step, w_rank)
    wait_ns = group_sum_ns(inverse, len(wait_step), w_ns)
    return Arrivals(step, culprit, caused, wait_step, wait_rank, wait_ns, shares)
