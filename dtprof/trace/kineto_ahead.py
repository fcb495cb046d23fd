"""What happens to profiler traces before the analyzer's libraries are imported.

A cold ``dtprof analyze`` of PyTorch profiler traces spends its first half second importing
numpy, pyarrow and pandas, on one CPU. This module needs only the standard library, so the
command can look first (are these profiler traces, is their conversion cached, is the native
reader built) and, when the files must be read, start one thread that scans them with the
native reader (``kineto_*.cpp``) meanwhile. The scan runs in C without the GIL, beside the
imports.

The thread scans from the last file backwards, the order in which the importer's own process
takes files. On two CPUs (or one) that process reads every file alone, with no worker beside
it, and the thread scans them all, staying at most a few files ahead. With more CPUs it scans
that process's share of them (the files over the CPUs), then the first file, the first one
handed to a worker process (:func:`dtprof.trace.importer.import_kineto`). The workers take
files from the first, and no other file scanned here. Only the process that started the
thread takes its results, but for that first file: the worker forked next inherits its scan
(it inherits the object, not the thread).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import sys
import threading
from pathlib import Path

from dtprof import __version__
from dtprof.beside import workers_for
from dtprof.cache import cache_root, native_root
from dtprof.trace.layout import IMPORTER_VERSION, SCHEMA_VERSION, has_rank_dirs

KINETO_SUFFIXES = (".json", ".json.gz")
SOURCE = Path(__file__).with_name("kineto_scan.cpp")  # the C ABI: errors name it
# every file of the native reader (kineto_scan.cpp says what each holds): a change to any of
# them builds it again
SOURCES = tuple(
    SOURCE.with_name(name)
    for name in (
        "kineto_scan.cpp",
        "kineto_scan.h",
        "kineto_json.h",
        "kineto_events.cpp",
    )
)
OFF_VALUES = {"0", "off", "no", "false"}


def kineto_files(folder: Path) -> list[Path]:
    """The ``*.json`` / ``*.json.gz`` files directly in a folder, sorted by name."""
    return sorted(p for p in folder.iterdir() if p.is_file() and p.name.endswith(KINETO_SUFFIXES))


def trace_files(path: Path) -> list[Path]:
    """The profiler-trace files of a path: itself if a file, else those in the folder."""
    return [path] if path.is_file() else kineto_files(path)


def cache_path(path: Path) -> Path:
    """Where the conversion of these files is cached: keyed by their paths, sizes and mtimes."""
    key = hashlib.sha1(f"{__version__}/{SCHEMA_VERSION}/{IMPORTER_VERSION}".encode())
    for f in trace_files(path):
        st = f.stat()
        key.update(f"{f.resolve()}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return cache_root() / "kineto" / key.hexdigest()[:20]


def cached(path: Path) -> Path | None:
    """The cached conversion of a Kineto path, if one is complete."""
    target = cache_path(path)
    return target if target.is_dir() else None


def off() -> bool:
    """Whether ``DTPROF_NATIVE=0`` (or off, no, false) keeps the native reader unloaded."""
    return os.environ.get("DTPROF_NATIVE", "").strip().lower() in OFF_VALUES


def compiler() -> str | None:
    """$CXX, else the first C++ compiler on PATH."""
    if os.environ.get("CXX"):
        return os.environ["CXX"]
    return next(filter(None, map(shutil.which, ("c++", "g++", "clang++"))), None)


def library_path() -> Path:
    """The native reader in the cache, named by its sources, the compiler and the machine."""
    key = hashlib.sha1()
    for source in SOURCES:
        key.update(f"{source.name}\0".encode() + source.read_bytes() + b"\0")
    key.update(f"\0{compiler()}\0{platform.machine()}\0{sys.platform}".encode())
    return native_root() / f"kineto-scan-{key.hexdigest()[:16]}.so"


def open_library(path: Path) -> ctypes.CDLL:
    """The built reader, its functions typed for ctypes."""
    lib = ctypes.CDLL(str(path))
    lib.dtprof_kineto_scan.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int]
    lib.dtprof_kineto_scan.restype = ctypes.c_void_p
    lib.dtprof_kineto_scan_file.argtypes = [ctypes.c_char_p]
    lib.dtprof_kineto_scan_file.restype = ctypes.c_void_p
    lib.dtprof_kineto_inflates.argtypes = []
    lib.dtprof_kineto_status.argtypes = [ctypes.c_void_p]
    lib.dtprof_kineto_why.argtypes = [ctypes.c_void_p]
    lib.dtprof_kineto_why.restype = ctypes.c_char_p
    lib.dtprof_kineto_at.argtypes = [ctypes.c_void_p]
    lib.dtprof_kineto_at.restype = ctypes.c_int64
    lib.dtprof_kineto_events.argtypes = [ctypes.c_void_p]
    lib.dtprof_kineto_events.restype = ctypes.c_int64
    lib.dtprof_kineto_columns.argtypes = [
        ctypes.c_void_p,
        ctypes.POINTER(ctypes.c_char_p),
        ctypes.POINTER(ctypes.c_void_p),
        ctypes.POINTER(ctypes.c_int64),
        ctypes.c_int,
    ]
    lib.dtprof_kineto_free.argtypes = [ctypes.c_void_p]
    lib.dtprof_kineto_free.restype = None
    lib.dtprof_kineto_trim.argtypes = []
    lib.dtprof_kineto_trim.restype = None
    return lib


def _key(path: Path) -> str:
    return os.path.abspath(path)


WAITING_AT_MOST = 6  # scans not taken yet, scanning every file: about 9 MB each (a V100 rank)


class ScanAhead:
    """One thread scanning files with the native reader: this process's share, last file first,
    then the first file of the worker forked beside it (``handed``); or, with ``every``, every
    file for this process reading them all alone, at most WAITING_AT_MOST ahead of it.

    This process converts its first file before the worker forks (importer, beside.run_beside's
    ``first_here``), so the worker starts with all that process's imports and first calls done.
    Meanwhile the thread goes on scanning, and the worker's first file, scanned before the fork,
    is inherited by the worker: neither CPU waits. The thread stops when a file is reserved for
    a worker or a second file is taken here: from then on the importer's processes keep the
    CPUs busy, and one more scan would only take turns with them. Results wait here until
    taken, or are freed by close(). Scanning every file, it goes on whatever is taken."""

    def __init__(
        self,
        lib: ctypes.CDLL,
        files: list[Path],
        handed: Path | None = None,
        every: bool = False,
    ) -> None:
        self.every = every
        self._lib = lib
        self._pid = os.getpid()
        self._handed = _key(handed) if handed is not None else None
        self._order = [_key(f) for f in [*reversed(files), *([handed] if handed else [])]]
        self._cond = threading.Condition()
        self._scanned: dict[str, int] = {}  # file -> the scanner's result
        self._scanning: str | None = None
        self._claimed: set[str] = set()  # taken or reserved: not to be scanned here
        self._closed = False
        self._taking = False  # a second file taken, or one reserved: start no other
        self._taken = 0
        self._given: int | None = None  # the handed file's scan, for the worker forked next
        self._thread = threading.Thread(target=self._run, name="dtprof-scan-ahead", daemon=True)
        self._thread.start()

    def forked(self) -> None:
        """In a forked worker: free the inherited results (the handed file's scan is kept apart,
        for the worker), whose pages would otherwise count in its memory too. No lock: the
        scanning thread is not there, and the forking thread held the GIL, so no other thread
        was inside the dict."""
        if self._scanned and not self._closed:
            for result in self._scanned.values():
                self._lib.dtprof_kineto_free(result)
            self._scanned.clear()
            self._lib.dtprof_kineto_trim()

    def _run(self) -> None:
        for name in self._order:
            with self._cond:
                while self.every and len(self._scanned) >= WAITING_AT_MOST and not self._closed:
                    self._cond.wait()
                if self._closed or (self._taking and not self.every):
                    return
                if name in self._claimed:
                    continue
                self._scanning = name
            result = self._lib.dtprof_kineto_scan_file(os.fsencode(name))  # without the GIL
            with self._cond:
                self._scanning = None
                if self._closed:
                    self._lib.dtprof_kineto_free(result)
                    return
                self._scanned[name] = result
                self._cond.notify_all()

    def _mine(self) -> bool:
        return os.getpid() == self._pid and not self._closed

    def take(self, path: Path) -> int | None:
        """The scanner's result for a file (waiting while it is being scanned), or None when it
        was not scanned here; the caller frees it. A file asked for is never scanned here after.
        In a forked worker, the handed file's scan if it was handed over, else None."""
        name = _key(path)
        if os.getpid() != self._pid:
            return self._inherited(name)
        if self._closed:
            return None
        with self._cond:
            self._drop_given()  # the worker it was for has forked: it holds its own copy
            self._taken += 1
            self._taking = self._taking or self._taken > 1
            while self._scanning == name:
                self._cond.wait()
            self._claimed.add(name)
            self._cond.notify_all()  # room for one more scan, scanning every file
            return self._scanned.pop(name, None)

    def next_of(self, paths: list[Path]) -> int:
        """Which of these files this process, reading every file alone, best reads next (an
        index into them): the first scanned already, else the first not being scanned (it scans
        that one itself, beside the thread), else the one being scanned (it waits for it)."""
        names = [_key(p) for p in paths]
        with self._cond:
            for k, name in enumerate(names):
                if name in self._scanned:
                    return k
            return next((k for k, name in enumerate(names) if name != self._scanning), 0)

    def _inherited(self, name: str) -> int | None:
        """In a worker: the handed file's scan for that file (once); any other file first, and
        the scan is some other worker's to use: freed."""
        given, self._given = self._given, None
        if given is not None and name != self._handed:
            self._lib.dtprof_kineto_free(given)
            return None
        return given

    def _drop_given(self) -> None:
        if self._given is not None:
            self._lib.dtprof_kineto_free(self._given)
            self._given = None

    def reserve(self, path: Path) -> bool:
        """Keep a file for another process: False when it is scanned or being scanned here (and
        not the handed file, whose scan the worker forked next inherits)."""
        if not self._mine():
            return True
        name = _key(path)
        with self._cond:
            self._taking = True
            if name == self._handed and name in self._scanned and self._taken <= 1:
                self._given = self._scanned.pop(name)  # freed here once taken by the fork
                self._claimed.add(name)
                return True
            if name in self._scanned or name == self._scanning:
                return False
            self._claimed.add(name)
            return True

    def close(self) -> None:
        """Stop after the file being scanned, and free every result not taken."""
        if os.getpid() != self._pid:
            return
        with self._cond:
            self._closed = True
            self._drop_given()
            for result in self._scanned.values():
                self._lib.dtprof_kineto_free(result)
            self._scanned.clear()


