"""Compute time as sorted disjoint intervals per rank: how much of it lies before a moment, so
that the compute under any interval is a difference of two lookups (overlap's sweeps, and the
time a rank sat blocked in a synchronous collective during its phases)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from dtprof.analysis.columns import is_null, rows, values


def ended(table: pa.Table) -> pa.Table:
    """The rows with an end (a rank stopped inside a span leaves its end null)."""
    return rows(table, ~is_null(table, "end_ns"))


def merged_compute(compute: pa.Table) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per rank, its compute spans merged into sorted disjoint [start, end), with the compute
    time before each one (prefix sums): what compute_before needs. Spans that never ended are
    left out."""
    compute = ended(compute)
    ranks = values(compute, "rank")
    starts, ends = values(compute, "start_ns", np.int64), values(compute, "end_ns", np.int64)
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
