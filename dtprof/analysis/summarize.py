"""Per-rank summarization: one rank's folder to small per-step tables, on rank 0's clock.

A pure function of a path, so it can run in a thread, a process pool or on a cluster worker;
everything after it works on these small tables only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from dtprof.analysis.gpu import GPU_PHASE, Kernels, kernel_figures
from dtprof.analysis.matching import GroupMatrix, match
from dtprof.beside import run_beside
from dtprof.errors import DtprofError
from dtprof.trace.reader import (
    ClockParams,
    clock_params,
    inflight_frame,
    read_inflight,
    read_rank_meta,
    read_table,
    shifted,
    table_frame,
)
from dtprof.trace.schema import TABLES

COMPUTE_PHASES = ("forward", "backward", "optimizer", GPU_PHASE)
T = TypeVar("T")
R = TypeVar("R")


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
    groups: pd.DataFrame  # group, size: the process groups this rank used, with their sizes
    gpu: pd.DataFrame = field(default_factory=pd.DataFrame)  # gpu.kernel_figures(): one row or none


Tables = Path | dict[str, pa.Table]  # a rank folder, or an importer's tables in memory


def _table(source: Tables, name: str) -> pa.Table:
    if isinstance(source, dict):
        return source.get(name, TABLES[name].empty)
    return read_table(source, TABLES[name])


def _frame(
    folder: Tables,
    name: str,
    rank: int,
    params: dict[int, ClockParams],
    categories: tuple[str, ...] = (),
    columns: tuple[str, ...] | None = None,
    where: tuple[str, list[str]] | None = None,
) -> pd.DataFrame:
    """One table of this rank (only `columns`, if given, and only the rows whose column
    ``where[0]`` is one of ``where[1]``); repeated strings in `categories` become pandas
    categories."""
    table = _table(folder, name)
    if where is not None:
        table = table.filter(pc.is_in(table.column(where[0]), pa.array(where[1])))
    if columns is not None:
        table = table.select(list(columns))
    for col in categories:
        i = table.schema.get_field_index(col)
        table = table.set_column(i, col, pc.dictionary_encode(table.column(i)))
    frame = table_frame(TABLES[name], [(rank, table)], params)
    wanted = ["rank", *columns] if columns is not None else None
    return frame if wanted is None or list(frame.columns) == wanted else frame[wanted]


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
BESIDE_FROM_BYTES = 1 << 20  # of the ranks' table files: below that, one process is quicker


def summarize_folders(
    folders: Sequence[Path], each: Callable[[], None] = lambda: None
) -> list[RankSummary]:
    """summarize_rank on each rank folder, in order, calling ``each()`` here after each: in this
    process and in worker processes beside it, unless the folders hold little (per_folder)."""
    return per_folder(summarize_rank, list(folders), list(folders), each)


def per_folder(
    fn: Callable[[T], R],
    items: list[T],
    folders: list[Path],
    each: Callable[[], None] = lambda: None,
) -> list[R]:
    """``fn`` on each item (the work of rank folder ``folders[i]``), in order, calling
    ``each()`` here after each: in this process and in worker processes beside it
    (dtprof.beside), or here alone when the folders hold little.

    Summarizing holds the GIL, so threads would take turns: on a 2-CPU machine they were
    slower than one thread (8 ranks x 500 steps: 1.1 s in threads, 0.8 s beside)."""
    results: dict[int, R] = {}

    def done(i: int, result: R) -> None:
        results[i] = result
        each()

    if len(items) < 2 or sum(map(_table_bytes, folders)) < BESIDE_FROM_BYTES:
        for i, item in enumerate(items):
            done(i, fn(item))
    else:
        run_beside(fn, items, done, name=lambda i: str(folders[i]))
    return [results[i] for i in range(len(items))]


def _table_bytes(folder: Path) -> int:
    """The bytes of a rank folder's table files (a live job may seal or remove some meanwhile)."""
    total = 0
    for f in Path(folder).glob("*/*"):
        with contextlib.suppress(OSError):
            total += f.stat().st_size
    return total


