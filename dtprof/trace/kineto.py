"""Read one PyTorch profiler (Kineto) trace file into columns; no per-event objects are kept.

A file is parsed with orjson, then each group of events the importer needs (GPU activity,
CUDA launches, CPU operators and annotations, ``[memory]`` instants) is pulled out column by
column into numpy arrays; the parsed events are dropped before the file's tables are built
(:mod:`dtprof.trace.kineto_map`).

Times: ``ts`` and ``dur`` are microseconds (integers in older traces, floats in newer ones).
With ``baseTimeNanoseconds`` in the file, ``ts`` is relative to it; without, ``ts`` is absolute
(Unix epoch). Both become int64 nanoseconds exactly as written (``round(ts * 1000)``, split into
whole and fractional microseconds so that absolute stamps keep their nanoseconds).
"""

from __future__ import annotations

import gzip
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from dtprof.errors import DtprofError

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset")
LAUNCH_CATS = ("cuda_runtime", "cuda_driver", "Runtime", "Driver")
CPU_CATS = ("cpu_op", "user_annotation", "Operator", "user_annotation")
STEP_RE = r"^ProfilerStep\s*#\s*(?P<number>\d+)"
COMM_ANNOTATION_RE = r"^(nccl|gloo|mpi|ucc|xccl):"


def ns_from_us(values: list[Any]) -> np.ndarray:
    """Microsecond stamps (int, float or numeric string; None as 0) to int64 ns, to the ns."""
    us = np.asarray([0 if v is None else v for v in values], dtype=np.float64)
    whole = np.floor(us)
    return whole.astype(np.int64) * 1000 + np.rint((us - whole) * 1000).astype(np.int64)


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


@dataclass
class Cols:
    """One group of events as columns (all the same length)."""

    name: pa.Array
    ts_ns: np.ndarray
    end_ns: np.ndarray
    pid: np.ndarray
    tid: np.ndarray
    args: list[dict[str, Any]]  # kept only for the few groups whose args are read (comms, memory)

    def __len__(self) -> int:
        return len(self.ts_ns)

    def take(self, idx: np.ndarray) -> Cols:
        keep = idx.tolist()
        return Cols(
            name=self.name.take(pa.array(idx, pa.int64())),
            ts_ns=self.ts_ns[idx],
            end_ns=self.end_ns[idx],
            pid=self.pid[idx],
            tid=self.tid[idx],
            args=[self.args[i] for i in keep] if self.args else [],
        )


@dataclass
class KinetoFile:
    """What the importer needs of one trace file, columnar."""

    path: Path
    header: dict[str, Any]  # every top-level key but traceEvents
    gpu: Cols  # kernels, memcpy, memset; args reduced to the columns below
    gpu_cat: pa.Array
    gpu_stream: np.ndarray
    gpu_correlation: np.ndarray
    gpu_bytes: np.ndarray
    launch: Cols  # CUDA runtime / driver calls with a correlation id
    launch_correlation: np.ndarray
    cpu: Cols  # ProfilerStep#N, record_param_comms, nccl:/gloo: annotations, other annotations
    cpu_cat: pa.Array
    memory: Cols  # [memory] instants, with args
    events: int

    @property
    def base_ns(self) -> int:
        """baseTimeNanoseconds, or 0 when the stamps are absolute."""
        base = self.header.get("baseTimeNanoseconds")
        return int(base) if isinstance(base, int | float) else 0

    @property
    def distributed(self) -> dict[str, Any]:
        info = self.header.get("distributedInfo")
        return info if isinstance(info, dict) else {}


