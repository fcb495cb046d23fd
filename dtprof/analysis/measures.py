"""Measures per rank x step and per collective for the dashboard to draw, and their reductions
per rank, per step and per operation over the steps a page shows.

The checks reduce these to findings; the dashboard shows them (per step, per collective, per
rank), from the same primitives: ``RunSummary.matched`` pairs each collective across
ranks (a seq x member matrix per group), a transfer starts when the last member entered
(``dtprof.analysis.overlap``, as poor-overlap reads it), the waiting before it is charged to
the last. The sweeps go through the members a block of ranks
at a time, so that no copy of a whole matrix is made. pandas frames, for plotting; imported by
the dashboard only (``dtprof analyze`` does not import pandas).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dtprof.analysis.columns import codes, is_null, rows, values
from dtprof.analysis.overlap import sweep, transfers
from dtprof.analysis.summarize import RunSummary

RANK_BLOCK = 64  # members swept at a time


def rank_steps(run: RunSummary) -> pd.DataFrame:
    """rank, step, step_ns, compute_ns, comm_ns, overlap_ns, wait_ns per rank-step (wait_ns NaN
    where no complete collective ran)."""
    per = pd.DataFrame({c: values(run.steps, c) for c in ("rank", "step", "step_ns", "compute_ns")})
    members = np.unique(np.concatenate([g.ranks for g in run.matched] or [np.zeros(0, int)]))
    # a phase that never ended bounds no interval
    phases = rows(run.phases, ~is_null(run.phases, "end_ns"))
    phase_rank = values(phases, "rank")
    comm, waits = [], []
    for lo in range(0, len(members), RANK_BLOCK):
        block = members[lo : lo + RANK_BLOCK]
        spans, wait = _transfers(run, int(block[0]), int(block[-1]))
        mine = rows(phases, (phase_rank >= block[0]) & (phase_rank <= block[-1]))
        comm.append(exposed(spans, pd.DataFrame({c: values(mine, c) for c in EXPOSED_COLUMNS})))
        waits.append(wait)
    if comm:
        sweep = pd.concat(comm, ignore_index=True)
        wait = pd.concat(waits, ignore_index=True).groupby(["rank", "step"], as_index=False).sum()
        per = per.merge(sweep, on=["rank", "step"], how="left").merge(
            wait, on=["rank", "step"], how="left"
        )
    else:
        per = per.assign(comm_ns=np.nan, overlap_ns=np.nan, wait_ns=np.nan)
    per[["comm_ns", "overlap_ns"]] = per[["comm_ns", "overlap_ns"]].fillna(0)
    return per


EXPOSED_COLUMNS = ("rank", "step", "start_ns", "end_ns")  # of the phases, for exposed()


def _transfers(run: RunSummary, first: int, last: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """For members first..last: each complete collective's transfer (rank, step, start_ns,
    end_ns, from the last member's entry) and the waiting per rank and step (wait_ns)."""
    spans, waits = [], []
    for g in run.matched:
        keep = np.flatnonzero(g.complete)
        lo, hi = np.searchsorted(g.ranks, [first, last + 1])
        if not len(keep) or lo == hi:
            continue
        latest, ends = transfers(g, keep)
        start = g.start[keep, lo:hi]
        end = ends[:, lo:hi]
        n, m = end.shape
        step = g.step[keep]
        ranks = g.ranks[lo:hi]
        spans.append(
            pd.DataFrame(
                {
                    "rank": np.tile(ranks, n),
                    "step": np.repeat(step, m),
                    "start_ns": np.repeat(latest, m),
                    "end_ns": end.ravel(),
                }
            )
        )
        order = np.argsort(step, kind="stable")
        steps, bounds = np.unique(step[order], return_index=True)
        per_step = np.add.reduceat((latest[:, None] - start)[order], bounds, axis=0)
        waits.append(
            pd.DataFrame(
                {
                    "rank": np.tile(ranks, len(steps)),
                    "step": np.repeat(steps, m),
                    "wait_ns": per_step.ravel(),
                }
            )
        )
    if not spans:
        cols = ("rank", "step", "start_ns", "end_ns")
        empty = pd.DataFrame({c: pd.Series(dtype="int64") for c in cols})
        return empty, pd.DataFrame({c: pd.Series(dtype="int64") for c in ("rank", "step")})
    return pd.concat(spans, ignore_index=True), pd.concat(waits, ignore_index=True)


