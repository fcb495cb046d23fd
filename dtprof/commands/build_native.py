"""``dtprof build-native``: dtprof's native libraries built into its cache."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

from dtprof.errors import DtprofError


def run(args: argparse.Namespace) -> int:
    """Build dtprof's native libraries into its cache: the profiler-trace reader (a C++
    compiler needed) and, where torch is installed, the kernel that records DDP's buckets at
    about no cost (once per torch build; ninja needed too)."""
    from dtprof.trace import kineto_native

    built = _build("profiler-trace reader", kineto_native.build, args.verbose)
    kineto_native.forget()
    try:
        from dtprof.record import native
    except ImportError as exc:  # no torch here
        print(f"dtprof: no DDP bucket kernel: it needs torch ({exc})")
        return 0 if built else 2
    print("dtprof: building the DDP bucket kernel (10-30 s) ...", file=sys.stderr, flush=True)
    built &= _build("DDP bucket kernel", native.build, args.verbose)
    return 0 if built else 2


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
