"""Read one PyTorch profiler (Kineto) trace file into columns; no per-event dicts are built.

The file is decoded a chunk of events at a time into typed records that hold only what the
importer maps (:mod:`dtprof.trace.kineto.events`). From each chunk, the groups of events the
importer needs (GPU activity, CUDA launches, CPU operators and annotations, ``[memory]``
instants) are pulled out column by column into numpy / Arrow arrays, and the chunk's records
are dropped before the next is decoded; the file's tables are built from the columns
(:mod:`dtprof.trace.kineto.mapping`).

Times: ``ts`` and ``dur`` are microseconds (integers in older traces, floats in newer ones).
With ``baseTimeNanoseconds`` in the file, ``ts`` is relative to it; without, ``ts`` is absolute
(Unix epoch). Both become int64 nanoseconds exactly as written (``round(ts * 1000)``, split into
whole and fractional microseconds so that absolute stamps keep their nanoseconds).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from operator import attrgetter
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dtprof.errors import DtprofError
from dtprof.trace.kineto.events import (
    Args,
    Event,
    Unstreamable,
    chunks,
    decode,
    owned,
    stream,
)

# device activity: CUDA's, older traces' (capitalized), MTIA's (an accelerator, not CUDA)
MTIA_DEVICE = "mtia_ccp_events"
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset", MTIA_DEVICE)
LAUNCH_CATS = ("cuda_runtime", "cuda_driver", "Runtime", "Driver", "mtia_runtime")
STEP_RE = r"^ProfilerStep\s*#\s*(?P<number>\d+)"
COMM_ANNOTATION_RE = r"^(nccl|gloo|mpi|ucc|xccl):"
COLS_FIELDS = ("name", "ts_ns", "end_ns", "pid", "tid")
_PH, _CAT, _NAME = attrgetter("ph"), attrgetter("cat"), attrgetter("name")
_TS, _DUR, _PID, _TID, _ARGS = (attrgetter(k) for k in ("ts", "dur", "pid", "tid", "args"))


def ns_from_us(values: list[Any] | np.ndarray) -> np.ndarray:
    """Microsecond stamps (int, float or numeric string; None as 0) to int64 ns, to the ns."""
    if not isinstance(values, np.ndarray):
        values = [0 if v is None else v for v in values]
    us = np.asarray(values, dtype=np.float64)
    if len(us) and not np.abs(us).max() < 9.2e15:  # past int64 ns (year 2261), or NaN
        raise ValueError(f"a timestamp out of range ({us[~(np.abs(us) < 9.2e15)][0]} µs)")
    whole = np.floor(us)
    return whole.astype(np.int64) * 1000 + np.rint((us - whole) * 1000).astype(np.int64)


def ends_ns(ts_ns: np.ndarray, dur_us: list[Any] | np.ndarray) -> np.ndarray:
    """Each event's end: its start plus its duration (µs, as ns_from_us reads them), none
    below 0."""
    return ts_ns + np.maximum(ns_from_us(dur_us), 0)


def _ints(values: list[Any], default: int = -1) -> np.ndarray:
    """Integers from JSON values that may be missing or strings; what is not a number -> default."""
    out = np.full(len(values), default, dtype=np.int64)
    for i, v in enumerate(values):  # only for pid/tid/stream, which are almost always ints
        if type(v) is int:
            out[i] = v
        elif isinstance(v, str) and v.strip().lstrip("-").isdigit():
            out[i] = int(v)
    return out


def _fast_ints(values: list[Any], default: int = -1) -> np.ndarray:
    try:
        return np.asarray([default if v is None else v for v in values], dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        return _ints(values, default)


def _arg(args: list[Any], attr: str) -> list[Any]:
    """One args key of each event; None where the event lacks it (or its args are no object)."""
    try:
        return list(map(attrgetter(attr), args))
    except AttributeError:  # some event's args are not an object
        return [getattr(a, attr) if isinstance(a, Args) else None for a in args]


@dataclass
class Cols:
    """One group of events as columns (all the same length)."""

    name: pa.Array
    ts_ns: np.ndarray
    end_ns: np.ndarray
    pid: np.ndarray
    tid: np.ndarray
    args: list[Args | None]  # CPU group only: collectives' args (None: no args object)

    def __len__(self) -> int:
        return len(self.ts_ns)


@dataclass
class KinetoFile:
    """What the importer needs of one trace file, columnar."""

    path: Path
    header: dict[str, Any]  # the top-level keys of HEADER_KEYS the file has
    gpu: Cols  # kernels, memcpy, memset; args reduced to the columns below
    gpu_cat: pa.Array
    gpu_stream: np.ndarray  # the event's stream; as read, -1 where it names none
    gpu_correlation: np.ndarray
    gpu_bytes: np.ndarray
    launch_ts_ns: np.ndarray  # CUDA runtime / driver calls with a correlation id
    launch_tid: np.ndarray
    launch_correlation: np.ndarray
    cpu: Cols  # ProfilerStep#N, record_param_comms, nccl:/gloo: annotations, other annotations
    cpu_cat: pa.Array
    memory_ts_ns: np.ndarray  # [memory] instants
    memory_device_type: np.ndarray  # 1 CUDA, else CPU; 0 when absent
    memory_allocated: np.ndarray  # float64 bytes, NaN when absent
    memory_reserved: np.ndarray
    events: int
    reader: str = "python"  # or "native": native.py read it

    def counted_device_events(self) -> KinetoFile:
        """The file as the importer maps it: the device events HTA counts, each with a stream.

        An MTIA event that names no stream (its DMA requests) is not one of them, as HTA leaves
        it out of its figures; any other device event without one takes its thread's number
        (the stream, in the trace's layout)."""
        stream, gpu = self.gpu_stream, self.gpu
        mtia = pc.fill_null(pc.equal(self.gpu_cat, MTIA_DEVICE), False)
        keep = ~(mtia.to_numpy(zero_copy_only=False) & (stream < 0))
        if keep.all():
            return replace(self, gpu_stream=np.where(stream < 0, gpu.tid, stream))
        mask = pa.array(keep)
        kept = Cols(
            gpu.name.filter(mask), gpu.ts_ns[keep], gpu.end_ns[keep], gpu.pid[keep],
            gpu.tid[keep], gpu.args,
        )  # fmt: skip
        return replace(
            self,
            gpu=kept,
            gpu_cat=self.gpu_cat.filter(mask),
            gpu_stream=np.where(stream[keep] < 0, kept.tid, stream[keep]),
            gpu_correlation=self.gpu_correlation[keep],
            gpu_bytes=self.gpu_bytes[keep],
        )

    @property
    def base_ns(self) -> int:
        """baseTimeNanoseconds, or 0 when the stamps are absolute."""
        base = self.header.get("baseTimeNanoseconds")
        return int(base) if isinstance(base, int | float) else 0

    @property
    def distributed(self) -> dict[str, Any]:
        info = self.header.get("distributedInfo")
        return info if isinstance(info, dict) else {}


def _columns(
    group: str, events: list[Event], idx: np.ndarray, fields: tuple[str, ...] = COLS_FIELDS
) -> tuple[dict[str, Any], list[Any]]:
    """``group_field`` columns of the events at idx (fields of Cols), and their args records."""
    sub = [events[i] for i in idx.tolist()]
    out: dict[str, Any] = {}
    ts = out[f"{group}_ts_ns"] = ns_from_us(list(map(_TS, sub)))
    if "end_ns" in fields:
        out[f"{group}_end_ns"] = ends_ns(ts, list(map(_DUR, sub)))
    if "name" in fields:
        out[f"{group}_name"] = pc.fill_null(_strings(list(map(_NAME, sub))), "")
    if "pid" in fields:
        out[f"{group}_pid"] = _fast_ints(list(map(_PID, sub)))
    if "tid" in fields:
        out[f"{group}_tid"] = _fast_ints(list(map(_TID, sub)))
    if "cat" in fields:
        out[f"{group}_cat"] = pa.array(list(map(_CAT, sub)), pa.string())
    return out, list(map(_ARGS, sub))


def _strings(values: list[Any]) -> pa.Array:
    """Strings as they are, None as null, anything else as its str()."""
    try:
        return pa.array(values, pa.string())
    except (pa.ArrowTypeError, pa.ArrowInvalid):
        return pa.array([v if v is None or isinstance(v, str) else str(v) for v in values])


def _floats(values: list[Any]) -> np.ndarray:
    return np.asarray([np.nan if v is None else v for v in values], dtype=np.float64)


# what an event is to the importer, as bits: an event can be in more than one group
_GPU, _LAUNCH, _CPU, _COMM, _MEMORY = 1, 2, 4, 8, 16
_STEP = re.compile(STEP_RE, re.ASCII)
_COMM_ANNOTATION = re.compile(COMM_ANNOTATION_RE, re.ASCII)


def _kind(ph: Any, cat: Any, name: Any) -> int:
    """The groups one event belongs to (see _chunk_columns for the rules)."""
    text = name if name is None or isinstance(name, str) else str(name)
    if ph == "i":
        return _MEMORY if text == "[memory]" else 0
    if ph != "X":
        return 0
    kind = _GPU if cat in GPU_CATS else _LAUNCH if cat in LAUNCH_CATS else 0
    if text is not None and (text == "record_param_comms" or _COMM_ANNOTATION.match(text)):
        return kind | _CPU | _COMM
    # gloo: operators matched the annotation pattern above
    if cat == "user_annotation" or (text is not None and _STEP.match(text) is not None):
        kind |= _CPU
    return kind


class _Kinds(dict[tuple[Any, Any, Any], int]):
    """(ph, cat, name) -> _kind, worked out once per distinct triple: a trace repeats few."""

    def __missing__(self, key: tuple[Any, Any, Any]) -> int:
        kind = self[key] = _kind(*key)
        return kind


_KINDS = _Kinds()


def _kinds(events: list[Event]) -> np.ndarray:
    """Each event's _kind, looked up without a Python call per event."""
    triples = zip(map(_PH, events), map(_CAT, events), map(_NAME, events), strict=True)
    if len(_KINDS) > 50_000:  # names that never repeat (one made up per event): bounded memory
        _KINDS.clear()
    try:
        return np.fromiter(map(_KINDS.__getitem__, triples), np.uint8, count=len(events))
    except TypeError:  # a name that is a list or an object: classify each event
        return np.fromiter((_kind(e.ph, e.cat, e.name) for e in events), np.uint8, len(events))


def _chunk_columns(events: list[Event]) -> dict[str, Any]:
    """Every column of KinetoFile (``group_field``) for one chunk of events.

    Groups: GPU activity (complete events of a GPU category), CUDA launches (complete events
    of a runtime or driver category), CPU events (complete ``ProfilerStep#N``,
    ``record_param_comms``, ``nccl:``/``gloo:``/... annotations and any ``user_annotation``;
    the collectives among them keep their args) and ``[memory]`` instants."""
    kinds = _kinds(events)
    gpu_idx = np.flatnonzero(kinds & _GPU)
    launch_idx = np.flatnonzero(kinds & _LAUNCH)
    cpu_idx = np.flatnonzero(kinds & _CPU)
    mem_idx = np.flatnonzero(kinds & _MEMORY)

    out: dict[str, Any] = {"events": len(events)}
    gpu, gpu_args = _columns("gpu", events, gpu_idx, (*COLS_FIELDS, "cat"))
    out.update(gpu)
    stream = _fast_ints(_arg(gpu_args, "stream"), -1)
    out.update(
        gpu_stream=stream,
        gpu_correlation=_fast_ints(_arg(gpu_args, "correlation"), -1),
        gpu_bytes=_fast_ints(_arg(gpu_args, "bytes"), -1),
    )
    launch, launch_args = _columns("launch", events, launch_idx, ("ts_ns", "tid"))
    correlation = _fast_ints(_arg(launch_args, "correlation"), -1)
    keep = correlation >= 0  # a launch without one matches no GPU event
    out.update(
        launch_ts_ns=launch["launch_ts_ns"][keep],
        launch_tid=launch["launch_tid"][keep],
        launch_correlation=correlation[keep],
    )
    cpu, cpu_args = _columns("cpu", events, cpu_idx, (*COLS_FIELDS, "cat"))
    reads_args = kinds[cpu_idx] & _COMM
    out.update(
        cpu,
        cpu_args=[owned(a) if r else None for a, r in zip(cpu_args, reads_args, strict=True)],
    )
    memory, memory_args = _columns("memory", events, mem_idx, ("ts_ns",))
    out.update(
        memory,
        memory_device_type=_fast_ints(_arg(memory_args, "device_type"), 0),
        memory_allocated=_floats(_arg(memory_args, "total_allocated")),
        memory_reserved=_floats(_arg(memory_args, "total_reserved")),
    )
    return out


def _concat(parts: list[Any]) -> Any:
    if isinstance(parts[0], pa.Array):
        return pa.concat_arrays(parts) if len(parts) > 1 else parts[0]
    if isinstance(parts[0], list):
        return [x for part in parts for x in part]
    return np.concatenate(parts) if len(parts) > 1 else parts[0]


def read_kineto(path: str | Path, native: bool = True) -> KinetoFile:
    """Parse one trace file and keep, as columns, the event groups the importer maps: with the
    native reader where it is built and takes the file, else in Python."""
    path = Path(path)
    if native:
        from dtprof.trace.kineto.native import read

        found = read(path)
        if not isinstance(found, str):
            return found
    header: dict[str, Any] = {}
    try:
        parts = [_chunk_columns(events) for events in stream(path, header)]
    except Unstreamable:  # another layout, or something wrong: read whole, which says what
        header, parts = _read_whole(path)
    events = sum(part.pop("events") for part in parts)
    col = {key: _concat([part[key] for part in parts]) for key in parts[0]}
    del parts

    def cols(group: str) -> Cols:
        name, ts_ns, end_ns, pid, tid = (col.pop(f"{group}_{f}") for f in COLS_FIELDS)
        return Cols(name, ts_ns, end_ns, pid, tid, args=col.pop(f"{group}_args", []))

    return KinetoFile(
        path=path, header=header, gpu=cols("gpu"), cpu=cols("cpu"), events=events, **col
    ).counted_device_events()


def _read_whole(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(header, each chunk's columns) of a file read whole; the text is gone when it returns."""
    header, text, raws = decode(path)
    try:
        return header, [_chunk_columns(events) for events in chunks(path, text, raws)]
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:  # what skipping an event let by
        raise DtprofError(f"{path}: not valid JSON ({exc})") from None
