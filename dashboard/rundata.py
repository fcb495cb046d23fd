"""RunData: what the pages draw from, made by the analysis' own per-rank summaries.

The dashboard keeps each rank's summary (``summarize_frames``, the analyzer's reduction of one
rank's tables; grown poll by poll, dashboard.growing_rank) and its samples, not its rows: the
spans a page shows are read from disk on demand (dashboard.rows). The summaries are Arrow tables; a
page that computes with pandas takes a table as a DataFrame through ``RunData.frame``, made
once per snapshot.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from dashboard.rows import Rows
from dtprof.analysis.columns import steps_between, values
from dtprof.analysis.summarize import LAST_SPAN_COLUMNS, RunSummary, combine, summarize_frames
from dtprof.trace.meta import RankMeta
from dtprof.trace.meta import replace as meta_replace
from dtprof.trace.reader import arrow_frame, clock_params, rank_table, table_frame
from dtprof.trace.schema import SCHEMA_VERSION, TABLES


@dataclass(frozen=True)
class RunData:
    """The analysis' RunSummary plus what it leaves out: NVML samples, and where the spans are."""

    run: RunSummary
    samples: pd.DataFrame  # rank, step, ts_ns, metric, value
    rows: Rows = field(default_factory=Rows)  # spans, read on demand
    memo: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    # reentrant: an aggregate is made under it and may ask for a table's frame
    lock: threading.RLock = field(default_factory=threading.RLock, compare=False, repr=False)

    def cached(self, key: str, make: Callable[[], Any]) -> Any:
        """Per-run memo of the aggregates the pages share (dashboard.measures): made once."""
        with self.lock:  # two page requests at once must not both sweep a large run
            if key not in self.memo:
                self.memo[key] = make()
            return self.memo[key]

    def frame(self, name: str) -> pd.DataFrame:
        """One of the run's tables (steps, actions, collectives, ...) as pandas."""
        return self.cached(f"frame {name}", lambda: frame(getattr(self.run, name)))

    def window_frame(
        self,
        name: str,
        steps: tuple[int | None, int | None],
        equal: tuple[str, str] | None = None,
    ) -> pd.DataFrame:
        """One of the run's tables cut to a step window (and to the rows whose column ``equal[0]``
        is ``equal[1]``), then as pandas: a window of a large run's collectives or one metric
        of its memory, not all of them (each request; nothing kept)."""
        table = getattr(self.run, name)
        if equal is not None and table.num_rows:
            table = table.filter(pc.equal(table.column(equal[0]), equal[1]))
        return frame(steps_between(table, *steps))

    @property
    def ranks(self) -> list[int]:
        return self.run.ranks

    @property
    def steps(self) -> pd.DataFrame:
        return self.frame("steps")

    @property
    def last_step(self) -> int:
        steps = self.run.steps
        return int(values(steps, "step").max()) if steps.num_rows else -1


def frame(table: pa.Table) -> pd.DataFrame:
    """A summary table as pandas, as the analysis made its frames (integers with nulls
    nullable, dictionaries as categories)."""
    return arrow_frame(table, table.column_names)


def samples_frame(samples: dict[int, pa.Table], meta: dict[int, RankMeta]) -> pd.DataFrame:
    """Every rank's samples as one frame, times on rank 0's clock."""
    params = {r: clock_params(m) for r, m in meta.items() if r in samples}
    if not params:
        params = {0: clock_params(None)}
    return table_frame(TABLES["samples"], sorted(samples.items()), params)


def steps_only(steps: pa.Table, meta: dict[int, RankMeta]) -> RunData:
    """A first look at a large trace: the step table alone (no phases: compute and data unknown)."""
    base = empty()
    step_ns = pc.subtract(steps.column("end_ns"), steps.column("start_ns"))
    unknown = pa.array(np.full(steps.num_rows, np.nan))
    steps = (
        steps.append_column("step_ns", step_ns)
        .append_column("compute_ns", unknown)
        .append_column("data_ns", unknown)
    )
    run = replace(base.run, ranks=sorted(meta), meta=meta, steps=steps)
    return RunData(run=run, samples=base.samples)


def empty() -> RunData:
    """No rank read yet: every table empty, with its columns."""
    run = combine([summarize_frames(RankMeta(schema_version=SCHEMA_VERSION, rank=0), {}, [])])
    run = replace(run, ranks=[], meta={})
    params = {0: clock_params(None)}
    return RunData(run=run, samples=table_frame(TABLES["samples"], [], params))


LAST_SPAN = rank_table(TABLES["spans"], [], {}).select(LAST_SPAN_COLUMNS).schema


def prefix(data: RunData, last_step: int) -> RunData:
    """The run as it stood when every rank had ended ``last_step``: what a live view had seen."""

    def upto(df: pd.DataFrame) -> pd.DataFrame:
        return df if df.empty or "step" not in df else df[df["step"] <= last_step]

    run = data.run
    held = data.rows.spans_held
    spans = upto(held if held is not None else data.rows.all_spans())
    last = spans.sort_values("end_ns", kind="stable").groupby("rank").tail(1)
    last_span = pa.Table.from_pandas(last[LAST_SPAN_COLUMNS], LAST_SPAN, preserve_index=False)
    cut = replace(
        run.steps_between(None, last_step + 1),
        meta={r: meta_replace(m, status="running") for r, m in run.meta.items()},
        inflight=run.inflight.slice(0, 0),
        last_span=last_span.replace_schema_metadata(),
    )
    rows = replace(data.rows, last_step=last_step, spans_held=spans)
    return RunData(run=cut, samples=upto(data.samples), rows=rows)
