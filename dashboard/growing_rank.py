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
import pyarrow as pa
import pyarrow.compute as pc

from dtprof.analysis.columns import rows, values
from dtprof.analysis.summarize import (
    COMPUTE_PHASES,
    RankSummary,
    RunSummary,
    combine,
    summarize_frames,
)
from dtprof.trace.follow import read_rank
from dtprof.trace.meta import InflightOp, RankMeta
from dtprof.trace.reader import clock_params, rank_table
from dtprof.trace.schema import TABLES

# the tables that grow with the run, one row per record: sliced out of the combined run
ROW_FRAMES = ("steps", "phases", "actions", "collectives", "scalars", "fingerprints", "memory")
NVML_PREFIX = "gpu_"  # the samples the summary leaves out (it keeps the memory readings)
PHASE_TIME = pa.schema(
    [("step", pa.int64()), ("compute_ns", pa.float64()), ("data_ns", pa.float64())]
)


@dataclass(frozen=True)
class GrowingRank:
    """One rank as the dashboard keeps it: its summary, grown poll by poll."""

    summary: RankSummary
    pending: pa.Table  # step, compute_ns, data_ns: phase time of steps with no row yet
    samples: pa.Table  # the samples rows as read (the Memory & GPU page draws them all)
    version: int = 0  # counts the polls that changed this rank (keys the row cache)

    @property
    def kernels(self) -> bool:
        return self.summary.gpu.num_rows > 0


def fresh(job: tuple[int, str, RankMeta, list[InflightOp]]) -> tuple[GrowingRank, Any, int]:
    """(rank, folder, meta, inflight rows) -> the rank summarized from the start of its
    folder, the follower cursors after what was read, the bytes read. Runs in a worker."""
    rank, folder, meta, inflight = job
    tables, cursors, nbytes = read_rank(Path(folder))
    return build(rank, meta, tables, inflight), cursors, nbytes


def build(
    rank: int, meta: RankMeta, tables: dict[str, pa.Table], inflight: list[InflightOp]
) -> GrowingRank:
    """A rank's GrowingRank from all of its rows."""
    summary = summarize_frames(meta, tables, inflight)
    return GrowingRank(
        summary=summary,
        pending=_phase_time(rank, meta, tables, after=_last_step(summary.steps)),
        samples=_nvml(tables),
    )


def extend(
    growing: GrowingRank,
    meta: RankMeta,
    tables: dict[str, pa.Table],
    inflight: list[InflightOp] | None,
) -> GrowingRank:
    """``growing`` with one poll's new rows of its rank (inflight: the new list; None:
    unchanged)."""
    rank = growing.summary.rank
    part = summarize_frames(meta, tables, inflight or [])
    sums = _per_step(pa.concat_tables([growing.pending, _phase_time(rank, meta, tables, after=-1)]))
    steps = part.steps
    keys, step = values(sums, "step"), values(steps, "step")
    at = np.searchsorted(keys, step)
    found = at < len(keys)
    found[found] = keys[at[found]] == step[found]
    for name in ("compute_ns", "data_ns"):
        ns = np.full(steps.num_rows, np.nan)
        ns[found] = values(sums, name)[at[found]]
        steps = steps.set_column(steps.schema.get_field_index(name), name, pa.array(ns))
    last = max(_last_step(growing.summary.steps), _last_step(steps))
    # the tables' types are fixed (an empty one has the columns and types of a full one), so
    # old and new concatenate as they are
    both = combine([growing.summary, replace(part, steps=steps)])
    summary = replace(
        as_rank(both, rank, meta),
        last_span=part.last_span if part.last_span.num_rows else growing.summary.last_span,
        inflight=part.inflight if inflight is not None else growing.summary.inflight,
        gpu=growing.summary.gpu,
    )
    pending = rows(sums, values(sums, "step") > last)
    nvml = _nvml(tables)
    samples = pa.concat_tables([growing.samples, nvml]) if nvml.num_rows else growing.samples
    return GrowingRank(summary, pending, samples, growing.version + 1)


def as_rank(run: RunSummary, rank: int, meta: RankMeta) -> RankSummary:
    """The RankSummary of one rank's rows of a run."""
    names = [f.name for f in fields(RankSummary) if f.name not in ("rank", "meta")]
    return RankSummary(rank=rank, meta=meta, **{n: getattr(run, n) for n in names})


def rebase(growing: dict[int, GrowingRank], run: RunSummary) -> dict[int, GrowingRank]:
    """Each rank's growing tables as slices of the combined run's (which is in rank order):
    views, so that a rank's rows are growing once, not twice."""
    out = dict(growing)
    starts = dict.fromkeys(ROW_FRAMES, 0)
    for rank in sorted(growing):
        summary = growing[rank].summary
        cut = {}
        for name in ROW_FRAMES:
            n = getattr(summary, name).num_rows
            cut[name] = getattr(run, name).slice(starts[name], n)
            starts[name] += n
        out[rank] = replace(growing[rank], summary=replace(summary, **cut))
    return out


def moved_clock(old: RankMeta, new: RankMeta) -> bool:
    """True when meta.json's clock now maps this rank's stamps elsewhere (drift at exit)."""
    return clock_params(old) != clock_params(new)


def _last_step(steps: pa.Table) -> int:
    return int(values(steps, "step").max()) if steps.num_rows else -1


def _nvml(tables: dict[str, pa.Table]) -> pa.Table:
    """The NVML samples among a rank's new samples rows."""
    samples = tables.get("samples")
    if samples is None:
        return TABLES["samples"].schema.empty_table()
    return samples.filter(pc.starts_with(samples.column("metric"), NVML_PREFIX))


def _phase_time(rank: int, meta: RankMeta, tables: dict[str, pa.Table], after: int) -> pa.Table:
    """step, compute_ns, data_ns of each phase of the steps > after (aligned, as the summary
    counts them; null in the column of the other kind, and where the phase never ended)."""
    spans = tables.get("spans")
    if spans is None or not spans.num_rows:
        return PHASE_TIME.empty_table()
    keep = pc.and_(pc.greater(spans.column("step"), after), pc.equal(spans.column("kind"), "phase"))
    phases = rank_table(TABLES["spans"], [(rank, spans.filter(keep))], {rank: clock_params(meta)})
    length = pc.subtract(phases.column("end_ns"), phases.column("start_ns"))
    ns = pc.cast(length, pa.float64(), safe=False)
    compute = pc.is_in(phases.column("name"), pa.array(COMPUTE_PHASES))
    data = pc.equal(phases.column("name"), "data")
    none = pa.scalar(None, pa.float64())
    out = pa.table(
        [phases.column("step"), pc.if_else(compute, ns, none), pc.if_else(data, ns, none)],
        schema=PHASE_TIME,
    )
    return out.filter(pc.or_(compute, data))


def _per_step(phase_time: pa.Table) -> pa.Table:
    """step, compute_ns, data_ns summed per step, in step order (null: no phase of that kind,
    as Arrow's sum skips nulls and gives null for none)."""
    sums = phase_time.group_by("step").aggregate([("compute_ns", "sum"), ("data_ns", "sum")])
    sums = sums.select(["step", "compute_ns_sum", "data_ns_sum"]).rename_columns(PHASE_TIME.names)
    return sums.sort_by("step")
