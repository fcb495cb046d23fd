"""What the live source keeps of each rank: its summary, grown delta by delta, never its rows.

A rank is summarized once from its folder (``fresh``, in a worker process for a large trace),
then each poll's new rows are summarized alone and appended (``extend``) and dropped. One
thing does not append: a step's compute and data time sums its phases (less the synchronous
collectives inside them), which may be read a poll before the step's own row, so the phases
and synchronous collectives of steps whose row has not come yet are kept (``pending``). A rank
whose clock parameters change (the drift written at exit) or that has GPU kernels (their
figures need every kernel) is summarized from its folder again instead.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from dtprof.analysis.columns import rows, values
from dtprof.analysis.summarize import (
    PHASE_COLUMNS,
    RankSummary,
    RunSummary,
    combine,
    phase_kinds,
    step_times,
    summarize_frames,
)
from dtprof.trace.follow import read_rank
from dtprof.trace.meta import InflightOp, RankMeta
from dtprof.trace.reader import clock_params, rank_table
from dtprof.trace.schema import TABLES

# the tables that grow with the run, one row per record: sliced out of the combined run
ROW_FRAMES = ("steps", "phases", "actions", "collectives", "scalars", "fingerprints", "memory")
NVML_PREFIX = "gpu_"  # the samples the summary leaves out (it keeps the memory readings)
SYNC_COLUMNS = ["rank", "step", "start_ns", "end_ns", "async_op"]  # of step_times' collectives


@dataclass(frozen=True)
class Pending:
    """The rows of a rank's steps that have no step row yet: what their times are made of."""

    phases: pa.Table  # PHASE_COLUMNS, aligned
    sync: pa.Table  # SYNC_COLUMNS of the synchronous collectives, aligned

    def add(self, other: Pending) -> Pending:
        return Pending(
            pa.concat_tables([self.phases, other.phases]),
            pa.concat_tables([self.sync, other.sync]),
        )

    def after(self, step: int) -> Pending:
        """The rows of the steps after ``step``."""
        return Pending(
            rows(self.phases, values(self.phases, "step") > step),
            rows(self.sync, values(self.sync, "step") > step),
        )


@dataclass(frozen=True)
class GrowingRank:
    """One rank as the dashboard keeps it: its summary, grown poll by poll."""

    summary: RankSummary
    pending: Pending  # the phases and synchronous collectives of steps with no row yet
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
        pending=_pending(rank, meta, tables).after(_last_step(summary.steps)),
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
    held = growing.pending.add(_pending(rank, meta, tables))
    computing, loading = phase_kinds(held.phases)
    compute, data = step_times(held.phases, computing, loading, held.sync, part.steps)
    steps = part.steps
    for name, ns in (("compute_ns", compute), ("data_ns", data)):
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
        # medians of the first summary: a poll's own would be rows beside them, not medians
        gpu_timing=growing.summary.gpu_timing,
    )
    pending = held.after(last)
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


def _pending(rank: int, meta: RankMeta, tables: dict[str, pa.Table]) -> Pending:
    """A poll's phases and synchronous collectives, aligned as the summary aligns them."""
    params = {rank: clock_params(meta)}
    spans = tables.get("spans", TABLES["spans"].empty)
    spans = spans.filter(pc.equal(spans.column("kind"), "phase"))
    collectives = tables.get("collectives", TABLES["collectives"].empty)
    collectives = collectives.filter(pc.equal(collectives.column("async_op"), False))
    return Pending(
        rank_table(TABLES["spans"], [(rank, spans)], params).select(PHASE_COLUMNS),
        rank_table(TABLES["collectives"], [(rank, collectives)], params).select(SYNC_COLUMNS),
    )
