"""poor-overlap: communication that runs while no compute does, on every step.

Rule: per rank, communication time is the union of the transfer intervals of its collectives
(those every member of their group recorded), each from the moment the last member entered
(waiting for a late rank is the straggler's, not overlap's); overlapped time is the part of it
during a forward, backward or optimizer phase (HTA's definition: overlapped / all
communication), and exposed time the rest, as a share of the step.

The job's exposure is read on its critical path: each rank's exposed share weighted by how often
it arrived last at the collectives (a tie counts for every rank in it; straggler's
last_arrival_shares). The rank that arrives last decides when a transfer runs; a rank that
waits for a late one sees every transfer after its own compute has ended, exposed because of
the straggler, not because the job cannot overlap. Flagged at >= 25% (warning; >= 50%: error),
on the ranks exposed at least that much that arrived last at some collective. The first steps
(10%, at least 2) are skipped.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dtprof.analysis.checks.straggler import last_arrival_shares, warmup_steps
from dtprof.analysis.report import Finding
from dtprof.analysis.summarize import RunSummary

WARN_EXPOSED = 0.25
ERROR_EXPOSED = 0.50


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
        start = g.start[keep].max(axis=1)
        end = np.maximum(start[:, None], g.end[keep])
        for col, rank in enumerate(g.ranks):
            out.setdefault(int(rank), []).append(np.stack([start, end[:, col]]))
    return out


def intervals_by_rank(frame: pd.DataFrame) -> dict[int, list[np.ndarray]]:
    """A frame's rank, start_ns, end_ns as transfer_intervals gives them."""
    return {
        int(rank): [rows[["start_ns", "end_ns"]].to_numpy(np.int64).T]
        for rank, rows in frame.groupby("rank")
    }


def covered(comm: np.ndarray, compute: np.ndarray) -> tuple[int, int]:
    """ns covered by the union of comm intervals, and ns of it inside compute intervals.

    Both are (2, n) arrays of [start, end]; one sorted sweep over their edges.
    """
    t = np.concatenate([comm[0], comm[1], compute[0], compute[1]])
    nc, np_ = comm.shape[1], compute.shape[1]
    dcomm = np.concatenate([np.ones(nc), -np.ones(nc), np.zeros(2 * np_)]).astype(np.int32)
    dcomp = np.concatenate([np.zeros(2 * nc), np.ones(np_), -np.ones(np_)]).astype(np.int32)
    order = np.argsort(t, kind="stable")
    t = t[order]
    comm_on = np.cumsum(dcomm[order])[:-1] > 0
    comp_on = np.cumsum(dcomp[order])[:-1] > 0
    dt = np.diff(t)
    return int(dt[comm_on].sum()), int(dt[comm_on & comp_on].sum())


def overlap_per_rank(comm: dict[int, list[np.ndarray]], compute: pd.DataFrame) -> pd.DataFrame:
    """Per rank: communication ns (union) and the ns of it during compute."""
    phases = compute.sort_values("rank", kind="stable")
    ranks = phases["rank"].to_numpy()
    spans = phases[["start_ns", "end_ns"]].to_numpy(np.int64).T
    rows = {}
    for rank, parts in comm.items():
        lo, hi = np.searchsorted(ranks, rank), np.searchsorted(ranks, rank, side="right")
        rows[rank] = covered(np.concatenate(parts, axis=1), spans[:, lo:hi])
    return pd.DataFrame.from_dict(rows, orient="index", columns=["comm_ns", "overlap_ns"])


RANKS_PER_BLOCK = 128  # matrix columns swept at once: bounds the temporaries' memory


def merged_compute(compute: pd.DataFrame) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per rank, its compute spans merged into sorted disjoint [start, end), with the compute
    time before each one (prefix sums): what compute_before needs."""
    ranks = compute["rank"].to_numpy()
    starts, ends = compute["start_ns"].to_numpy(np.int64), compute["end_ns"].to_numpy(np.int64)
    step = np.diff(ranks)
    if not ((step >= 0).all() and ((step > 0) | (np.diff(starts) >= 0)).all()):
        order = np.lexsort((starts, ranks))  # stable: rows already in order stay in place
        ranks, starts, ends = ranks[order], starts[order], ends[order]
    out: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    if not len(ranks):
        return out
    cuts = np.flatnonzero(np.diff(ranks)) + 1
    for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, len(ranks)], strict=True):
        s, e = starts[lo:hi], ends[lo:hi]
        reach = np.maximum.accumulate(e)
        first = np.flatnonzero(np.r_[True, s[1:] > reach[:-1]])
        ms, me = s[first], np.maximum.reduceat(reach, first)
        out[int(ranks[lo])] = (ms, me, np.r_[0, np.cumsum(me - ms)])
    return out


def compute_before(merged: tuple[np.ndarray, np.ndarray, np.ndarray], t: np.ndarray) -> np.ndarray:
    """ns of compute before each time t, from merged_compute's arrays."""
    ms, me, prefix = merged
    j = np.searchsorted(ms, t, side="right")
    last_end = me[np.maximum(j - 1, 0)]
    return prefix[j] - np.where(j > 0, np.maximum(last_end - t, 0), 0)


