"""Per-rank summarization: one rank's folder to small per-step tables, on rank 0's clock.

A pure function of a path, so it can run in a thread, a process pool or on a cluster worker;
everything after it works on these small tables only. They are Arrow tables: the trace's
format, sliced and concatenated without copies, and read by the checks through numpy
(dtprof.analysis.columns).

Where a rank timed its work on the GPU with CUDA events (``gpu_spans``), its compute phases and
collectives are the GPU's: on a GPU the host's times around them are launches, and a
collective's GPU start is where its data was ready on the device, its real arrival. Steps and
the data phase stay the host's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dtprof.analysis.columns import concat, is_null, rows, steps_between, values
from dtprof.analysis.gpu import GPU_PHASE, Kernels, kernel_figures
from dtprof.analysis.intervals import compute_before, merged_compute
from dtprof.analysis.matching import GroupMatrix, match
from dtprof.errors import DtprofError
from dtprof.trace.meta import ClockParams, InflightOp, RankMeta
from dtprof.trace.reader import (
    aligned,
    clock_params,
    inflight_table,
    rank_table,
    read_inflight,
    read_rank_meta,
    read_table,
)
from dtprof.trace.schema import TABLES

COMPUTE_PHASES = ("forward", "backward", "optimizer", GPU_PHASE)
NO_TABLE = pa.table({})  # a rank without GPU figures


def _no_table() -> pa.Table:
    return NO_TABLE


@dataclass(frozen=True)
class RankSummary:
    """What the checks need of one rank: Arrow tables, a rank column first."""

    rank: int
    meta: RankMeta
    steps: pa.Table  # step, start_ns, end_ns, step_ns, compute_ns, data_ns
    phases: pa.Table  # rank, step, name, start_ns, end_ns: the compute phases only
    actions: pa.Table  # rank, step, stage, microbatch, name, start_ns, end_ns (pipelining)
    collectives: pa.Table  # rank, step, group, seq, op, bytes, peer, start_ns, end_ns, label
    scalars: pa.Table  # rank, step, name, value
    fingerprints: pa.Table  # rank, step, tensor, sum, sumsq
    memory: pa.Table  # rank, step, metric, value: the per-step memory readings
    events: pa.Table  # rank, step, ts_ns, kind, message, detail
    inflight: pa.Table  # rank, step, group, seq, op, bytes, ..., start_ns (aligned)
    last_span: pa.Table  # rank, step, name, kind, end_ns: what the rank did last
    groups: pa.Table  # group, size: the process groups this rank used, with their sizes
    gpu: pa.Table = field(default_factory=_no_table)  # kernel_figures(): a row, or no columns
    gpu_timing: pa.Table = field(default_factory=_no_table)  # gpu_timing_rows(), or no columns
    device: pa.Table = field(default_factory=_no_table)  # rank, step, metric, value: clocks


Tables = Path | dict[str, pa.Table]  # a rank folder, or an importer's tables in memory


def _table(source: Tables, name: str) -> pa.Table:
    if isinstance(source, dict):
        return source.get(name, TABLES[name].empty)
    return read_table(source, TABLES[name])


TEXT_CODED = ("group", "op", "label")  # the collectives' repeated text: dictionary-encoded


def _rank_rows(
    folder: Tables,
    name: str,
    rank: int,
    params: dict[int, ClockParams],
    columns: Sequence[str] | None = None,
    where: tuple[str, list[str]] | None = None,
) -> pa.Table:
    """One table of this rank with its rank column, times aligned (only `columns`, if given,
    and only the rows whose column ``where[0]`` is one of ``where[1]``)."""
    table = _table(folder, name)
    if where is not None:
        table = table.filter(pc.is_in(table.column(where[0]), pa.array(where[1])))
    if columns is not None:
        table = table.select(list(columns))
    out = rank_table(TABLES[name], [(rank, table)], params)
    return out if columns is None else out.select(["rank", *columns])


def summarize_rank(folder: str | Path) -> RankSummary:
    """Read one ``rank=NNNNN`` folder and reduce it to per-step tables."""
    folder = Path(folder)
    return summarize_frames(read_rank_meta(folder), folder, read_inflight(folder))


KERNEL_COLUMNS = ("step", "category", "start_ns", "end_ns")  # what dtprof.analysis.gpu reads
ACTION_COLUMNS = ["rank", "step", "stage", "microbatch", "name", "start_ns", "end_ns"]
PHASE_COLUMNS = ["rank", "step", "name", "start_ns", "end_ns"]
COLLECTIVE_COLUMNS = tuple(
    c for c in TABLES["collectives"].column_names if c not in ("dtype", "async_op")
)
# the samples the checks read (memory growth): their metric, and of them these columns
MEMORY_METRICS = ("metric", ["rss_bytes", "cuda_allocated_bytes", "cuda_reserved_bytes"])
MEMORY_COLUMNS = ("step", "metric", "value")
# NVML's readings of the clocks, which the straggler's suggestion reads (dtprof.analysis.device)
DEVICE_METRICS = ("metric", ["gpu_sm_clock_mhz", "gpu_clock_reasons"])


def summarize_frames(meta: RankMeta, folder: Tables, inflight_ops: list[InflightOp]) -> RankSummary:
    """One rank's tables (read from its folder, or an importer's) reduced to per-step tables.

    With GPU kernels (imported traces) the union of compute kernels stands in for the compute
    phases, and the rank gets HTA-style GPU figures (dtprof.analysis.gpu).
    """
    rank = meta.rank
    params = {rank: clock_params(meta)}
    steps = _rank_rows(folder, "steps", rank, params)
    spans = _rank_rows(folder, "spans", rank, params)
    steps = steps.append_column(
        "step_ns", pc.subtract(steps.column("end_ns"), steps.column("start_ns"))
    )
    kernels = _kernels(folder, rank, params)
    gpu_phases, gpu = kernel_figures(rank, kernels, steps) if kernels else (None, NO_TABLE)
    kind = values(spans, "kind")
    # the compute phases of the kernels come after the spans' own phases (the spans' order):
    # thousands of rows (imported traces), joined to those only where there are any
    phases = spans.filter(kind == "phase").select(PHASE_COLUMNS)
    if gpu_phases is not None and not phases.num_rows:  # the kernels' alone: all compute
        phases = gpu_phases.select(PHASE_COLUMNS)
        computing, loading = np.ones(phases.num_rows, np.bool_), np.zeros(phases.num_rows, np.bool_)
    else:
        if gpu_phases is not None:
            phases = pa.concat_tables([phases, gpu_phases.select(PHASE_COLUMNS)])
        computing, loading = phase_kinds(phases)
    collectives = _rank_rows(folder, "collectives", rank, params, [*COLLECTIVE_COLUMNS, "async_op"])
    gpu_spans = _rank_rows(folder, "gpu_spans", rank, params)
    if gpu_spans.num_rows:
        phases = on_gpu(phases, gpu_spans, "name")
        collectives = on_gpu(collectives, gpu_spans, "op")
    compute, data = step_times(phases, computing, loading, collectives, steps)
    steps = steps.append_column("compute_ns", pa.array(compute))
    steps = steps.append_column("data_ns", pa.array(data))
    collectives = collectives.drop_columns(["async_op"])
    samples = {"samples": _table(folder, "samples")}  # read once: memory and clocks
    for col in TEXT_CODED:
        i = collectives.schema.get_field_index(col)
        collectives = collectives.set_column(i, col, pc.dictionary_encode(collectives.column(i)))
    return RankSummary(
        rank=rank,
        meta=meta,
        steps=steps,
        actions=spans.filter(kind == "pipeline").select(ACTION_COLUMNS),
        phases=rows(phases, computing),
        collectives=collectives,
        scalars=_rank_rows(folder, "scalars", rank, params),
        fingerprints=_rank_rows(folder, "fingerprints", rank, params),
        memory=_rank_rows(samples, "samples", rank, params, MEMORY_COLUMNS, MEMORY_METRICS),
        events=_rank_rows(folder, "events", rank, params),
        inflight=inflight_table([(rank, inflight_ops)], params),
        last_span=_last_span(spans, gpu_phases),
        groups=_groups(_table(folder, "groups")),
        gpu=gpu,
        gpu_timing=gpu_timing_rows(gpu_spans) if gpu_spans.num_rows else NO_TABLE,
        device=_rank_rows(samples, "samples", rank, params, MEMORY_COLUMNS, DEVICE_METRICS),
    )


def on_gpu(table: pa.Table, gpu_spans: pa.Table, name: str) -> pa.Table:
    """``table`` (phases or collectives) with the GPU's start and end for each row that
    ``gpu_spans`` timed: the row with the same host start and the same ``name`` (op)."""
    if not table.num_rows:
        return table
    host = values(gpu_spans, "start_ns", np.int64)
    order = np.argsort(host, kind="stable")
    host = host[order]
    start = values(table, "start_ns", np.int64)
    at = np.minimum(np.searchsorted(host, start), len(host) - 1)
    hit = host[at] == start
    taken = order[at]
    same = pc.equal(table.column(name), pc.take(gpu_spans.column("name"), taken))
    hit &= pc.fill_null(same, False).to_numpy(zero_copy_only=False)
    if not hit.any():
        return table
    mask = pa.array(hit)
    for column in ("start_ns", "end_ns"):
        gpu = pc.take(gpu_spans.column(f"gpu_{column}"), taken)
        i = table.schema.get_field_index(column)
        table = table.set_column(i, column, pc.if_else(mask, gpu, table.column(i)))
    return table


GPU_TIMING_COLUMNS = ["rank", "kind", "name", "count", "host_ms", "gpu_ms", "launch_ms"]


def gpu_timing_rows(gpu_spans: pa.Table) -> pa.Table:
    """Per kind and name of what a rank timed on the GPU: how many, and the medians of the
    host's duration (the launch), the GPU's, and the launch queue (GPU start - host start)."""
    kind, name = values(gpu_spans, "kind"), values(gpu_spans, "name")
    host = values(gpu_spans, "end_ns", np.float64) - values(gpu_spans, "start_ns", np.float64)
    gpu = values(gpu_spans, "gpu_end_ns", np.float64) - values(
        gpu_spans, "gpu_start_ns", np.float64
    )
    lag = values(gpu_spans, "gpu_start_ns", np.float64) - values(gpu_spans, "start_ns", np.float64)
    keys = sorted({(str(k), str(n)) for k, n in zip(kind.tolist(), name.tolist(), strict=True)})
    rank = int(values(gpu_spans, "rank")[0])
    out: dict[str, list] = {c: [] for c in GPU_TIMING_COLUMNS}
    for k, n in keys:
        mask = (kind == k) & (name == n)
        for column, value in zip(
            GPU_TIMING_COLUMNS,
            (rank, k, n, int(mask.sum()), *(np.median(x[mask]) / 1e6 for x in (host, gpu, lag))),
            strict=True,
        ):
            out[column].append(value)
    return pa.table(out)


def _kernels(folder: Tables, rank: int, params: dict[int, ClockParams]) -> Kernels | None:
    """The rank's kernels as arrays for dtprof.analysis.gpu, or None without any."""
    table = _table(folder, "kernels").select(list(KERNEL_COLUMNS))
    if not table.num_rows:
        return None
    moved = aligned(table, ["start_ns", "end_ns"], params[rank])
    step, category = table.column("step"), table.column("category")
    return Kernels(
        start_ns=moved.column("start_ns").to_numpy(),
        end_ns=moved.column("end_ns").to_numpy(),
        step=pc.fill_null(step, -1).to_numpy(),
        step_known=pc.is_valid(step).to_numpy(zero_copy_only=False),
        compute=_equal(category, "compute"),
        communication=_equal(category, "communication"),
    )


