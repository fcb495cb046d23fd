"""Per-rank summarization: one rank's folder to small per-step tables, on rank 0's clock.

A pure function of a path, so it can run in a thread, a process pool or on a cluster worker;
everything after it works on these small tables only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dtprof.errors import DtprofError
from dtprof.trace.reader import (
    ClockParams,
    clock_params,
    inflight_frame,
    read_inflight,
    read_rank_meta,
    read_table,
    table_frame,
)
from dtprof.trace.schema import TABLES

COMPUTE_PHASES = ("forward", "backward", "optimizer")


@dataclass(frozen=True)
class RankSummary:
    """What the checks need of one rank."""

    rank: int
    meta: dict[str, Any]
    steps: pd.DataFrame  # step, start_ns, end_ns, step_ns, compute_ns, data_ns
    phases: pd.DataFrame  # rank, step, name, start_ns, end_ns: the compute phases only
    actions: pd.DataFrame  # rank, step, stage, microbatch, name, start_ns, end_ns (pipelining)
    collectives: pd.DataFrame  # rank, step, group, seq, op, bytes, peer, start_ns, end_ns, label
    scalars: pd.DataFrame  # rank, step, name, value
    fingerprints: pd.DataFrame  # rank, step, tensor, sum, sumsq
    memory: pd.DataFrame  # rank, step, metric, value: the per-step memory readings
    events: pd.DataFrame  # rank, step, ts_ns, kind, message, detail
    inflight: pd.DataFrame  # rank, step, group, seq, op, bytes, ..., start_ns (aligned)
    last_span: pd.DataFrame  # rank, step, name, kind, end_ns: what the rank did last


def _frame(folder: Path, name: str, rank: int, params: dict[int, ClockParams]) -> pd.DataFrame:
    return table_frame(TABLES[name], [(rank, read_table(folder, TABLES[name]))], params)


def summarize_rank(folder: str | Path) -> RankSummary:
    """Read one ``rank=NNNNN`` folder and reduce it to per-step tables."""
    folder = Path(folder)
    meta = read_rank_meta(folder)
    rank = int(meta["rank"])
    params = {rank: clock_params(meta)}
    steps = _frame(folder, "steps", rank, params)
    spans = _frame(folder, "spans", rank, params)
    steps["step_ns"] = steps["end_ns"] - steps["start_ns"]
    phases = spans[spans["kind"] == "phase"]
    per_phase = (
        phases.assign(ns=phases["end_ns"] - phases["start_ns"])
        .pivot_table(index="step", columns="name", values="ns", aggfunc="sum")
        .reindex(steps["step"])
    )
    compute = per_phase.reindex(columns=list(COMPUTE_PHASES)).sum(axis=1, min_count=1)
    steps["compute_ns"] = compute.to_numpy()
    data = per_phase["data"] if "data" in per_phase else pd.Series(np.nan, index=per_phase.index)
    steps["data_ns"] = data.to_numpy()
    return RankSummary(
        rank=rank,
        meta=meta,
        steps=steps,
        actions=spans.loc[
            spans["kind"] == "pipeline",
            ["rank", "step", "stage", "microbatch", "name", "start_ns", "end_ns"],
        ].reset_index(drop=True),
        phases=phases.loc[
            phases["name"].isin(COMPUTE_PHASES), ["rank", "step", "name", "start_ns", "end_ns"]
        ].reset_index(drop=True),
        collectives=_frame(folder, "collectives", rank, params),
        scalars=_frame(folder, "scalars", rank, params),
        fingerprints=_frame(folder, "fingerprints", rank, params),
        memory=_memory(_frame(folder, "samples", rank, params)),
        events=_frame(folder, "events", rank, params),
        inflight=inflight_frame([(rank, read_inflight(folder))], params),
        last_span=spans.sort_values("end_ns").tail(1)[["rank", "step", "name", "kind", "end_ns"]],
    )


def _memory(samples: pd.DataFrame) -> pd.DataFrame:
    keep = samples["metric"].isin(["rss_bytes", "cuda_allocated_bytes", "cuda_reserved_bytes"])
    return samples.loc[keep, ["rank", "step", "metric", "value"]].reset_index(drop=True)


@dataclass(frozen=True)
class RunSummary:
    """Every rank's summary, concatenated: the input of the cross-rank checks."""

    ranks: list[int]
    meta: dict[int, dict[str, Any]]
    steps: pd.DataFrame
    phases: pd.DataFrame
    actions: pd.DataFrame
    collectives: pd.DataFrame
    scalars: pd.DataFrame
    fingerprints: pd.DataFrame
    memory: pd.DataFrame
    events: pd.DataFrame
    inflight: pd.DataFrame
    last_span: pd.DataFrame

    @property
    def world_size(self) -> int:
        return max(int(m.get("world_size", 0)) for m in self.meta.values())


def combine(summaries: list[RankSummary]) -> RunSummary:
    """Concatenate per-rank summaries (in rank order)."""
    summaries = sorted(summaries, key=lambda s: s.rank)
    sizes = {int(s.meta.get("world_size", 0)) for s in summaries}
    if len(sizes) > 1:
        raise DtprofError(f"ranks disagree on the world size ({sorted(sizes)})")

    def cat(name: str) -> pd.DataFrame:
        frames = [getattr(s, name) for s in summaries]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

    return RunSummary(
        ranks=[s.rank for s in summaries],
        meta={s.rank: s.meta for s in summaries},
        steps=cat("steps"),
        phases=cat("phases"),
        actions=cat("actions"),
        collectives=cat("collectives"),
        scalars=cat("scalars"),
        fingerprints=cat("fingerprints"),
        memory=cat("memory"),
        events=cat("events"),
        inflight=cat("inflight"),
        last_span=cat("last_span"),
    )
