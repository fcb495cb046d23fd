"""What the live source keeps of each rank: its summary, grown delta by delta, never its rows.

A rank is summarized once from its folder (``fresh``, in a worker process for a large trace),
then each poll's new rows are summarized alone and appended (``extend``) and dropped. One
thing does not append: a step's compute and data time sums its phases, which may be read a
poll before the step's own row, so the phase time of steps whose row has not come yet is kept
(``pending``). A rank whose clock parameters change (the drift written at exit) or that has GPU
kernels (their figures need every kernel) is summarized from its folder again instead.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from dtprof.analysis.summarize import (
    COMPUTE_PHASES,
    RankSummary,
    RunSummary,
    combine,
    summarize_frames,
)
from dtprof.trace.follow import read_rank
from dtprof.trace.reader import clock_params, table_frame
from dtprof.trace.schema import TABLES

# the frames that grow with the run, one row per record: sliced out of the combined run
ROW_FRAMES = ("steps", "phases", "actions", "collectives", "scalars", "fingerprints", "memory")
GROWING = (*ROW_FRAMES, "events")
NVML_PREFIX = "gpu_"  # the samples the summary leaves out (it keeps the memory readings)


@dataclass(frozen=True)
class Held:
    """One rank as the dashboard keeps it."""

    summary: RankSummary
    pending: pd.DataFrame  # step, compute_ns, data_ns: phase time of steps with no row yet
    samples: pa.Table  # the samples rows as read (the Memory & GPU page draws them all)
    version: int = 0  # counts the polls that changed this rank (keys the row cache)

    @property
    def kernels(self) -> bool:
        return not self.summary.gpu.empty


def fresh(job: tuple[int, str, dict[str, Any], list[dict[str, Any]]]) -> tuple[Held, Any, int]:
    """(rank, folder, meta, inflight rows) -> the rank summarized from the start of its
    folder, the follower cursors after what was read, the bytes read. Runs in a worker."""
    rank, folder, meta, inflight = job
    tables, cursors, nbytes = read_rank(Path(folder))
    return build(rank, meta, tables, inflight), cursors, nbytes


def build(
    rank: int, meta: dict[str, Any], tables: dict[str, pa.Table], inflight: list[dict[str, Any]]
) -> Held:
    """A rank's Held from all of its rows."""
    summary = summarize_frames({**meta, "rank": rank}, tables, inflight)
    last = summary.steps["step"].max() if not summary.steps.empty else -1
    return Held(
        summary=summary,
        pending=_phase_time(rank, meta, tables, after=int(last)),
        samples=_nvml(tables),
    )


def extend(
    held: Held,
    meta: dict[str, Any],
    tables: dict[str, pa.Table],
    inflight: list[dict[str, Any]] | None,
) -> Held:
    """``held`` with one poll's new rows of its rank (inflight: the new list, None: unchanged)."""
    rank = held.summary.rank
    part = summarize_frames({**meta, "rank": rank}, tables, inflight or [])
    sums = pd.concat([held.pending, _phase_time(rank, meta, tables, after=-1)])
    sums = sums.groupby("step")[["compute_ns", "data_ns"]].sum(min_count=1)
    steps = part.steps.assign(
        compute_ns=part.steps["step"].map(sums["compute_ns"]).to_numpy(np.float64),
        data_ns=part.steps["step"].map(sums["data_ns"]).to_numpy(np.float64),
    )
    last = max(
        int(held.summary.steps["step"].max()) if not held.summary.steps.empty else -1,
        int(steps["step"].max()) if not steps.empty else -1,
    )
    # an empty frame takes the other's types (an empty text column is not categorical)
    part = replace(part, steps=steps)
    old = held.summary
    fill_old = {n: getattr(part, n).iloc[:0] for n in GROWING if getattr(old, n).empty}
    fill_new = {n: getattr(old, n).iloc[:0] for n in GROWING if getattr(part, n).empty}
    both = combine([replace(old, **fill_old), replace(part, **fill_new)])
    summary = as_rank(both, rank, meta)
    summary = replace(
        summary,
        last_span=part.last_span if not part.last_span.empty else held.summary.last_span,
        inflight=part.inflight if inflight is not None else held.summary.inflight,
        gpu=held.summary.gpu,
    )
    pending = sums[sums.index > last].reset_index()
    samples = pa.concat_tables([held.samples, _nvml(tables)])
    return Held(summary, pending, samples, held.version + 1)


def as_rank(run: RunSummary, rank: int, meta: dict[str, Any]) -> RankSummary:
    """The RankSummary of one rank's rows of a run."""
    names = [f.name for f in fields(RankSummary) if f.name not in ("rank", "meta")]
    return RankSummary(rank=rank, meta=meta, **{n: getattr(run, n) for n in names})


def rebase(held: dict[int, Held], run: RunSummary) -> dict[int, Held]:
    """Each rank's growing frames as slices of the combined run's (which is in rank order):
    views, so that a rank's rows are held once, not twice."""
    out = dict(held)
    starts = {name: 0 for name in ROW_FRAMES}
    for rank in sorted(held):
        summary = held[rank].summary
        cut = {}
        for name in ROW_FRAMES:
            n = len(getattr(summary, name))
            cut[name] = getattr(run, name).iloc[starts[name] : starts[name] + n]
            starts[name] += n
        out[rank] = replace(held[rank], summary=replace(summary, **cut))
    return out


def moved_clock(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """True when meta.json's clock now maps this rank's stamps elsewhere (drift at exit)."""
    return clock_params(old) != clock_params(new)


def _nvml(tables: dict[str, pa.Table]) -> pa.Table:
    """The NVML samples among a rank's new samples rows."""
    samples = tables.get("samples")
    if samples is None:
        return TABLES["samples"].schema.empty_table()
    return samples.filter(pc.starts_with(samples.column("metric"), NVML_PREFIX))


def _phase_time(rank: int, meta: dict[str, Any], tables: dict[str, pa.Table], after: int) -> Any:
    """step, compute_ns, data_ns summed over the phases of steps > after (aligned, as the
    summary counts them)."""
    spans = tables.get("spans")
    if spans is None or not spans.num_rows:
        return pd.DataFrame({"step": [], "compute_ns": [], "data_ns": []})
    keep = pc.and_(pc.greater(spans.column("step"), after), pc.equal(spans.column("kind"), "phase"))
    frame = table_frame(TABLES["spans"], [(rank, spans.filter(keep))], {rank: clock_params(meta)})
    ns = (frame["end_ns"] - frame["start_ns"]).to_numpy(np.float64)
    compute = frame["name"].isin(COMPUTE_PHASES).to_numpy()
    data = frame["name"].eq("data").to_numpy()
    out = pd.DataFrame(
        {
            "step": frame["step"].to_numpy(np.int64),
            "compute_ns": np.where(compute, ns, np.nan),
            "data_ns": np.where(data, ns, np.nan),
        }
    )
    return out[compute | data]
