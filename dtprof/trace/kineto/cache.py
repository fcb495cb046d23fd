"""Where the conversion of a set of profiler-trace files is kept (standard library only)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from dtprof import __version__
from dtprof.cache import cache_root
from dtprof.trace.kineto.files import trace_files
from dtprof.trace.layout import IMPORTER_VERSION, SCHEMA_VERSION


def cache_path(path: Path) -> Path:
    """Where the conversion of these files is cached: keyed by their paths, sizes and mtimes
    (and by dtprof's, the trace layout's and the mapping's versions)."""
    key = hashlib.sha1(f"{__version__}/{SCHEMA_VERSION}/{IMPORTER_VERSION}".encode())
    for f in trace_files(path):
        st = f.stat()
        key.update(f"{f.resolve()}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return cache_root() / "kineto" / key.hexdigest()[:20]


def cached(path: Path) -> Path | None:
    """The cached conversion of a Kineto path, if one is complete."""
    target = cache_path(path)
    return target if target.is_dir() else None