def _equal(column: pa.ChunkedArray, value: str) -> np.ndarray:
    """Mask of the rows equal to value (null: False)."""
    equal = pc.equal(column, value)
    if equal.null_count:
        equal = pc.fill_null(equal, False)
    return equal.to_numpy(zero_copy_only=False)


LAST_SPAN_COLUMNS = ["rank", "step", "name", "kind", "end_ns"]


def _last_span(spans: pa.Table, gpu_phases: pa.Table | None) -> pa.Table:
    """The span that ended last, of the spans and then the kernels' compute phases (the later
    of equals): the last of those that never ended, if any. The phases are disjoint and in
    order, so their last ends last, and only it competes. Picked by position, not by sorting
    and concatenating tables (thousands of rows)."""
    spans = spans.select(LAST_SPAN_COLUMNS)
    never = np.flatnonzero(is_null(spans, "end_ns"))
    if len(never):
        return spans.slice(int(never[-1]), 1)
    end = values(spans, "end_ns")
    if gpu_phases is not None and gpu_phases.num_rows:
        phase_end = gpu_phases.column("end_ns")[-1].as_py()
        if not len(end) or phase_end >= end.max():
            return gpu_phases.select(LAST_SPAN_COLUMNS).slice(gpu_phases.num_rows - 1, 1)
    last = len(end) - 1 - int(np.argmax(end[::-1])) if len(end) else 0
    return spans.slice(last, 1)


