"""The trace contract: every table, column, unit and the format version, declared once.

A trace is one directory per run with one hive-style sub-directory per rank::

    trace/
      rank=00000/
        meta.json                  rank metadata (JSON, rewritten atomically)
        inflight.json              collectives in flight at the last flush
        steps/part-000000.parquet  sealed segments, renamed into place
        steps/_live-000001.msgpack the open segment: frames of columns, appended (live.py)
        spans/ collectives/ ...

On disk, times are the rank's own monotonic clock in nanoseconds; ``meta.json`` holds what
turns them into one clock aligned to rank 0 (see ``docs/trace-format.md``).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from dtprof.trace.layout import RANK_DIR_PREFIX as RANK_DIR_PREFIX
from dtprof.trace.layout import SCHEMA_VERSION as SCHEMA_VERSION

META_FILE = "meta.json"
INFLIGHT_FILE = "inflight.json"
SEALED_PREFIX = "part-"
LIVE_PREFIX = "_live-"


def rank_dir_name(rank: int) -> str:
    """The hive-style folder name of one rank, e.g. ``rank=00003``."""
    return f"{RANK_DIR_PREFIX}{rank:05d}"


@dataclass(frozen=True)
class Column:
    """One column: name (with its unit), Arrow type and a one-line meaning."""

    name: str
    type: pa.DataType
    doc: str
    time: bool = False  # a monotonic timestamp that the loader aligns to rank 0


@dataclass(frozen=True)
class Table:
    """One table of a rank's trace: rows are tuples in column order."""

    name: str
    doc: str
    columns: tuple[Column, ...]

    @functools.cached_property
    def schema(self) -> pa.Schema:
        """Made once (every read of a segment or part asks for it)."""
        return pa.schema([pa.field(c.name, c.type) for c in self.columns])

    @functools.cached_property
    def empty(self) -> pa.Table:
        """This table with no rows: made once and shared (Arrow tables never change, and most
        tables of a rank are empty)."""
        return self.schema.empty_table()

    @property
    def column_names(self) -> list[str]:
        return [c.name for c in self.columns]

    @property
    def time_columns(self) -> list[str]:
        return [c.name for c in self.columns if c.time]

    def write_parquet(
        self, data: pa.Table, path: str | os.PathLike[str], compression: str = "zstd"
    ) -> None:
        """One sealed segment of this table: zstd (or ``compression``); dictionary pages for the
        string columns only (ids and times are mostly distinct, so a dictionary tried on them
        only costs), times delta-encoded (measured in docs/kineto.md)."""
        strings = [c.name for c in self.columns if pa.types.is_string(c.type)]
        pq.write_table(
            data,
            path,
            compression=compression,
            use_dictionary=strings,
            column_encoding=dict.fromkeys(self.time_columns, "DELTA_BINARY_PACKED"),
        )


def _ns(name: str, doc: str) -> Column:
    return Column(name, pa.int64(), doc, time=True)


_STEP = Column("step", pa.int64(), "training step, counted from 0 at profile start")

STEPS = Table(
    "steps",
    "One row per completed training step (each call of prof.step()).",
    (
        _STEP,
        _ns("start_ns", "when the step began: the previous prof.step() or profile start"),
        _ns("end_ns", "when prof.step() was called"),
    ),
)

SPANS = Table(
    "spans",
    "Timed intervals inside steps: phases, user regions and pipeline actions.",
    (
        _STEP,
        Column(
            "name",
            pa.string(),
            "forward, backward, optimizer, data, a region name, "
            "or a pipeline action (forward, backward, backward_input, backward_weight)",
        ),
        Column("kind", pa.string(), "phase, region or pipeline"),
        _ns("start_ns", "when the interval began"),
        _ns("end_ns", "when it ended (also when its block raised)"),
        Column("depth", pa.int16(), "nesting depth of user regions, 0 for the outermost"),
        Column("stage", pa.int32(), "pipeline stage index (pipeline actions only)"),
        Column("microbatch", pa.int32(), "pipeline microbatch id (pipeline actions only)"),
    ),
)

