"""poor-overlap: communication that runs while no compute does, on every step.

Rule: per rank, communication time is the union of the transfer intervals of its collectives
(those every member of their group recorded), each from the moment the last member entered
(waiting for a late rank is the straggler's, not overlap's); overlapped time is the part of it
during a forward, backward or optimizer phase (HTA's definition: overlapped / all
communication). The exposed rest as a share of the step is flagged at >= 25% (warning; >= 50%:
error) on the ranks where it happens. The first steps (10%, at least 2) are skipped.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dtprof.analysis.checks.straggler import warmup_steps
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


def check(run: RunSummary) -> list[Finding]:
    if run.collectives.empty or run.phases.empty or run.steps.empty:
        return []
    skip = warmup_steps(run.steps["step"])
    comm = transfer_intervals(run, skip)
    compute = run.phases[run.phases["step"] >= skip]
    if not comm:
        return []
    per = overlap_per_rank(comm, compute)
    step_ns = run.steps[run.steps["step"] >= skip].groupby("rank")["step_ns"].sum()
    per["overlap_fraction"] = per["overlap_ns"] / per["comm_ns"].where(per["comm_ns"] > 0)
    per["exposed_comm_fraction"] = (per["comm_ns"] - per["overlap_ns"]) / step_ns
    bad = per[per["exposed_comm_fraction"] >= WARN_EXPOSED]
    if bad.empty:
        return []
    exposed = float(bad["exposed_comm_fraction"].median())
    overlap = float(bad["overlap_fraction"].median())
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
                f"communication is exposed for {exposed:.0%} of each step on "
                f"{len(ranks)} rank(s): only {overlap:.0%} of it runs while compute does"
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
                    }
                    for r, row in per.iterrows()
                },
            },
        )
    ]
