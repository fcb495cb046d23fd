"""The native reader of PyTorch profiler traces (``kineto_*.cpp``): built once, then loaded.

It reads a trace file straight into the columns of :class:`~dtprof.trace.kineto.KinetoFile`,
with no Python object per event and without holding the GIL, about six times as fast as the
Python reader; :mod:`dtprof.trace.kineto_map` maps them as it maps the Python reader's. It
takes only what it reads with certainty and gives anything else back: the Python reader then
reads that file, or says what is wrong with it.

It needs no torch, only a C++17 compiler (``$CXX``, else ``c++``, ``g++`` or ``clang++``), and
inflates gzipped traces itself where zlib is there to link (else Python inflates them). The
first import of profiler traces builds it into dtprof's cache (about 4 s, once per version of
its sources, ``kineto_ahead.SOURCES``); ``dtprof build-native`` builds it ahead. Where the build
fails, the failure is kept beside it and the Python reader is used without trying again until a
source changes. ``DTPROF_NATIVE=0`` keeps it unloaded.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa

from dtprof.errors import DtprofError
from dtprof.trace import kineto_ahead
from dtprof.trace.kineto import Cols, KinetoFile, ends_ns, ns_from_us
from dtprof.trace.kineto_ahead import SOURCE, SOURCES, compiler, library_path, off, open_library
from dtprof.trace.kineto_events import HEADER_KEYS, Args, read_bytes

MAX_COLUMNS = 128  # the scanner has about 70
GZIPPED = 2  # the scanner's status for a gzipped file
_DTYPES = {
    "ts": np.float64,
    "dur": np.float64,
    "allocated": np.float64,
    "reserved": np.float64,
}

_ARGS = msgspec.json.Decoder(list[Args])

_lock = threading.Lock()
_library: Library | None = None
_why_not = ""


def build(verbose: bool = False) -> Path:
    """Compile the native reader into the cache (again only when a source or the compiler
    changed)."""
    cxx = compiler()
    if cxx is None:
        raise DtprofError(f"{SOURCE}: no C++ compiler found (set CXX, or install g++)")
    target = library_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{threading.get_ident()}")
    sources = [str(s) for s in SOURCES if s.suffix == ".cpp"]  # the headers they include
    cmd = [cxx, "-O2", "-std=c++17", "-shared", "-fPIC", "-o", str(tmp), *sources]
    try:
        # with zlib, gzipped traces are inflated natively too; without it (no zlib.h or
        # libz.so), the Python reader inflates them and the scan reads the text
        done = subprocess.run([*cmd, "-lz"], capture_output=not verbose, text=True, check=False)
        if done.returncode != 0:
            cmd.insert(1, "-DDTPROF_NO_ZLIB")
            done = subprocess.run(cmd, capture_output=not verbose, text=True, check=False)
    except OSError as exc:
        raise DtprofError(f"{SOURCE}: cannot run the compiler {cxx} ({exc.strerror})") from None
    if done.returncode != 0 or not tmp.is_file():
        tmp.unlink(missing_ok=True)
        lines = (done.stderr or "").strip().splitlines()
        raise DtprofError(
            f"{SOURCE}: building the profiler-trace reader failed "
            f"({lines[-1] if lines else f'exit code {done.returncode}'}); "
            "`dtprof build-native --verbose` shows the compiler's output"
        )
    os.replace(tmp, target)
    _failure_path(target).unlink(missing_ok=True)
    return target


def _failure_path(library: Path) -> Path:
    return library.with_suffix(".failed")


def forget() -> None:
    """Load again at the next use (after the environment or the library changed)."""
    global _library, _why_not
    with _lock:
        _library, _why_not = None, ""


def load(build_missing: bool = True) -> tuple[Library | None, str]:
    """(the library, "") or (None, why not). Builds it when missing, unless a build failed
    before; never raises."""
    global _library, _why_not
    if off():
        return None, "off (DTPROF_NATIVE=0)"
    with _lock:
        if _library is not None or _why_not:
            return _library, _why_not
        try:
            path = library_path()
            if not path.is_file():
                failed = _failure_path(path)
                if failed.is_file():
                    _why_not = failed.read_text().strip() or "its build failed"
                    return None, _why_not
                if not build_missing:
                    return None, "not built (`dtprof build-native` builds it)"
                print("dtprof: building the profiler-trace reader (once) ...", file=sys.stderr)
                try:
                    build()
                except DtprofError as exc:
                    _keep_failure(failed, str(exc))
                    raise
            _library = Library(open_library(path))
        except (DtprofError, OSError) as exc:
            _why_not = str(exc).splitlines()[0] if str(exc) else repr(exc)
    return _library, _why_not


def _keep_failure(failed: Path, why: str) -> None:
    try:
        failed.parent.mkdir(parents=True, exist_ok=True)
        failed.write_text(why + "\n")
    except OSError:
        pass  # not kept: the next process tries again


class Library:
    """The loaded scanner: a file or a text in, its columns out (or why it gave it back)."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib
        self.inflates = bool(lib.dtprof_kineto_inflates())  # gzipped files, with zlib

    def scan(self, address: int, length: int) -> tuple[dict[str, np.ndarray], int] | str:
        """(columns, events) of the JSON text at address, or why it gave it back."""
        return self.result(self.lib.dtprof_kineto_scan(address, length, 0))

    def scan_file(self, path: Path) -> int:
        """The scan of a file, mapped by the scanner (see result and gzipped)."""
        return int(self.lib.dtprof_kineto_scan_file(os.fsencode(path)))

    def gzipped(self, result: int) -> bool:
        """Whether a file's scan found it gzipped (then freed: inflate it and scan the text)."""
        if self.lib.dtprof_kineto_status(result) != GZIPPED:
            return False
        self.lib.dtprof_kineto_free(result)
        return True

    def result(self, result: int) -> tuple[dict[str, np.ndarray], int] | str:
        """(columns, events) of a scan, or why it gave the text back (then freed at once).

        The columns are views of the scan's own memory, not copies: it is freed when the last
        array that views it goes. Scans run without the GIL (ctypes releases it), so other
        threads go on."""
        lib = self.lib
        owner = _Scan(lib, result)
        if lib.dtprof_kineto_status(result):
            at = lib.dtprof_kineto_at(result)
            why = (lib.dtprof_kineto_why(result) or b"").decode()
            return why + (f" at byte {at}" if at >= 0 else "")
        names = (ctypes.c_char_p * MAX_COLUMNS)()
        data = (ctypes.c_void_p * MAX_COLUMNS)()
        lengths = (ctypes.c_int64 * MAX_COLUMNS)()
        n = lib.dtprof_kineto_columns(result, names, data, lengths, MAX_COLUMNS)
        if n > MAX_COLUMNS:  # a scanner of another version, say: read by Python
            return f"{n} columns, more than {MAX_COLUMNS}"
        cols = {}
        for i in range(n):
            name = (names[i] or b"").decode()
            cols[name] = _view(owner, data[i], lengths[i], _dtype(name))
        return cols, int(lib.dtprof_kineto_events(result))