def comm_overlap(run: RunSummary, first_step: int, compute: pd.DataFrame) -> pd.DataFrame:
    """Per rank: communication ns (the union of its transfers) and the ns of it during compute.

    Vectorized over the ranks of a group: a transfer starts when the group's last member
    entered, the same moment for every member, so the rows are sorted once and each member's
    union is a running maximum down its column; the compute under each union piece is a
    difference of compute_before. A rank in several groups is swept on its own.
    """
    unions = merged_compute(compute)
    groups = [g for g in run.matched if (g.complete & (g.step >= first_step)).any()]
    members = np.concatenate([g.ranks for g in groups]) if groups else np.zeros(0, np.int64)
    memberships = pd.Series(members).value_counts()
    alone = {int(r) for r, n in memberships.items() if n == 1}
    rows: dict[int, tuple[int, int]] = {}
    for g in groups:
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
                rows[rank] = (int((b - a).sum()), inside)
    if len(alone) < len(memberships):
        spread = {r: p for r, p in transfer_intervals(run, first_step).items() if r not in alone}
        for rank, row in overlap_per_rank(spread, compute).iterrows():
            rows[int(rank)] = (int(row["comm_ns"]), int(row["overlap_ns"]))
    return pd.DataFrame.from_dict(rows, orient="index", columns=["comm_ns", "overlap_ns"])


def check(run: RunSummary) -> list[Finding]:
    if run.collectives.empty or run.phases.empty or run.steps.empty:
        return []
    skip = warmup_steps(run.steps["step"])
    compute = run.phases.loc[run.phases["step"] >= skip, ["rank", "start_ns", "end_ns"]]
    per = comm_overlap(run, skip, compute)
    if per.empty:
        return []
    step_ns = run.steps[run.steps["step"] >= skip].groupby("rank")["step_ns"].sum()
    per["overlap_fraction"] = per["overlap_ns"] / per["comm_ns"].where(per["comm_ns"] > 0)
    per["exposed_comm_fraction"] = (per["comm_ns"] - per["overlap_ns"]) / step_ns
    per["last_arrival_share"] = last_arrival_shares(run, skip).reindex(per.index).fillna(0.0)
    weight = per["last_arrival_share"]
    if weight.sum() <= 0:
        return []
    exposed = float((per["exposed_comm_fraction"].fillna(0.0) * weight).sum() / weight.sum())
    if exposed < WARN_EXPOSED:
        return []
    overlap = float((per["overlap_fraction"].fillna(0.0) * weight).sum() / weight.sum())
    bad = per[(per["exposed_comm_fraction"] >= WARN_EXPOSED) & (weight > 0)]
    ranks = sorted(int(r) for r in bad.index)
    analysed = sorted(run.steps.loc[run.steps["step"] >= skip, "step"].unique())
    return [
        Finding(
            code="poor-overlap",
            severity="error" if exposed >= ERROR_EXPOSED else "warning",
            ranks=ranks,
            first_step=int(analysed[0]),
            last_step=int(analysed[-1]),
            message=(
                f"communication is exposed for {exposed:.0%} of each step on the critical path"
                f" ({len(ranks)} rank(s)): only {overlap:.0%} of it runs while compute does"
            ),
            suggestion=(
                "let communication start during backward: DDP with its default buckets "
                "(bucket_cap_mb ~25) instead of one all-reduce after backward(), or async "
                "collectives waited on only when their result is needed"
            ),
            evidence={
                "overlap_fraction": round(overlap, 4),
                "exposed_comm_fraction": round(exposed, 4),
                "per_rank": {
                    int(r): {
                        "overlap_fraction": round(float(row["overlap_fraction"]), 4),
                        "exposed_comm_fraction": round(float(row["exposed_comm_fraction"]), 4),
                        "last_arrival_share": round(float(row["last_arrival_share"]), 4),
                    }
                    for r, row in per.iterrows()
                },
            },
        )
    ]
