"""The analysis' measures of a snapshot (dtprof.analysis.measures), made once per snapshot in
the polling thread (``precompute``), then windowed by the pages."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

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


def op_records(data: RunData) -> pd.DataFrame:
    """measures.op_records of the snapshot."""
    return data.cached("op_records", lambda: measures.op_records(data.run))