COLLECTIVES = Table(
    "collectives",
    "Every collective and point-to-point operation, written when it completed.",
    (
        _STEP,
        Column("group", pa.string(), "process group name, equal on every member rank"),
        Column(
            "seq",
            pa.int64(),
            "per-group sequence number (per sender-receiver pair for "
            "p2p), equal on every rank for the same operation",
        ),
        Column("op", pa.string(), "all_reduce, all_gather_into_tensor, send, irecv, ..."),
        Column(
            "bytes",
            pa.int64(),
            "bytes of this rank's data argument: the input of reductions, gathers and sends, "
            "the buffer of broadcast, recv, irecv and scatter",
        ),
        Column("dtype", pa.string(), "element type of the first tensor, e.g. float32"),
        Column("peer", pa.int32(), "global rank of the other side (p2p only)"),
        _ns("start_ns", "when this rank entered the operation"),
        _ns(
            "end_ns",
            "when it completed on this rank (async: its future's completion; "
            "gloo p2p: when wait() returned)",
        ),
        Column("async_op", pa.bool_(), "issued with async_op=True or as isend/irecv"),
        Column("label", pa.string(), "where it came from, e.g. ddp.bucket3"),
    ),
)

SCALARS = Table(
    "scalars",
    "Named values from prof.log(), e.g. the loss.",
    (
        _STEP,
        Column("name", pa.string(), "the keyword given to prof.log()"),
        Column("value", pa.float64(), "its value (NaN and Inf kept as they are)"),
    ),
)

SAMPLES = Table(
    "samples",
    "Memory at steps' ends and GPU samples from NVML.",
    (
        _STEP,
        _ns("ts_ns", "when the value was read"),
        Column("metric", pa.string(), "e.g. rss_bytes, cuda_allocated_bytes, gpu_util_pct"),
        Column("value", pa.float64(), "the value, in the unit the metric name ends with"),
    ),
)

FINGERPRINTS = Table(
    "fingerprints",
    "Parameter fingerprints: float64 sum and sum of squares per parameter tensor.",
    (
        _STEP,
        Column("tensor", pa.string(), "parameter name as model.named_parameters() gives it"),
        Column("sum", pa.float64(), "sum of all elements, accumulated in float64"),
        Column("sumsq", pa.float64(), "sum of squares of all elements, in float64"),
    ),
)

GROUPS = Table(
    "groups",
    "Process groups, one row when a group is first used.",
    (
        Column("group", pa.string(), "process group name as in collectives.group"),
        Column("backend", pa.string(), "gloo, nccl, ..."),
        Column("ranks", pa.list_(pa.int32()), "global ranks of its members, in group order"),
    ),
)

EVENTS = Table(
    "events",
    "Things that happened to the recording: hangs, disabled hooks, warnings.",
    (
        _STEP,
        _ns("ts_ns", "when it happened"),
        Column("kind", pa.string(), "hang, hook-error or exception"),
        Column("message", pa.string(), "one line for a person"),
        Column("detail", pa.string(), "JSON with the particulars (a hang's Python stacks, ...)"),
    ),
)

KERNELS = Table(
    "kernels",
    "GPU activity by device and stream: kernels, memcpy, memset (imported profiler traces).",
    (
        Column(
            "step",
            pa.int64(),
            "the step its CPU launch happened in (-1 before the first); null: launch not traced",
        ),
        Column("device", pa.int32(), "GPU index"),
        Column("stream", pa.int64(), "CUDA stream id"),
        Column("name", pa.string(), "kernel name, or Memcpy/Memset with its kind"),
        Column("category", pa.string(), "compute, communication, memory or other"),
        _ns("start_ns", "when it began on the GPU"),
        _ns("end_ns", "when it ended on the GPU"),
        Column("correlation", pa.int64(), "id linking it to its CUDA launch, -1 if none"),
        Column("bytes", pa.int64(), "bytes copied or set (memcpy, memset only)"),
    ),
)

GPU_SPANS = Table(
    "gpu_spans",
    "GPU execution of phases, user regions and collectives, from CUDA events (CUDA jobs only).",
    (
        _STEP,
        Column("name", pa.string(), "forward, backward, optimizer, a region name, or the op"),
        Column("kind", pa.string(), "phase, region or collective"),
        Column("group", pa.string(), "process group name (collectives only)"),
        Column("seq", pa.int64(), "per-group sequence number as in collectives (collectives only)"),
        _ns("start_ns", "when the host launched its start (the spans/collectives row's start)"),
        _ns("end_ns", "when the host launched its end"),
        _ns("gpu_start_ns", "when the GPU reached its start on its stream"),
        _ns("gpu_end_ns", "when the GPU reached its end"),
    ),
)

# A table added at the end is read as empty from older traces, and older readers skip its
# folder, so adding one keeps SCHEMA_VERSION (see docs/trace-format.md, Schema version).
TABLES: dict[str, Table] = {
    t.name: t
    for t in (
        STEPS,
        SPANS,
        COLLECTIVES,
        SCALARS,
        SAMPLES,
        FINGERPRINTS,
        GROUPS,
        EVENTS,
        KERNELS,
        GPU_SPANS,
    )
}