def summarize_frames(
    meta: dict[str, Any], folder: Tables, inflight_rows: list[dict[str, Any]]
) -> RankSummary:
    """One rank's tables (read from its folder, or an importer's) reduced to per-step tables.

    With GPU kernels (imported traces) the union of compute kernels stands in for the compute
    phases, and the rank gets HTA-style GPU figures (dtprof.analysis.gpu).
    """
    rank = int(meta["rank"])
    params = {rank: clock_params(meta)}
    steps = _frame(folder, "steps", rank, params)
    spans = _frame(folder, "spans", rank, params)
    steps["step_ns"] = steps["end_ns"] - steps["start_ns"]
    kernels = _kernels(folder, rank, params)
    gpu_phases, gpu = kernel_figures(rank, kernels, steps) if kernels else (None, None)
    kind = spans["kind"].to_numpy()
    # the compute phases of the kernels come after the spans' own phases (the spans' order):
    # thousands of rows (imported traces), joined to those only where there are any
    phases = spans[kind == "phase"]
    if gpu_phases is not None and phases.empty:  # the kernels' alone: every one a compute phase
        phases = gpu_phases
        computing, loading = np.ones(len(phases), np.bool_), np.zeros(len(phases), np.bool_)
    else:
        if gpu_phases is not None:
            phases = pd.concat([phases, gpu_phases], ignore_index=True)
        computing = phases["name"].isin(COMPUTE_PHASES).to_numpy(bool)
        loading = phases["name"].isin(("data",)).to_numpy(bool)
    steps["compute_ns"] = _per_step(phases, steps, computing)
    steps["data_ns"] = _per_step(phases, steps, loading)
    return RankSummary(
        rank=rank,
        meta=meta,
        steps=steps,
        actions=spans.loc[kind == "pipeline", ACTION_COLUMNS].reset_index(drop=True),
        phases=phases.loc[computing, PHASE_COLUMNS].reset_index(drop=True),
        collectives=_frame(
            folder, "collectives", rank, params, ("group", "op", "label"), COLLECTIVE_COLUMNS
        ),
        scalars=_frame(folder, "scalars", rank, params),
        fingerprints=_frame(folder, "fingerprints", rank, params),
        memory=_frame(folder, "samples", rank, params, (), MEMORY_COLUMNS, MEMORY_METRICS),
        events=_frame(folder, "events", rank, params),
        inflight=inflight_frame([(rank, inflight_rows)], params),
        last_span=_last_span(spans, gpu_phases),
        groups=_groups(_table(folder, "groups")),
        gpu=gpu if gpu is not None else pd.DataFrame(),
    )


def _kernels(folder: Tables, rank: int, params: dict[int, ClockParams]) -> Kernels | None:
    """The rank's kernels as arrays for dtprof.analysis.gpu, or None without any. Read from
    Arrow: a trace's thousands of kernels made a pandas frame for nothing but its arrays (a
    quarter of summarizing an imported rank)."""
    table = _table(folder, "kernels").select(list(KERNEL_COLUMNS))
    if not table.num_rows:
        return None
    times = ["start_ns", "end_ns"]
    if params[rank][3] or any(table.column(c).null_count for c in times):  # as every table
        frame = table_frame(TABLES["kernels"], [(rank, table)], params)
        start_ns, end_ns = (frame[c].to_numpy(np.int64) for c in times)
    else:
        moved = shifted(table, times, params[rank])
        start_ns, end_ns = (moved.column(c).to_numpy() for c in times)
    step, category = table.column("step"), table.column("category")
    return Kernels(
        start_ns=start_ns,
        end_ns=end_ns,
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


def _last_span(spans: pd.DataFrame, gpu_phases: pd.DataFrame | None) -> pd.DataFrame:
    """The span that ended last, of the spans and then the kernels' compute phases (the later
    of equals): the last of those that never ended, if any. The phases are disjoint and in
    order, so their last ends last, and only it competes. Picked by position, not by sorting
    and concatenating frames (thousands of rows, a millisecond a rank)."""
    never = np.flatnonzero(spans["end_ns"].isna().to_numpy())
    if len(never):
        return spans.iloc[never[-1:]][LAST_SPAN_COLUMNS]
    end = spans["end_ns"].to_numpy(np.int64)
    if gpu_phases is not None and len(gpu_phases):
        phase_end = int(gpu_phases["end_ns"].iloc[-1])
        if not len(end) or phase_end >= end.max():
            return gpu_phases.iloc[-1:][LAST_SPAN_COLUMNS]
    last = len(end) - 1 - int(np.argmax(end[::-1])) if len(end) else 0
    return spans.iloc[last : last + 1][LAST_SPAN_COLUMNS]


def _per_step(phases: pd.DataFrame, steps: pd.DataFrame, mask: np.ndarray) -> np.ndarray:
    """Each step's total ns in the phases of the mask; NaN for a step with none of them."""
    step = phases["step"].array[mask].to_numpy()  # the columns' own arrays: no filtered frame
    keys, inverse = np.unique(steps["step"].to_numpy(), return_inverse=True)
    at = np.searchsorted(keys, step)
    known = at < len(keys)
    known[known] = keys[at[known]] == step[known]
    ns = (phases["end_ns"].array[mask] - phases["start_ns"].array[mask]).to_numpy(np.float64)
    ns = ns[known]
    total = np.bincount(at[known], weights=ns, minlength=len(keys))
    seen = np.bincount(at[known], minlength=len(keys)) > 0
    return np.where(seen, total, np.nan)[inverse]


def _groups(table: pa.Table) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "group": table.column("group").to_numpy(zero_copy_only=False).astype(object),
            "size": pc.list_value_length(table.column("ranks")).to_numpy(zero_copy_only=False),
        }
    )


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
    groups: pd.DataFrame
    gpu: pd.DataFrame = field(default_factory=pd.DataFrame)  # per rank: gpu.kernel_figures()
    without_trace: list[int] = field(default_factory=list)  # ranks of the job that wrote none

    @property
    def world_size(self) -> int:
        return max(int(m.get("world_size", 0)) for m in self.meta.values())

    @cached_property
    def matched(self) -> list[GroupMatrix]:
        """The collectives matched across ranks, per process group (made once, on first use)."""
        return match(self.collectives, self.groups, self.world_size)

    def steps_between(self, first: int | None, last: int | None) -> RunSummary:
        """The per-step tables cut to first <= step < last (None: open on that side)."""

        def keep(df: pd.DataFrame) -> pd.DataFrame:
            if df.empty or "step" not in df:
                return df
            mask = np.ones(len(df), bool)
            if first is not None:
                mask &= (df["step"] >= first).to_numpy()
            if last is not None:
                mask &= (df["step"] < last).to_numpy()
            return df if mask.all() else df[mask]

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
        )