def read_bytes(path: Path) -> bytes:
    """The file's JSON text, gunzipped when it is gzip (by its magic bytes, not its name)."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DtprofError(f"{path}: cannot read ({exc.strerror})") from None
    if raw[:2] == b"\x1f\x8b":
        try:
            return gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:
            raise DtprofError(f"{path}: corrupted gzip ({exc})") from None
    return raw


def load_json(path: Path) -> dict[str, Any]:
    """The parsed trace object; a file that is not a Kineto trace fails naming it."""
    try:
        doc = orjson.loads(read_bytes(path))
    except orjson.JSONDecodeError as exc:
        raise DtprofError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise DtprofError(f"{path}: not a PyTorch profiler trace (no traceEvents list)")
    return doc


def _cols(events: list[Any], idx: np.ndarray, *, args: bool) -> Cols:
    sub = [events[i] for i in idx.tolist()]
    ts = ns_from_us([e.get("ts") for e in sub])
    dur = ns_from_us([e.get("dur") for e in sub])
    return Cols(
        name=pa.array([str(e.get("name", "")) for e in sub], pa.string()),
        ts_ns=ts,
        end_ns=ts + np.maximum(dur, 0),
        pid=_fast_ints([e.get("pid") for e in sub]),
        tid=_fast_ints([e.get("tid") for e in sub]),
        args=[e.get("args") or {} for e in sub] if args else [],
    )


def _arg(sub: list[dict[str, Any]], key: str, default: Any) -> list[Any]:
    return [a.get(key, default) if isinstance(a, dict) else default for a in sub]


def read_kineto(path: str | Path) -> KinetoFile:
    """Parse one trace file and keep, as columns, the event groups the importer maps."""
    path = Path(path)
    doc = load_json(path)
    events: list[Any] = doc.pop("traceEvents")
    if not all(isinstance(e, dict) for e in events[:1000]):
        raise DtprofError(f"{path}: traceEvents holds something other than events")
    events = [e for e in events if isinstance(e, dict)] if events else events
    cat = pa.array([e.get("cat") for e in events], pa.string())
    ph = pa.array([e.get("ph") for e in events], pa.string())
    name = pa.array([e.get("name") if isinstance(e.get("name"), str) else "" for e in events])
    complete = pc.fill_null(pc.equal(ph, "X"), False)

    def where(mask: pa.Array) -> np.ndarray:
        return np.flatnonzero(pc.fill_null(mask, False).to_numpy(zero_copy_only=False))

    gpu_idx = where(pc.and_(complete, pc.is_in(cat, pa.array(GPU_CATS))))
    launch_idx = where(pc.and_(complete, pc.is_in(cat, pa.array(LAUNCH_CATS))))
    is_step = pc.match_substring_regex(name, STEP_RE)
    is_comm = pc.or_(
        pc.equal(name, "record_param_comms"), pc.match_substring_regex(name, COMM_ANNOTATION_RE)
    )
    is_gloo_op = pc.starts_with(name, "gloo:")
    annotation = pc.equal(cat, "user_annotation")
    cpu_idx = where(
        pc.and_(
            complete,
            pc.or_(pc.or_(is_step, is_comm), pc.or_(is_gloo_op, annotation)),
        )
    )
    mem_idx = where(pc.and_(pc.equal(ph, "i"), pc.equal(name, "[memory]")))

    gpu = _cols(events, gpu_idx, args=True)
    gpu_args = gpu.args
    stream = _fast_ints(_arg(gpu_args, "stream", None), -1)
    stream = np.where(stream < 0, gpu.tid, stream)
    gpu_corr = _fast_ints(_arg(gpu_args, "correlation", None), -1)
    gpu_bytes = _fast_ints(_arg(gpu_args, "bytes", None), -1)
    gpu.args = []
    launch = _cols(events, launch_idx, args=True)
    launch_corr = _fast_ints(_arg(launch.args, "correlation", None), -1)
    launch.args = []
    keep_launch = np.flatnonzero(launch_corr >= 0)
    launch, launch_corr = launch.take(keep_launch), launch_corr[keep_launch]
    cpu = _cols(events, cpu_idx, args=True)
    out = KinetoFile(
        path=path,
        header=doc,
        gpu=gpu,
        gpu_cat=cat.take(pa.array(gpu_idx, pa.int64())),
        gpu_stream=stream,
        gpu_correlation=gpu_corr,
        gpu_bytes=gpu_bytes,
        launch=launch,
        launch_correlation=launch_corr,
        cpu=cpu,
        cpu_cat=cat.take(pa.array(cpu_idx, pa.int64())),
        memory=_cols(events, mem_idx, args=True),
        events=len(events),
    )
    del events
    return out


RANK_IN_NAME = re.compile(r"rank[-_=.]?(\d+)", re.IGNORECASE)


def rank_from_name(path: Path) -> int | None:
    """The digits after ``rank`` in a file name (``trace_rank-3.json`` -> 3), else None."""
    found = RANK_IN_NAME.search(path.name)
    return int(found.group(1)) if found else None
