"""``dtprof build-native``: the native recording kernel built into dtprof's cache, for this torch;
and whether the profiler-trace reader was built at install."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

from dtprof.errors import DtprofError


def run(args: argparse.Namespace) -> int:
    """Build, where torch is installed, the kernel that records DDP's buckets and the backward
    phase at about no cost into dtprof's cache (once per torch build; a C++ compiler and ninja
    needed), and say whether the profiler-trace reader was built when dtprof was installed."""
    from dtprof.trace.kineto.scan_ahead import native_reader

    reader, why = native_reader()
    if reader is not None:
        print(f"dtprof: profiler-trace reader built at install: {reader.__file__}")
    else:
        print(
            f"dtprof: no native profiler-trace reader ({why}); Python reads profiler traces. "
            "Install dtprof again where a C++ compiler is (pip install --force-reinstall "
            "--no-deps dtprof) to build it."
        )
    try:
        from dtprof.record import native
    except ImportError as exc:  # no torch here
        print(f"dtprof: no native recording kernel: it needs torch ({exc})")
        return 0
    print("dtprof: building the native recording kernel (10-30 s) ...", file=sys.stderr, flush=True)
    return 0 if _build("native recording kernel", native.build, args.verbose) else 2


def _build(what: str, build: Callable[..., Path], verbose: bool) -> bool:
    """Run one native build; its failure is one line on stderr, and False."""
    started = time.monotonic()
    try:
        path = build(verbose=verbose)
    except DtprofError as exc:
        print(f"dtprof: error: {exc}", file=sys.stderr)
        return False
    print(f"dtprof: {what} built in {time.monotonic() - started:.1f} s: {path}")
    return True
