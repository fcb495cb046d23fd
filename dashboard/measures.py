"""The analysis' measures of a snapshot (dtprof.analysis.measures), made once per snapshot in
the polling thread (``precompute``), then windowed by the pages."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pandas as pd

from dashboard.shape import window
from dtprof.analysis import measures

if TYPE_CHECKING:
    from dashboard.rundata import RunData


def precompute(data: RunData) -> None:
    """Make every per-snapshot measure now (in the polling thread), not in a page's request."""
    rank_steps(data)
    arrival_skew(data)
    op_records(data)


def rank_steps(data: RunData) -> pd.DataFrame:
    """measures.rank_steps of the snapshot."""
    return data.cached("rank_steps", lambda: measures.rank_steps(data.run))


def arrival_skew(data: RunData) -> pd.DataFrame:
    """measures.arrival_skew of the snapshot."""
    return data.cached("arrival_skew", lambda: measures.arrival_skew(data.run))


def op_records(data: RunData) -> tuple[pd.DataFrame, pd.DataFrame]:
    """measures.op_records of the snapshot."""
    return data.cached("op_records", lambda: measures.op_records(data.run))  # type: ignore[no-any-return]


def per_op(data: RunData, steps: tuple[int | None, int | None]) -> pd.DataFrame:
    """op, calls, bytes, transfer_ns (median), gbps (median of bytes / transfer) per op.

    A collective's transfer starts when its last member entered (no waiting counted); a
    point-to-point one's when it was called.
    """
    per, sample = op_records(data)
    if per.empty:
        return pd.DataFrame(columns=["op", "calls", "bytes", "transfer_ns", "gbps"])
    counts = window(per, steps).groupby("op")[["calls", "bytes"]].sum()
    medians = window(sample, steps).groupby("op")[["transfer_ns", "gbps"]].median()
    out: Any = counts.join(medians, how="inner")
    return out.reset_index()
