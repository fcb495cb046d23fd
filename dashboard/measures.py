"""Per rank x step measures the heatmaps and charts show, built on the analysis' own matching.

The checks reduce these to findings; the pages need them unreduced (per step, per collective),
so they are taken here from the same primitives: ``match`` pairs each collective across ranks,
``arrivals`` charges waiting, a transfer starts when the last member entered.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dtprof.analysis.checks.straggler import arrivals
from dtprof.analysis.summarize import RunSummary


def waiting(run: RunSummary) -> pd.DataFrame:
    """rank, step, wait_ns: time each rank waited at collectives for the last member."""
    return arrivals(run, 0).waited


def transfers(run: RunSummary) -> pd.DataFrame:
    """rank, step, start_ns, end_ns of complete collectives, from the last member's entry."""
    parts = []
    for g in run.matched:
        keep = g.complete
        if not keep.any():
            continue
        start = g.start[keep].max(axis=1)
        end = np.maximum(start[:, None], g.end[keep])
        n, m = end.shape
        parts.append(
            pd.DataFrame(
                {
                    "rank": np.tile(g.ranks, n),
                    "step": np.repeat(g.step[keep], m),
                    "start_ns": np.repeat(start, m),
                    "end_ns": end.ravel(),
                }
            )
        )
    if not parts:
        return pd.DataFrame(
            {c: pd.Series(dtype="int64") for c in ("rank", "step", "start_ns", "end_ns")}
        )
    return pd.concat(parts, ignore_index=True)


def exposed(comm: pd.DataFrame, compute: pd.DataFrame) -> pd.DataFrame:
    """rank, step, comm_ns, overlap_ns: union of transfers per rank and step, and its part
    inside compute phases; one sorted sweep over every interval edge."""
    key_c = comm["rank"].to_numpy(np.int64) * (1 << 32) + comm["step"].to_numpy(np.int64)
    key_p = compute["rank"].to_numpy(np.int64) * (1 << 32) + compute["step"].to_numpy(np.int64)
    key = np.concatenate([key_c, key_c, key_p, key_p])
    t = np.concatenate(
        [comm["start_ns"], comm["end_ns"], compute["start_ns"], compute["end_ns"]]
    ).astype(np.int64)
    nc, np_ = len(comm), len(compute)
    dcomm = np.concatenate([np.ones(nc), -np.ones(nc), np.zeros(2 * np_)]).astype(np.int32)
    dcomp = np.concatenate([np.zeros(2 * nc), np.ones(np_), -np.ones(np_)]).astype(np.int32)
    order = np.lexsort((t, key))
    key, t, dcomm, dcomp = key[order], t[order], dcomm[order], dcomp[order]
    if not len(key):
        return pd.DataFrame(columns=["rank", "step", "comm_ns", "overlap_ns"], dtype="int64")
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    comm_on = _running(dcomm, starts) > 0
    comp_on = _running(dcomp, starts) > 0
    dt = np.r_[np.diff(t), 0]
    dt[np.r_[starts[1:] - 1, len(t) - 1]] = 0  # no span from one key's last edge to the next key
    ukey = key[starts]
    return pd.DataFrame(
        {
            "rank": ukey >> 32,
            "step": ukey & ((1 << 32) - 1),
            "comm_ns": np.add.reduceat(np.where(comm_on, dt, 0), starts),
            "overlap_ns": np.add.reduceat(np.where(comm_on & comp_on, dt, 0), starts),
        }
    )


def _running(delta: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Cumulative sum of delta restarting at each group start."""
    total = np.cumsum(delta)
    before = np.r_[0, total[starts[1:] - 1]]
    return total - np.repeat(before, np.diff(np.r_[starts, len(delta)]))


def arrival_skew(run: RunSummary) -> pd.DataFrame:
    """group, seq, step, op, skew_ns (last entry - first), last_rank, start_ns per collective."""
    parts = []
    for g in run.matched:
        keep = g.complete
        if not keep.any():
            continue
        start = g.start[keep]
        parts.append(
            pd.DataFrame(
                {
                    "group": g.group,
                    "seq": g.seq[keep],
                    "step": g.step[keep],
                    "op": g.op[keep],
                    "skew_ns": start.max(axis=1) - start.min(axis=1),
                    "last_rank": g.ranks[start.argmax(axis=1)],
                    "start_ns": start.min(axis=1),
                }
            )
        )
    cols = ["group", "seq", "step", "op", "skew_ns", "last_rank", "start_ns"]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=cols)


def per_op(run: RunSummary) -> pd.DataFrame:
    """op, calls, bytes, transfer_ns (median), gbps (median of bytes / transfer) per op.

    A collective's transfer starts when its last member entered (no waiting counted); a
    point-to-point one's when it was called.
    """
    coll = run.collectives
    if coll.empty:
        return pd.DataFrame(columns=["op", "calls", "bytes", "transfer_ns", "gbps"])
    p2p = coll["peer"].notna().to_numpy()
    last = coll.groupby(["group", "seq"])["start_ns"].transform("max").to_numpy()
    begin = np.where(p2p, coll["start_ns"].to_numpy(), last)
    transfer = np.maximum(coll["end_ns"].to_numpy() - begin, 1)
    frame = pd.DataFrame(
        {
            "op": coll["op"].to_numpy(),
            "bytes": coll["bytes"].to_numpy(),
            "transfer_ns": transfer,
            "gbps": coll["bytes"].to_numpy() / transfer,  # bytes per ns = GB/s
        }
    )
    out = frame.groupby("op").agg(
        calls=("bytes", "size"),
        bytes=("bytes", "sum"),
        transfer_ns=("transfer_ns", "median"),
        gbps=("gbps", "median"),
    )
    return out.reset_index()
