"""The native reader of PyTorch profiler traces (``cpp/``, the module ``_scan``), where built.

It reads a trace file straight into the columns of :class:`~dtprof.trace.kineto.read.KinetoFile`,
with no Python object per event and without holding the GIL, about six times as fast as the
Python reader; :mod:`dtprof.trace.kineto.mapping` maps them as it maps the Python reader's. It
takes only what it reads with certainty and gives anything else back: the Python reader then
reads that file, or says what is wrong with it.

It is built when dtprof is installed, where a C++17 compiler is there (``setup.py``; with zlib
it inflates gzipped traces itself, else Python inflates them), and not otherwise: Python then
reads every file. ``DTPROF_NATIVE=0`` leaves it unused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa

from dtprof.trace.kineto import scan_ahead
from dtprof.trace.kineto.events import HEADER_KEYS, Args, read_bytes
from dtprof.trace.kineto.read import Cols, KinetoFile, ends_ns, ns_from_us

GZIPPED = 2  # a scan's status for a gzipped file, where the module inflates none
_ARGS = msgspec.json.Decoder(list[Args])


def _string_parts(cols: dict[str, np.ndarray], name: str) -> tuple[np.ndarray, ...]:
    """A string column's offsets, bytes and validity, taken out of ``cols``."""
    return tuple(cols.pop(f"{name}.{part}") for part in ("offsets", "data", "valid"))


def strings(cols: dict[str, np.ndarray], name: str) -> pa.Array:
    """A string column (nulls where the event had none) from its offsets, bytes and validity,
    taken out of ``cols``."""
    offsets, data, valid = _string_parts(cols, name)
    nulls = int(len(valid) - np.count_nonzero(valid))
    bitmap = pa.py_buffer(np.packbits(valid, bitorder="little")) if nulls else None
    return pa.StringArray.from_buffers(
        len(valid), pa.py_buffer(offsets), pa.py_buffer(data), bitmap, nulls
    )


def read(path: Path) -> KinetoFile | str:
    """One trace file read natively, or why the native reader gave it back."""
    module, why = scan_ahead.native_reader()
    if module is None:
        return why
    scan = scan_ahead.take(path)  # scanned while the libraries were imported, if it was
    if scan is None:
        scan = module.scan_file(str(path))
    if scan.status == GZIPPED:  # built without zlib: inflated here, then scanned
        scan = module.scan_text(read_bytes(path))
    scanned = _scanned(scan)
    if isinstance(scanned, str):
        return scanned
    cols, events, header, comm_args = scanned
    gpu_ts = ns_from_us(cols["gpu_ts"])  # in the Python reader's order: it names the first
    gpu_end = ends_ns(gpu_ts, cols["gpu_dur"])  # stamp out of range
    launch_ts = ns_from_us(cols["launch_ts"])
    cpu_ts = ns_from_us(cols["cpu_ts"])
    cpu_end = ends_ns(cpu_ts, cols["cpu_dur"])
    launch_correlation = cols["launch_correlation"]
    keep = launch_correlation >= 0  # a launch without one matches no GPU event
    return KinetoFile(
        path=path,
        header=header,
        gpu=Cols(
            strings(cols, "gpu_name"), gpu_ts, gpu_end, cols["gpu_pid"], cols["gpu_tid"], args=[]
        ),
        gpu_cat=strings(cols, "gpu_cat"),
        gpu_stream=cols["gpu_stream"],
        gpu_correlation=cols["gpu_correlation"],
        gpu_bytes=cols["gpu_bytes"],
        launch_ts_ns=launch_ts[keep],
        launch_tid=cols["launch_tid"][keep],
        launch_correlation=launch_correlation[keep],
        cpu=Cols(
            strings(cols, "cpu_name"),
            cpu_ts,
            cpu_end,
            cols["cpu_pid"],
            cols["cpu_tid"],
            args=comm_args,
        ),
        cpu_cat=strings(cols, "cpu_cat"),
        memory_ts_ns=ns_from_us(cols["memory_ts"]),
        memory_device_type=cols["memory_device_type"],
        memory_allocated=cols["memory_allocated"],
        memory_reserved=cols["memory_reserved"],
        events=events,
        reader="native",
    ).counted_device_events()


def _args(cols: dict[str, np.ndarray]) -> list[Args | None]:
    """The collectives' args records from their JSON texts (objects, as the scan checked), None
    where an event has none; the column is taken out of ``cols``. One decode for the file: one
    at a time, the calls cost as much as the decoding. The texts lie end to end in the column's
    bytes (an event without one adds nothing), so a comma before each but the first makes them
    one JSON array."""
    offsets, data, valid = _string_parts(cols, "cpu_args")
    present = np.flatnonzero(valid)
    out: list[Args | None] = [None] * len(valid)
    if len(present):
        joined = np.insert(data, offsets[present[1:]], ord(","))
        records = _ARGS.decode(b"[" + joined.tobytes() + b"]")
        for i, record in zip(present.tolist(), records, strict=True):
            out[i] = record
    return out


def _scanned(scan: Any) -> tuple[Any, ...] | str:
    """(columns, events, header, the collectives' args) of a scan, or why it gave the file back."""
    if scan.status:
        return scan.why + (f" at byte {scan.at}" if scan.at >= 0 else "")
    cols, events = scan.columns(), scan.events
    header = {
        key: msgspec.json.decode(raw)
        for key, raw in zip(HEADER_KEYS, _texts(cols, "header"), strict=True)
        if raw is not None
    }
    return cols, events, header, _args(cols)


def _texts(cols: dict[str, np.ndarray], name: str) -> list[bytes | None]:
    """A string column as bytes (None where null), its columns taken out of ``cols``."""
    offsets, data, valid = _string_parts(cols, name)
    raw, bounds = data.tobytes(), offsets.tolist()
    return [raw[bounds[i] : bounds[i + 1]] if ok else None for i, ok in enumerate(valid.tolist())]
