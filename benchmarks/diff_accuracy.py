"""How often ``dtprof diff`` calls a change that is not there, and finds one that is: real gloo
jobs, compared in pairs.

    python benchmarks/diff_accuracy.py [--pairs 6] [--ranks 2] [--steps 40] [--slow 0.05,0.1,0.3]

Healthy runs of one DDP job, recorded one after another, are compared in consecutive pairs: any
change called is a false call (the machine's drift between runs is the noise the test must
stand). Then runs whose rank 1 computes ``--slow`` slower (each fraction ``--pairs`` times) are
each compared with a healthy run: the step time's change must be called, slower. Steps carry
20 ms of simulated device time per forward pass (backward twice), as on an accelerator. Progress
goes to stderr, the table to stdout; the traces are removed at the end.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dtprof.jobs import launch


def record(situation: str, trace: Path, args: argparse.Namespace, extra: list[str]) -> None:
    job = ["--trace", str(trace), "--steps", str(args.steps), "--device-ms", "20", *extra]
    codes = launch.run(situation, args.ranks, job, timeout_s=600)
    if codes != [0] * args.ranks:
        raise RuntimeError(f"{situation} {extra}: ranks exited {codes}")


def diff(base: Path, new: Path) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "dtprof", "diff", str(base), str(new), "--format", "json"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--pairs", type=int, default=6)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--slow", default="0.05,0.1,0.3", help="rank 1's compute slowdowns")
    args = p.parse_args(argv)
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        healthy = []
        for i in range(args.pairs + 1):
            print(f"diff_accuracy: healthy run {i + 1}/{args.pairs + 1}", file=sys.stderr)
            healthy.append(root / f"healthy-{i}")
            record("healthy-ddp", healthy[-1], args, [])
        false_calls, false_metrics = 0, []
        for a, b in itertools.pairwise(healthy):
            result = diff(a, b)
            named = [(m, v) for m, v in result["metrics"].items() if v["called"]]
            named += [(f"rank {r['rank']} {r['metric']}", r) for r in result["ranks"]]
            called = [
                f"{m} {v['change_pct']:+.1f}% (noise {v['noise_pct']:.1f}%)" for m, v in named
            ]
            false_calls += bool(called)
            false_metrics += called
        lines = [
            f"{args.ranks} ranks, {args.steps} steps a run; load {os.getloadavg()[0]:.1f}",
            f"{'pairs':<28}{'compared':>9}{'change called':>15}  step change, called",
            f"{'healthy, one after another':<28}{args.pairs:>9}{false_calls:>15}  "
            + (", ".join(false_metrics) or "-"),
        ]
        for fraction in (float(f) for f in args.slow.split(",")):
            found, changes = 0, []
            for i in range(args.pairs):
                print(f"diff_accuracy: rank 1 {fraction:.0%} slower, run {i + 1}", file=sys.stderr)
                slow = root / f"slow-{fraction}-{i}"
                record("straggler-ddp", slow, args, ["--slow-rank", "1", "--slow-fraction",
                                                     str(fraction)])  # fmt: skip
                step = diff(healthy[i], slow)["metrics"]["step_ms"]
                hit = step["called"] and step["change_pct"] > 0
                found += hit
                called = "" if hit else ", not called"
                changes.append(
                    f"{step['change_pct']:+.1f}% (noise {step['noise_pct']:.1f}%{called})"
                )
            label = f"rank 1 {fraction:.0%} slower"
            lines.append(f"{label:<28}{args.pairs:>9}{found:>15}  {', '.join(changes)}")
    lines.append(f"({time.monotonic() - started:.0f} s)")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
