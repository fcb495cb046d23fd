"""RunData: what the pages draw from, made by the analysis' own per-rank summaries.

The dashboard keeps each rank's rows in memory as read (dtprof.trace.follow) and summarizes a
rank again only when it got new rows (``summarize_frames``, the analyzer's reduction of one
rank's tables), so a live run costs the ranks that moved, not the whole trace.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from dtprof.analysis.summarize import RankSummary, RunSummary, combine, summarize_frames
from dtprof.trace.reader import clock_params, table_frame
from dtprof.trace.schema import TABLES


@dataclass(frozen=True)
class RunData:
    """The analysis' RunSummary plus the frames it leaves out: every span, NVML samples."""

    run: RunSummary
    spans: pd.DataFrame  # rank, step, name, kind, start_ns, end_ns, depth, stage, microbatch
    samples: pd.DataFrame  # rank, step, ts_ns, metric, value

    @property
    def ranks(self) -> list[int]:
        return self.run.ranks

    @property
    def steps(self) -> pd.DataFrame:
        return self.run.steps

    @property
    def last_step(self) -> int:
        return int(self.run.steps["step"].max()) if not self.run.steps.empty else -1


def summarize(
    rank: int, meta: dict[str, Any], tables: dict[str, pa.Table], inflight: list[dict[str, Any]]
) -> RankSummary:
    """One rank's summary from its rows in memory."""
    return summarize_frames({**meta, "rank": rank}, tables, inflight)


def assemble(
    summaries: dict[int, RankSummary],
    tables: dict[int, dict[str, pa.Table]],
    meta: dict[int, dict[str, Any]],
) -> RunData:
    """The run from every rank's summary, plus the spans and samples of every rank."""
    if not summaries:
        return empty()
    params = {r: clock_params(m) for r, m in meta.items() if r in summaries}
    spans = table_frame(
        TABLES["spans"],
        [(r, t["spans"]) for r, t in sorted(tables.items()) if r in params and "spans" in t],
        params,
    )
    samples = table_frame(
        TABLES["samples"],
        [(r, t["samples"]) for r, t in sorted(tables.items()) if r in params and "samples" in t],
        params,
    )
    return RunData(run=combine(list(summaries.values())), spans=spans, samples=samples)


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
    return RunData(
        run=run,
        spans=table_frame(TABLES["spans"], [], params),
        samples=table_frame(TABLES["samples"], [], params),
    )


def prefix(data: RunData, last_step: int) -> RunData:
    """The run as it stood when every rank had ended ``last_step``: what a live view had seen."""

    def upto(df: pd.DataFrame) -> pd.DataFrame:
        return df if df.empty or "step" not in df else df[df["step"] <= last_step]

    run = data.run
    spans = upto(data.spans)
    last = spans.sort_values("end_ns", kind="stable").groupby("rank").tail(1)
    cut = replace(
        run,
        meta={r: {**m, "status": "running"} for r, m in run.meta.items()},
        steps=upto(run.steps),
        phases=upto(run.phases),
        actions=upto(run.actions),
        collectives=upto(run.collectives),
        scalars=upto(run.scalars),
        fingerprints=upto(run.fingerprints),
        memory=upto(run.memory),
        events=upto(run.events),
        inflight=run.inflight.iloc[:0],
        last_span=last[["rank", "step", "name", "kind", "end_ns"]].reset_index(drop=True),
    )
    return RunData(run=cut, spans=spans, samples=upto(data.samples))
