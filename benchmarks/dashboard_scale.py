"""Dashboard at scale: time to a useful first page on a synthetic R-rank x S-step trace.

    python benchmarks/dashboard_scale.py --ranks 1024 --steps 1000 [--out DIR] [--repeat 5] [--full]

The trace comes from ``build_trace`` of benchmarks/analyze_scale.py (dtprof's real format,
about 50 records per rank and step). A first page is: ``create_app`` (the follower lists every
rank and reads its meta.json), the first poll (every rank's steps table: headline and step-time
charts need nothing else), and the overview's figures. Each repeat starts from a fresh app in
this process (imports already paid). ``--full`` then, in a fresh process whose memory (with
its worker processes) is sampled from /proc every 50 ms, reads everything else once, runs the
checks, and times every page's figures, in a separate table.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from analyze_scale import build_trace, peak_rss_until_exit, used_bytes

from dashboard.app import create_app
from dashboard.pages import (
    communication,
    divergence,
    memory,
    overview,
    pipeline,
    ranks,
    timeline,
)
from dashboard.source import LiveSource, Snapshot

GOAL_S = 2.0


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    out = fn()
    return time.perf_counter() - started, out


def _payload(figs: Any) -> int:
    """Bytes of JSON the browser would get for these figures (or components)."""
    from plotly.io import to_json

    items = figs if isinstance(figs, list) else [figs]
    total = 0
    for item in items:
        figure = getattr(item, "figure", item)
        if hasattr(figure, "to_plotly_json"):
            total += len(to_json(figure, validate=False))
        elif hasattr(item, "to_plotly_json"):
            total += len(json.dumps(item.to_plotly_json(), default=str))
    return total


def first_page(trace: Path) -> dict[str, float]:
    """One cold first page: app, first poll, overview figures."""
    t_app, source = _timed(lambda: LiveSource(trace))
    t_make, _ = _timed(lambda: create_app(trace, source=source, start=False))
    t_poll, _ = _timed(source.refresh)
    snap = source.snapshot()
    t_fig, body = _timed(lambda: overview.update(snap))
    charts = body[-1].children
    return {
        "create_app": t_app + t_make,
        "first poll (steps)": t_poll,
        "overview figures": t_fig,
        "first page": t_app + t_make + t_poll + t_fig,
        "payload MiB": sum(_payload(c) for c in charts) / 2**20,
    }


def all_pages(trace: Path) -> list[tuple[str, float, float]]:
    """Full load, checks, then each page's figures once: (what, seconds, payload MiB)."""
    source = LiveSource(trace)
    source.refresh()
    t_full, _ = _timed(source.refresh)
    snap: Snapshot = source.snapshot()
    rows = [("read everything + checks", t_full, 0.0)]
    pages: list[tuple[str, Callable[[], Any]]] = [
        ("overview", lambda: overview.update(snap)[-1].children),
        ("ranks (every step)", lambda: ranks.update(snap, None, None)),
        ("timeline (8 ranks x 3 steps)", lambda: timeline.update(snap, None, None)),
        ("timeline, same window again", lambda: timeline.update(snap, None, None)),
        ("communication", lambda: communication.update(snap, None, None)),
        ("communication (100 steps)", lambda: communication.update(snap, None, "900:1000")),
        ("pipeline", lambda: pipeline.update(snap, None)),
        ("memory", lambda: memory.update(snap, None, None, None)),
        ("divergence", lambda: divergence.update(snap, None, None, None)),
    ]
    for name, fn in pages:
        took, figs = _timed(fn)
        rows.append((name, took, _payload(figs) / 2**20))
    findings = ", ".join(f"{f.code} {f.ranks}" for f in snap.findings) or "none"
    rows.append((f"findings: {findings}", 0.0, 0.0))
    return rows


def full_load(trace: Path) -> tuple[list[tuple[str, float, float]], float]:
    """all_pages in a fresh process: its rows and the peak GiB of that process and its workers."""
    cmd = [sys.executable, __file__, "--out", str(trace), "--child"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    peak, _ = peak_rss_until_exit(proc, used_bytes())
    out = proc.stdout.read() if proc.stdout else ""
    if proc.returncode:
        sys.exit(f"the full load failed ({proc.returncode})")
    return [tuple(row) for row in json.loads(out)], peak / 2**30


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--ranks", type=int, default=1024)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeat", type=int, default=5, help="first pages timed; medians reported")
    p.add_argument("--out", help="keep (or reuse) the synthetic trace here")
    p.add_argument("--full", action="store_true", help="also read everything and time each page")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # --full's process
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(all_pages(Path(args.out))))
        return 0

    tmp = None if args.out else tempfile.mkdtemp(prefix="dtprof-dash-scale-")
    trace = Path(args.out or tmp or "")
    try:
        records = build_trace(trace, args.ranks, args.steps, args.seed)
        runs = [first_page(trace) for _ in range(args.repeat)]
        full, peak = full_load(trace) if args.full else ([], 0.0)
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)

    print(f"{args.ranks} ranks x {args.steps} steps, {records:,} records; {args.repeat} runs\n")
    print(f"{'first page':<26}{'median':>10}{'min':>10}{'max':>10}")
    for key in runs[0]:
        values = [r[key] for r in runs]
        unit = "" if key.endswith("MiB") else " s"
        print(
            f"{key:<26}{statistics.median(values):>8.2f}{unit:2}{min(values):>8.2f}{unit:2}"
            f"{max(values):>8.2f}{unit:2}"
        )
    first = statistics.median(r["first page"] for r in runs)
    print(f"\ngoal: first page <= {GOAL_S:.0f} s: {'met' if first <= GOAL_S else 'missed'}")
    if full:
        print(f"\n{'after the first page (once)':<40}{'s':>8}{'payload MiB':>14}")
        for name, took, mib in full:
            print(f"{name:<40}{took:>8.2f}{mib:>14.2f}" if took else name)
        print(f"peak memory of the full load (process and workers): {peak:.2f} GiB")
    return 0 if first <= GOAL_S else 1


if __name__ == "__main__":
    sys.exit(main())