def exposed(comm: pd.DataFrame, compute: pd.DataFrame) -> pd.DataFrame:
    """rank, step, comm_ns, overlap_ns: union of transfers per rank and step, and its part
    inside compute phases (dtprof.analysis.overlap.sweep, keyed by rank and step)."""
    key, comm_ns, overlap_ns = sweep(
        _rank_step(comm), comm["start_ns"].to_numpy(), comm["end_ns"].to_numpy(),
        _rank_step(compute), compute["start_ns"].to_numpy(), compute["end_ns"].to_numpy(),
    )  # fmt: skip
    if not len(key):
        return pd.DataFrame(columns=["rank", "step", "comm_ns", "overlap_ns"], dtype="int64")
    return pd.DataFrame(
        {
            "rank": key >> 32,
            "step": key & ((1 << 32) - 1),
            "comm_ns": comm_ns,
            "overlap_ns": overlap_ns,
        }
    )


def _rank_step(frame: pd.DataFrame) -> np.ndarray:
    """A rank and step as one int64 key, in their order."""
    return frame["rank"].to_numpy(np.int64) * (1 << 32) + frame["step"].to_numpy(np.int64)


def arrival_skew(run: RunSummary) -> pd.DataFrame:
    """group, seq, step, op, skew_ns (last entry - first), last_rank, start_ns per complete
    collective."""
    parts = []
    for g in run.matched:
        keep = g.complete
        if not keep.any():
            continue
        latest, earliest = g.start.max(axis=1)[keep], g.start.min(axis=1)[keep]
        parts.append(
            pd.DataFrame(
                {
                    "group": g.group,
                    "seq": g.seq[keep],
                    "step": g.step[keep],
                    "op": g.op[keep],
                    "skew_ns": latest - earliest,
                    "last_rank": g.ranks[g.start.argmax(axis=1)[keep]],
                    "start_ns": earliest,
                }
            )
        )
    cols = ["group", "seq", "step", "op", "skew_ns", "last_rank", "start_ns"]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=cols)


def op_records(run: RunSummary) -> pd.DataFrame:
    """Per op and step: calls and bytes, every record counted (their bandwidth:
    dtprof.analysis.bandwidth)."""
    coll = run.collectives
    if not coll.num_rows:
        return pd.DataFrame({"op": [], "step": [], "calls": [], "bytes": []})
    op, names = codes(coll, "op")
    step = values(coll, "step", np.int64)
    nbytes = values(coll, "bytes", np.int64)
    # calls and bytes per (op, step), exact, without a frame of every record
    key = op.astype(np.int64) * (step.max() + 1) + step
    ukey, inverse = np.unique(key, return_inverse=True)
    return pd.DataFrame(
        {
            "op": names[ukey // (step.max() + 1)],
            "step": ukey % (step.max() + 1),
            "calls": np.bincount(inverse),
            "bytes": np.bincount(inverse, weights=nbytes),
        }
    )


STEP_TIMES = ["step_ns", "compute_ns", "data_ns"]


def rank_medians(steps: pd.DataFrame) -> pd.DataFrame:
    """rank, step_ns, compute_ns, data_ns: each rank's median over the rank-steps given (NaN
    where it has no such phase)."""
    return steps.groupby("rank")[STEP_TIMES].median().reset_index()


def typical_step(steps: pd.DataFrame) -> tuple[float, dict[str, float | None]]:
    """The median over the ranks of each rank's median step time (ns), and of its compute and
    data phases over that time (compute_share, data_share: None where no rank has the phase)."""
    per = rank_medians(steps)
    step_ns = float(per["step_ns"].median())
    shares: dict[str, float | None] = {}
    for name in ("compute", "data"):
        value = per[f"{name}_ns"].median()
        shares[f"{name}_share"] = None if pd.isna(value) else float(value) / step_ns
    return step_ns, shares


def step_spread(steps: pd.DataFrame) -> pd.DataFrame:
    """step, min_ns, median_ns, max_ns: each step's time across the ranks."""
    per = steps.groupby("step")["step_ns"].agg(["min", "median", "max"])
    per.columns = ["min_ns", "median_ns", "max_ns"]
    return per.reset_index()


def rank_overlap(rank_steps: pd.DataFrame) -> pd.DataFrame:
    """rank, overlap_fraction, exposed_fraction over the rank-steps of rank_steps() given: the
    share of its communication under compute, and the share of its step time spent in
    communication that nothing hid. Ranks without communication are left out."""
    per = rank_steps.groupby("rank")[["comm_ns", "overlap_ns", "step_ns"]].sum()
    per = per[per["comm_ns"] > 0]
    return pd.DataFrame(
        {
            "rank": per.index.to_numpy(),
            "overlap_fraction": (per["overlap_ns"] / per["comm_ns"]).to_numpy(),
            "exposed_fraction": ((per["comm_ns"] - per["overlap_ns"]) / per["step_ns"]).to_numpy(),
        }
    )