_current: ScanAhead | None = None


def _forked() -> None:
    if _current is not None:
        _current.forked()


os.register_at_fork(after_in_child=_forked)


def start(path: str | os.PathLike[str], even_if_cached: bool = False) -> ScanAhead | None:
    """Start scanning a path's profiler traces ahead, when they are profiler traces (whose
    conversion is not cached, unless ``even_if_cached``) and the native reader is built;
    never raises."""
    global _current
    try:
        p = Path(path)
        if off() or not p.exists():
            return None
        if p.is_dir() and has_rank_dirs(p):
            return None  # a dtprof trace
        files = trace_files(p) if p.is_dir() or p.name.endswith(KINETO_SUFFIXES) else []
        if not files or (not even_if_cached and cached(p) is not None):
            return None
        library = library_path()
        if not library.is_file():
            return None  # the importer builds it, and reports a failed build
        stop()
        workers = workers_for(len(files))
        if workers <= 1:
            # On two CPUs, this process reads every file alone, with the thread scanning them:
            # a forked worker cost more CPU (the fork, copy-on-write faults) than it saved.
            _current = ScanAhead(open_library(library), files, every=True)
        else:
            # this process's share, and the first file of the workers beside it (dtprof.beside)
            share = -(-len(files) // (workers + 1))
            handed = files[0] if len(files) > share else None
            _current = ScanAhead(open_library(library), files[-share:], handed)
    except (OSError, AttributeError):  # unreadable, or a library of another version
        return None
    return _current


def current() -> ScanAhead | None:
    """The scan started in this process, if any."""
    return _current


def take(path: Path) -> int | None:
    """The result scanned ahead for a file, or None (see ScanAhead.take)."""
    return _current.take(path) if _current is not None else None


def stop() -> None:
    """Close the scan started in this process, if any."""
    global _current
    if _current is not None:
        _current.close()
        _current = None