def ranks_without_trace(run: RunSummary, ranks: Sequence[int] | None = None) -> list[int]:
    """The ranks of the job (of ``ranks``, when given) that wrote no trace at all.

    Every rank creates its folder when dtprof.profile() starts, so such a rank never got there
    or was killed within its first second. None for imported traces: profilers and Flight
    Recorder dumps are often taken on a few ranks only.
    """
    if any("imported" in meta for meta in run.meta.values()):
        return []
    wanted = set(range(run.world_size))
    if ranks is not None:
        wanted &= set(ranks)
    return sorted(wanted - set(run.ranks))


def _all_empty_alike(frames: list[pd.DataFrame]) -> bool:
    """Whether the frames are all empty, with the same columns of the same dtypes (none of them
    categorical, whose categories a concatenation would merge): their concatenation is any of
    them, got without touching a column."""
    if not all(f.empty for f in frames):
        return False
    first = frames[0]
    dtypes = list(first.dtypes)  # compared as lists: Series.equals costs twice the Series
    return not any(isinstance(t, pd.CategoricalDtype) for t in dtypes) and all(
        f.columns.equals(first.columns) and list(f.dtypes) == dtypes for f in frames
    )


def _concat_column(parts: list[pd.Series]) -> Any:
    """One column of every rank's frame, concatenated at the array level where it can be."""
    dtype = parts[0].dtype
    if any(p.dtype != dtype for p in parts):
        return pd.concat(parts, ignore_index=True)
    if isinstance(dtype, pd.CategoricalDtype):
        return _concat_categorical(parts)
    if isinstance(dtype, np.dtype):
        return np.concatenate([p.to_numpy() for p in parts])
    if isinstance(dtype, pd.api.extensions.ExtensionDtype):  # str, Int32 and the like
        arrays = [p.array for p in parts]
        return type(arrays[0])._concat_same_type(arrays)
    return pd.concat(parts, ignore_index=True)


def _concat_categorical(parts: list[pd.Series]) -> pd.Categorical:
    """One categorical from per-rank ones whose categories differ: codes remapped, no strings."""
    names: dict[Any, int] = {}
    codes = []
    for part in parts:
        cats = part.cat.categories
        lookup = np.array([names.setdefault(c, len(names)) for c in cats] + [-1], np.int32)
        codes.append(lookup[part.cat.codes.to_numpy()])  # code -1 (missing) picks the -1 slot
    return pd.Categorical.from_codes(np.concatenate(codes), categories=list(names))


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
    sizes = {int(m.get("world_size", 0)) for m in metas.values()}
    if len(sizes) > 1:
        raise DtprofError(f"ranks disagree on the world size ({sorted(sizes)})")

    def cat(name: str) -> pd.DataFrame:
        frames = [getattr(s, name) for s in summaries]
        if not frames:
            return pd.DataFrame()
        if _all_empty_alike(frames):  # e.g. the scalars and events of profiler traces
            return frames[0].copy()
        # column by column, on the arrays: one column's copy at a time, no per-frame overhead
        columns = {col: _concat_column([f[col] for f in frames]) for col in frames[0]}
        return pd.DataFrame(columns, copy=False)  # no consolidating copy into 2-D blocks

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
        groups=cat("groups").drop_duplicates("group", ignore_index=True),
        gpu=cat("gpu"),
    )
