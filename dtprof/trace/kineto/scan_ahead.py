"""Profiler traces scanned natively while the command is still importing its libraries.

A cold ``dtprof analyze`` of PyTorch profiler traces spends its first fifth of a second
importing numpy and pyarrow, on one CPU. This module needs only the standard library (and the
native reader's module, which imports nothing), so the command can look first (are these
profiler traces, is their conversion cached, is the native reader built) and, when this
process is to read the files itself (:func:`reads_alone`), start one thread that scans them
meanwhile, in order, at most WAITING_AT_MOST ahead of what the process has taken. Scans run
in C without the GIL, beside the imports and then beside the mapping of the files scanned
before. The process takes each file's scan (:func:`take`), or scans a file itself when the
thread has not reached it, which the thread then skips.
"""

from __future__ import annotations

import atexit
import importlib
import os
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

from dtprof.cache import native_off
from dtprof.trace.kineto.cache import cached
from dtprof.trace.kineto.files import KINETO_SUFFIXES, trace_files
from dtprof.trace.layout import has_rank_dirs

WAITING_AT_MOST = 6  # scans not taken yet: about 9 MB each (a V100 rank)


def native_reader() -> tuple[ModuleType | None, str]:
    """(the native reader's module, "") or (None, why not): built at install, or not."""
    if native_off():
        return None, "off (DTPROF_NATIVE=0)"
    try:
        return importlib.import_module("dtprof.trace.kineto._scan"), ""
    except ImportError as exc:
        return None, f"not built at install ({exc})"


def reads_alone(files: int) -> bool:
    """Whether the importer reads so many files in this process, with no worker process: one
    file, or two CPUs at most (where a forked worker cost more than it saved, docs/kineto.md)."""
    return files < 2 or (os.cpu_count() or 1) <= 2


class ScanAhead:
    """One thread scanning files in order, at most WAITING_AT_MOST ahead of what is taken.
    Scans wait here until taken, or are dropped by close()."""

    def __init__(self, module: ModuleType, files: list[Path]) -> None:
        self._module = module
        self._pid = os.getpid()
        self._order = [_key(f) for f in files]
        self._cond = threading.Condition()
        self._scanned: dict[str, Any] = {}  # file -> its scan
        self._scanning: str | None = None
        self._taken: set[str] = set()  # asked for: not to be scanned here
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="dtprof-scan-ahead", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        for name in self._order:
            with self._cond:
                while len(self._scanned) >= WAITING_AT_MOST and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                if name in self._taken:
                    continue
                self._scanning = name
            scan = self._module.scan_file(name)  # without the GIL
            with self._cond:
                self._scanning = None
                if not self._closed:
                    self._scanned[name] = scan
                self._cond.notify_all()

    def take(self, path: Path) -> Any:
        """A file's scan (waiting while it is being scanned), or None when it was not scanned
        here, nor will be. None in another process (a fork inherits no thread)."""
        if os.getpid() != self._pid:
            return None
        name = _key(path)
        with self._cond:
            if self._closed:
                return None
            while self._scanning == name:
                self._cond.wait()
            self._taken.add(name)
            self._cond.notify_all()  # room for one more scan
            return self._scanned.pop(name, None)

    def close(self) -> None:
        """Stop after the file being scanned, waiting for it (a thread inside the native
        reader when the interpreter ends would abort the process), and drop every scan not
        taken."""
        with self._cond:
            self._closed = True
            self._scanned.clear()
            self._cond.notify_all()
        if os.getpid() == self._pid and threading.current_thread() is not self._thread:
            self._thread.join()


def _key(path: Path) -> str:
    return os.path.abspath(path)


_running: ScanAhead | None = None


def start(path: str | os.PathLike[str], even_if_cached: bool = False) -> ScanAhead | None:
    """Start scanning a path's profiler traces ahead, when they are profiler traces (whose
    conversion is not cached, unless ``even_if_cached``), this process will read them alone
    and the native reader is built; never raises."""
    global _running
    try:
        p = Path(path)
        if native_off() or not p.exists():
            return None
        if p.is_dir() and has_rank_dirs(p):
            return None  # a dtprof trace
        files = trace_files(p) if p.is_dir() or p.name.endswith(KINETO_SUFFIXES) else []
        if not files or not reads_alone(len(files)):
            return None
        if not even_if_cached and cached(p) is not None:
            return None
        module, _ = native_reader()
        if module is None:
            return None
        stop()
        _running = ScanAhead(module, files)
    except OSError:  # unreadable: the importer says so
        return None
    return _running


def running() -> ScanAhead | None:
    """The scan started in this process, if any."""
    return _running


def take(path: Path) -> Any:
    """The scan made ahead for a file, or None (see ScanAhead.take)."""
    return _running.take(path) if _running is not None else None


def stop() -> None:
    """Close the scan started in this process, if any (and at the interpreter's exit)."""
    global _running
    if _running is not None:
        _running.close()
        _running = None


atexit.register(stop)
