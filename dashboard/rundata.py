"""RunData: what the pages draw from, made by the analysis' own per-rank summaries.

The dashboard keeps each rank's summary (``summarize_frames``, the analyzer's reduction of one
rank's tables; grown poll by poll, dashboard.held) and its samples, not its rows: the spans a
page shows are read from disk on demand (dashboard.rows).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from dashboard.rows import Rows
from dtprof.analysis.summarize import RunSummary, combine, summarize_frames
from dtprof.trace.reader import clock_params, table_frame
from dtprof.trace.schema import TABLES


@dataclass(frozen=True)
class RunData:
    """The analysis' RunSummary plus what it leaves out: NVML samples, and where the spans are."""

    run: RunSummary
    samples: pd.DataFrame  # rank, step, ts_ns, metric, value
    rows: Rows = field(default_factory=Rows)  # spans, read on demand
    memo: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    lock: threading.Lock = field(default_factory=threading.Lock, compare=False, repr=False)

    def cached(self, key: str, make: Callable[[], Any]) -> Any:
        """Per-run memo of the aggregates the pages share (dashboard.measures): made once."""
        with self.lock:  # two page requests at once must not both sweep a large run
            if key not in self.memo:
                self.memo[key] = make()
            return self.memo[key]

    @property
    def ranks(self) -> list[int]:
        return self.run.ranks

    @property
    def steps(self) -> pd.DataFrame:
        return self.run.steps

    @property
    def last_step(self) -> int:
        return int(self.run.steps["step"].max()) if not self.run.steps.empty else -1


def samples_frame(samples: dict[int, pa.Table], meta: dict[int, dict[str, Any]]) -> pd.DataFrame:
    """Every rank's samples as one frame, times on rank 0's clock."""
    params = {r: clock_params(m) for r, m in meta.items() if r in samples}
    if not params:
        params = {0: clock_params({})}
    return table_frame(TABLES["samples"], sorted(samples.items()), params)


def steps_only(steps: pd.DataFrame, meta: dict[int, dict[str, Any]]) -> RunData:
    """A first look at a large trace: the step table alone (no phases: compute and data unknown)."""
    base = empty()
    steps = steps.assign(
        step_ns=steps["end_ns"] - steps["start_ns"], compute_ns=np.nan, data_ns=np.nan
    )
    run = replace(base.run, ranks=sorted(meta), meta=meta, steps=steps)
    return replace(base, run=run)


def empty() -> RunData:
    """No rank read yet: every frame empty, with its columns."""
    meta = {"rank": 0, "world_size": 0}
    run = combine([summarize_frames(meta, {}, [])])
    run = replace(run, ranks=[], meta={})
    params = {0: clock_params(meta)}
    return RunData(run=run, samples=table_frame(TABLES["samples"], [], params))


def prefix(data: RunData, last_step: int) -> RunData:
    """The run as it stood when every rank had ended ``last_step``: what a live view had seen."""

    def upto(df: pd.DataFrame) -> pd.DataFrame:
        return df if df.empty or "step" not in df else df[df["step"] <= last_step]

    run = data.run
    held = data.rows.spans_held
    spans = upto(held if held is not None else data.rows.all_spans())
    last = spans.sort_values("end_ns", kind="stable").groupby("rank").tail(1)
    cut = replace(
        run.steps_between(None, last_step + 1),
        meta={r: {**m, "status": "running"} for r, m in run.meta.items()},
        inflight=run.inflight.iloc[:0],
        last_span=last[["rank", "step", "name", "kind", "end_ns"]].reset_index(drop=True),
    )
    rows = replace(data.rows, last_step=last_step, spans_held=spans)
    return RunData(run=cut, samples=upto(data.samples), rows=rows)
