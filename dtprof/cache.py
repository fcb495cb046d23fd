"""Where dtprof keeps what it can make again: converted traces, its native libraries."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """$DTPROF_CACHE_DIR, else $XDG_CACHE_HOME/dtprof, else ~/.cache/dtprof."""
    if os.environ.get("DTPROF_CACHE_DIR"):
        return Path(os.environ["DTPROF_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dtprof"


OFF_VALUES = {"0", "off", "no", "false"}


def native_off() -> bool:
    """Whether ``DTPROF_NATIVE=0`` (or off, no, false) leaves dtprof's native code unused: the
    profiler-trace reader and the native recording kernel."""
    return os.environ.get("DTPROF_NATIVE", "").strip().lower() in OFF_VALUES


def native_root() -> Path:
    """Where the native recording kernel is built: $DTPROF_NATIVE_DIR, else the cache's
    ``native``."""
    if os.environ.get("DTPROF_NATIVE_DIR"):
        return Path(os.environ["DTPROF_NATIVE_DIR"])
    return cache_root() / "native"