def phase_kinds(phases: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """Masks of the compute phases and of the data phases among a rank's phase rows."""
    name = phases.column("name")
    computing = pc.is_in(name, pa.array(COMPUTE_PHASES)).to_numpy(zero_copy_only=False)
    loading = pc.equal(name, "data").to_numpy(zero_copy_only=False)
    return np.asarray(computing, bool), np.asarray(loading, bool)


def step_times(
    phases: pa.Table,
    computing: np.ndarray,
    loading: np.ndarray,
    collectives: pa.Table,
    steps: pa.Table,
) -> tuple[np.ndarray, np.ndarray]:
    """One rank's compute and data ns per step (the steps' rows; NaN: none of that kind):
    compute is its compute phases less the time it sat blocked in synchronous collectives
    inside them (``collectives`` with their ``async_op``)."""
    blocked = _blocked(rows(phases, computing), collectives, steps)
    return _per_step(phases, steps, computing) - blocked, _per_step(phases, steps, loading)


def _per_step(phases: pa.Table, steps: pa.Table, mask: np.ndarray) -> np.ndarray:
    """Each step's total ns in the phases of the mask; NaN for a step with none of them (or
    with one that never ended)."""
    # the difference in Arrow: exact integers, null where a phase never ended
    length = pc.subtract(phases.column("end_ns"), phases.column("start_ns"))
    ns = np.asarray(length.to_numpy(), np.float64)[mask]
    total, seen = _sum_by_step(values(phases, "step")[mask], ns, steps)
    return np.where(seen, total, np.nan)


def _sum_by_step(
    step: np.ndarray, ns: np.ndarray, steps: pa.Table
) -> tuple[np.ndarray, np.ndarray]:
    """Per step (the steps' rows), the sum of ``ns`` over the rows of that ``step``, and
    whether it had any; rows of a step not in ``steps`` (or of none) are left out."""
    keys, inverse = np.unique(values(steps, "step"), return_inverse=True)
    at = np.searchsorted(keys, step)
    known = at < len(keys)
    known[known] = keys[at[known]] == step[known]
    total = np.bincount(at[known], weights=ns[known], minlength=len(keys))
    seen = np.bincount(at[known], minlength=len(keys)) > 0
    return total[inverse.ravel()], seen[inverse.ravel()]


def _blocked(compute: pa.Table, collectives: pa.Table, steps: pa.Table) -> np.ndarray:
    """Per step (the steps' rows), the ns of compute phases this rank spent blocked in
    synchronous collectives: a thread that waits in an all-reduce computes nothing, though the
    call came from inside a forward (tensor parallelism's all-reduces)."""
    sync = pc.equal(collectives.column("async_op"), False)
    sync = pc.and_(sync, pc.is_valid(collectives.column("end_ns")))
    blocked = np.zeros(steps.num_rows)
    if not compute.num_rows or not pc.any(sync).as_py():
        return blocked
    calls = collectives.filter(sync)
    merged = merged_compute(compute).get(int(values(calls, "rank")[0]))
    if merged is None:
        return blocked
    start, end = values(calls, "start_ns", np.int64), values(calls, "end_ns", np.int64)
    under = compute_before(merged, end) - compute_before(merged, np.minimum(start, end))
    return _sum_by_step(values(calls, "step"), under.astype(np.float64), steps)[0]


def _groups(table: pa.Table) -> pa.Table:
    return pa.table(
        {
            "group": table.column("group"),
            "size": pc.list_value_length(table.column("ranks")).cast(pa.int32()),
        }
    )


@dataclass(frozen=True)
class RunSummary:
    """Every rank's summary, concatenated: the input of the cross-rank checks."""

    ranks: list[int]
    meta: dict[int, RankMeta]
    steps: pa.Table
    phases: pa.Table
    actions: pa.Table
    collectives: pa.Table
    scalars: pa.Table
    fingerprints: pa.Table
    memory: pa.Table
    events: pa.Table
    inflight: pa.Table
    last_span: pa.Table
    groups: pa.Table
    gpu: pa.Table = field(default_factory=_no_table)  # per rank: gpu.kernel_figures()
    gpu_timing: pa.Table = field(default_factory=_no_table)  # per rank: gpu_timing_rows()
    device: pa.Table = field(default_factory=_no_table)  # rank, step, metric, value: clocks
    without_trace: list[int] = field(default_factory=list)  # ranks of the job that wrote none

    @property
    def world_size(self) -> int:
        return max(m.world_size for m in self.meta.values())

    @cached_property
    def matched(self) -> list[GroupMatrix]:
        """The collectives matched across ranks, per process group (made once, on first use)."""
        return match(self.collectives, self.groups, self.world_size)

    def steps_between(self, first: int | None, last: int | None) -> RunSummary:
        """The per-step tables cut to first <= step < last (None: open on that side)."""

        def keep(t: pa.Table) -> pa.Table:
            return steps_between(t, first, last)

        return replace(
            self,
            steps=keep(self.steps),
            phases=keep(self.phases),
            actions=keep(self.actions),
            collectives=keep(self.collectives),
            scalars=keep(self.scalars),
            fingerprints=keep(self.fingerprints),
            memory=keep(self.memory),
            events=keep(self.events),
            device=keep(self.device),
        )


def ranks_without_trace(run: RunSummary, ranks: Sequence[int] | None = None) -> list[int]:
    """The ranks of the job (of ``ranks``, when given) that wrote no trace at all.

    Every rank creates its folder when dtprof.profile() starts, so such a rank never got there
    or was killed within its first second. None for imported traces: profilers and Flight
    Recorder dumps are often taken on a few ranks only.
    """
    if any(meta.imported for meta in run.meta.values()):
        return []
    wanted = set(range(run.world_size))
    if ranks is not None:
        wanted &= set(ranks)
    return sorted(wanted - set(run.ranks))


def release_memory() -> None:
    """Give the C heap's freed pages back to the system. glibc keeps them otherwise: the
    per-rank summaries that came back from Dask's workers (or were made in this process),
    dropped once combined, stayed resident (2.6 GiB of them at 1024 ranks x 1000 steps). Those
    from a local pool are mapped from its workers' memory files, and go when dropped."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to give back
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def summarize_ranks(folders: Sequence[str | Path]) -> RunSummary:
    """summarize_rank on a few rank folders, combined: one task for a worker process, so that
    the concatenation happens in the workers and fewer, larger parts travel back."""
    return combine([summarize_rank(f) for f in folders])


def combine(summaries: Sequence[RankSummary | RunSummary]) -> RunSummary:
    """Concatenate per-rank summaries, or runs already combined from runs of ranks, in rank
    order."""

    def ranks_of(s: RankSummary | RunSummary) -> list[int]:
        return [s.rank] if isinstance(s, RankSummary) else s.ranks

    summaries = sorted(summaries, key=lambda s: min(ranks_of(s), default=-1))
    metas = {
        r: m
        for s in summaries
        for r, m in ({s.rank: s.meta} if isinstance(s, RankSummary) else s.meta).items()
    }
    sizes = {m.world_size for m in metas.values()}
    if len(sizes) > 1:
        raise DtprofError(f"ranks disagree on the world size ({sorted(sizes)})")

    def cat(name: str) -> pa.Table:
        return concat([getattr(s, name) for s in summaries])

    groups = cat("groups")
    if groups.num_rows:  # each group once, as it came first
        _, first = np.unique(values(groups, "group"), return_index=True)
        groups = groups.take(np.sort(first))
    return RunSummary(
        ranks=[r for s in summaries for r in ranks_of(s)],
        meta=metas,
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
        groups=groups,
        gpu=cat("gpu"),
        gpu_timing=cat("gpu_timing"),
        device=cat("device"),
    )
