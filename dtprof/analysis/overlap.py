"""Communication overlapped by compute: the one definition that poor-overlap and the dashboard's
measures share, and the sweeps that reduce it per rank or per rank and step.

A collective's transfer, on each member, runs from the moment its group's last member entered
(waiting for a late rank is the straggler's, not overlap's) to the member's own end; only
collectives every member recorded count (with one missing, waiting cannot be told from
transfer). A rank's communication time is the union of its transfers, and its overlapped time
the part of that union inside its compute phases (``RunSummary.phases``).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from dtprof.analysis.columns import values
from dtprof.analysis.intervals import compute_before, ended, merged_compute
from dtprof.analysis.matching import GroupMatrix
from dtprof.analysis.summarize import RunSummary


def transfers(g: GroupMatrix, keep: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The transfers of a group's rows ``keep``: their start (the last member's entry), one a
    row, and each member's end (a seq x member matrix, never before the start)."""
    start = g.start[keep].max(axis=1)
    return start, np.maximum(start[:, None], g.end[keep])


def sweep(
    key: np.ndarray,
    comm_start: np.ndarray,
    comm_end: np.ndarray,
    compute_key: np.ndarray,
    compute_start: np.ndarray,
    compute_end: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per key (int64, sorted, distinct): ns covered by the union of its comm intervals, and ns
    of that union inside its compute intervals. One sorted sweep over every interval edge."""
    nc, np_ = len(key), len(compute_key)
    keys = np.concatenate([key, key, compute_key, compute_key]).astype(np.int64)
    t = np.concatenate([comm_start, comm_end, compute_start, compute_end]).astype(np.int64)
    dcomm = np.concatenate([np.ones(nc), -np.ones(nc), np.zeros(2 * np_)]).astype(np.int32)
    dcomp = np.concatenate([np.zeros(2 * nc), np.ones(np_), -np.ones(np_)]).astype(np.int32)
    order = np.lexsort((t, keys))
    keys, t, dcomm, dcomp = keys[order], t[order], dcomm[order], dcomp[order]
    if not len(keys):
        return keys, keys.copy(), keys.copy()
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    comm_on = _running(dcomm, starts) > 0
    comp_on = _running(dcomp, starts) > 0
    dt = np.r_[np.diff(t), 0]
    dt[np.r_[starts[1:] - 1, len(t) - 1]] = 0  # no span from one key's last edge to the next key
    return (
        keys[starts],
        np.add.reduceat(np.where(comm_on, dt, 0), starts),
        np.add.reduceat(np.where(comm_on & comp_on, dt, 0), starts),
    )


def _running(delta: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Cumulative sum of delta restarting at each group start."""
    total = np.cumsum(delta)
    before = np.r_[0, total[starts[1:] - 1]]
    return total - np.repeat(before, np.diff(np.r_[starts, len(delta)]))


def transfer_intervals(run: RunSummary, first_step: int) -> dict[int, list[np.ndarray]]:
    """Per rank, the [start, end] ns arrays of its collectives' transfers from first_step on.

    A transfer starts when the last member entered. Only collectives every member of the group
    recorded count: with a member missing (a --ranks subset, a stopped rank) waiting cannot be
    told from transfer. p2p is left out.
    """
    out: dict[int, list[np.ndarray]] = {}
    for g in run.matched:
        keep = g.complete & (g.step >= first_step)
        if not keep.any():
            continue
        start, end = transfers(g, keep)
        for col, rank in enumerate(g.ranks):
            out.setdefault(int(rank), []).append(np.stack([start, end[:, col]]))
    return out


def _spans_by_rank(table: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """A table's ranks, sorted, and its [start_ns, end_ns] as a (2, n) array in their order
    (each rank's rows in the table's order); rows that never ended left out."""
    table = ended(table)
    ranks = values(table, "rank")
    order = np.argsort(ranks, kind="stable")
    spans = np.stack([values(table, "start_ns", np.int64), values(table, "end_ns", np.int64)])
    return ranks[order], spans[:, order]


def covered(comm: np.ndarray, compute: np.ndarray) -> tuple[int, int]:
    """ns covered by the union of comm intervals, and ns of it inside compute intervals; both
    (2, n) arrays of [start, end]: sweep() with one key."""
    _, comm_ns, overlap_ns = sweep(
        np.zeros(comm.shape[1], np.int64), comm[0], comm[1],
        np.zeros(compute.shape[1], np.int64), compute[0], compute[1],
    )  # fmt: skip
    return (int(comm_ns[0]), int(overlap_ns[0])) if len(comm_ns) else (0, 0)


def overlap_per_rank(
    comm: dict[int, list[np.ndarray]], compute: pa.Table
) -> dict[int, tuple[int, int]]:
    """Per rank (comm's order): communication ns (union) and the ns of it during compute."""
    ranks, spans = _spans_by_rank(compute)
    out = {}
    for rank, parts in comm.items():
        lo, hi = np.searchsorted(ranks, rank), np.searchsorted(ranks, rank, side="right")
        out[rank] = covered(np.concatenate(parts, axis=1), spans[:, lo:hi])
    return out


RANKS_PER_BLOCK = 128  # matrix columns swept at once: bounds the temporaries' memory


def comm_overlap(run: RunSummary, first_step: int, compute: pa.Table) -> dict[int, tuple[int, int]]:
    """Per rank: communication ns (the union of its transfers) and the ns of it during compute.

    Vectorized over the ranks of a group: a transfer starts when the group's last member
    entered, the same moment for every member, so the rows are sorted once and each member's
    union is a running maximum down its column; the compute under each union piece is a
    difference of compute_before. A rank in several groups is swept on its own.
    """
    unions = merged_compute(compute)
    matched = [g for g in run.matched if (g.complete & (g.step >= first_step)).any()]
    members = np.concatenate([g.ranks for g in matched]) if matched else np.zeros(0, np.int64)
    member, memberships = np.unique(members, return_counts=True)
    alone = set(member[memberships == 1].tolist())
    out: dict[int, tuple[int, int]] = {}
    for g in matched:
        keep = g.complete & (g.step >= first_step)
        start = g.start.max(axis=1)[keep]
        order = np.argsort(start, kind="stable")
        start = start[order]
        rows_in_order = np.flatnonzero(keep)[order]
        for lo in range(0, len(g.ranks), RANKS_PER_BLOCK):
            block = range(lo, min(lo + RANKS_PER_BLOCK, len(g.ranks)))
            cols = [c for c in block if int(g.ranks[c]) in alone]
            if not cols:
                continue
            end = np.maximum(start[:, None], g.end[np.ix_(rows_in_order, np.array(cols))])
            reach = np.maximum.accumulate(end, axis=0)
            # piece i of the union: from where the earlier ones reached (or its start) to its end
            before = np.vstack([np.full((1, len(cols)), start[0]), reach[:-1]])
            piece_lo = np.maximum(start[:, None], before)
            piece_hi = np.maximum(end, piece_lo)
            for i, c in enumerate(cols):
                rank = int(g.ranks[c])
                a, b = piece_lo[:, i], piece_hi[:, i]
                inside = 0
                if rank in unions:
                    under = compute_before(unions[rank], b) - compute_before(unions[rank], a)
                    inside = int(under.sum())
                out[rank] = (int((b - a).sum()), inside)
    if len(alone) < len(member):
        spread = {r: p for r, p in transfer_intervals(run, first_step).items() if r not in alone}
        out.update(overlap_per_rank(spread, compute))
    return out
