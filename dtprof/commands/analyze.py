"""``dtprof analyze``: the report of a trace, in text, JSON or Markdown, and an exit code for CI."""

from __future__ import annotations

import argparse
import contextlib
import json

from dtprof.commands.output import deliver
from dtprof.commands.own_process import pandas_held_back


def run(args: argparse.Namespace) -> int:
    """Find stragglers and other problems in a trace; exit 1 if any is at --fail-on or above."""
    from dtprof.trace.kineto import scan_ahead

    on_dask = bool(args.scheduler or args.workers)
    if not on_dask:  # profiler traces: read while the imports run
        scan_ahead.start(args.trace)
    try:
        # Dask's own modules may want pandas
        with contextlib.nullcontext() if on_dask else pandas_held_back():
            from dtprof.analysis import analyze
            from dtprof.analysis.render import markdown, text
            from dtprof.analysis.report import severity_rank

            report = analyze(
                args.trace,
                steps=args.steps,
                ranks=args.ranks,
                progress=True,
                scheduler=args.scheduler,
                workers=args.workers,
                peak_tflops=args.peak_tflops,
                link_gbps=args.link_gbps,
            )
    finally:
        scan_ahead.stop()
    if args.format == "json":
        out = json.dumps(report.to_json(), indent=1)
    else:
        out = markdown(report) if args.format == "markdown" else text(report)
    deliver(out, args.output, "report")
    worst = report.worst()
    return 1 if worst and severity_rank(worst) >= severity_rank(args.fail_on) else 0