class _Scan:
    """A scan's memory, freed with the last of the arrays that view it (they hold this)."""

    def __init__(self, lib: ctypes.CDLL, result: int) -> None:
        self.lib, self.result = lib, result

    def __del__(self) -> None:
        self.lib.dtprof_kineto_free(self.result)


def _dtype(name: str) -> Any:
    if name.endswith(".offsets"):
        return np.int32
    if name.endswith((".data", ".valid")):
        return np.uint8
    return _DTYPES.get(name.rsplit("_", 1)[-1], np.int64)


def _view(owner: _Scan, address: int | None, length: int, dtype: Any) -> np.ndarray:
    """The scan's column at address as an array, keeping the scan's memory while it lives."""
    if not length or not address:
        return np.empty(0, dtype)
    memory = (ctypes.c_char * (length * np.dtype(dtype).itemsize)).from_address(address)
    memory.owner = owner  # type: ignore[attr-defined]
    return np.frombuffer(memory, dtype)


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
    library, why = load()
    if library is None:
        return why
    ahead = kineto_ahead.take(path)  # scanned while the libraries were imported, if it was
    result = ahead if ahead is not None else library.scan_file(path)
    if library.gzipped(result):  # inflated here (zlib lets other threads run), then scanned
        text = read_bytes(path)
        address = ctypes.cast(ctypes.c_char_p(text), ctypes.c_void_p).value or 0
        scanned = _scanned(library.scan(address, len(text)))
    else:
        scanned = _scanned(library.result(result))
    if isinstance(scanned, str):
        return scanned
    cols, events, header, comm_args = scanned
    gpu_ts = ns_from_us(cols["gpu_ts"])  # in the Python reader's order: it names the first
    gpu_end = ends_ns(gpu_ts, cols["gpu_dur"])  # stamp out of range
    launch_ts = ns_from_us(cols["launch_ts"])
    cpu_ts = ns_from_us(cols["cpu_ts"])
    cpu_end = ends_ns(cpu_ts, cols["cpu_dur"])
    gpu_tid, stream = cols["gpu_tid"], cols["gpu_stream"]
    launch_correlation = cols["launch_correlation"]
    keep = launch_correlation >= 0  # a launch without one matches no GPU event
    return KinetoFile(
        path=path,
        header=header,
        gpu=Cols(strings(cols, "gpu_name"), gpu_ts, gpu_end, cols["gpu_pid"], gpu_tid, args=[]),
        gpu_cat=strings(cols, "gpu_cat"),
        gpu_stream=np.where(stream < 0, gpu_tid, stream),
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
    )


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


def _scanned(scan: tuple[dict[str, np.ndarray], int] | str) -> tuple[Any, ...] | str:
    """The header and the collectives' args decoded, from their columns."""
    if isinstance(scan, str):
        return scan
    cols, events = scan
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
