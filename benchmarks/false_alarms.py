"""False alarms: healthy jobs run again and again, analysed; no finding at warning or above
but those their shape gives by design (a pipeline's bubble).

    python benchmarks/false_alarms.py [--runs 5] [--ranks 4] [--steps 60] [--jobs healthy-ddp,fsdp2]

Each run is a real gloo job of a healthy situation (a new seed per run), recorded and analysed
like any user's job, while this machine does whatever else it is doing: the point is natural
jitter. The table lists, per job, how many runs gave a finding at warning or above other than
the expected ones, and which; the exit code is 1 if any did. Traces are temporary.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from dtprof.analysis import analyze
from dtprof.jobs import launch

OPTIONS = {
    "healthy-ddp": "--steps {steps} --device-ms 20 --bucket-mb 0.25",
    "fsdp2": "--steps {steps} --device-ms 20",
    "tensor-parallel": "--steps {steps} --device-ms 40 --width 384 --bucket-mb 0.25",
    "pipeline": "--steps {steps} --device-ms 160 --microbatches 8 --schedule 1f1b",
    "pipeline-fsdp": "--steps {steps} --device-ms 80 --microbatches 4",
}
# what a job's shape gives by design: 1F1B over 4 stages and 8 microbatches idles 3/11 of a step
EXPECTED = {"pipeline": {"pipeline-bubble"}, "pipeline-fsdp": {"pipeline-bubble"}}
SEVERE = ("warning", "error")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--jobs", default=",".join(OPTIONS), help=f"of {', '.join(OPTIONS)}")
    args = p.parse_args(argv)
    jobs = [j.strip() for j in args.jobs.split(",") if j.strip()]
    unknown = sorted(set(jobs) - set(OPTIONS))
    if unknown:
        p.error(f"unknown jobs: {', '.join(unknown)}")

    rows = []
    load_before = os.getloadavg()[0]
    for job in jobs:
        alarms: Counter[str] = Counter()
        flagged = 0
        infos: Counter[str] = Counter()
        for run in range(args.runs):
            tmp = Path(tempfile.mkdtemp(prefix="dtprof-healthy-"))
            try:
                options = OPTIONS[job].format(steps=args.steps).split()
                options += ["--seed", str(run), "--trace", str(tmp / "trace")]
                started = time.monotonic()
                codes = launch.run(job, args.ranks, options, log_dir=tmp / "logs")
                if any(codes):
                    logs = "\n".join(f.read_text()[-2000:] for f in (tmp / "logs").glob("*.log"))
                    sys.exit(f"{job} run {run} failed ({codes}):\n{logs}")
                report = analyze(tmp / "trace")
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            expected = EXPECTED.get(job, set())
            severe = [f for f in report.findings if f.severity in SEVERE and f.code not in expected]
            flagged += bool(severe)
            alarms.update(f"{f.code} {f.ranks}" for f in severe)
            infos.update(
                f.code for f in report.findings if f.severity not in SEVERE or f.code in expected
            )
            print(
                f"[false-alarms] {job} run {run + 1}/{args.runs} "
                f"({time.monotonic() - started:.0f} s): "
                + (
                    ", ".join(f"{f.severity} {f.code} {f.ranks}" for f in report.findings)
                    or "clean"
                ),
                file=sys.stderr,
                flush=True,
            )
        rows.append((job, flagged, alarms, infos))

    print(f"{args.ranks} ranks x {args.steps} steps, {args.runs} runs per job, gloo on CPU")
    print(
        f"machine: {os.cpu_count()} CPUs, load average {load_before:.1f} before, "
        f"{os.getloadavg()[0]:.1f} after\n"
    )
    print(
        f"{'job':<16}{'runs':>6}{'with a warning+':>17}  which (times)            info, or expected"
    )
    for job, flagged, alarms, infos in rows:
        which = ", ".join(f"{k} ({v})" for k, v in alarms.items()) or "-"
        info = ", ".join(f"{k} ({v})" for k, v in infos.items()) or "-"
        print(f"{job:<16}{args.runs:>6}{flagged:>17}  {which:<24} {info}")
    return 1 if any(flagged for _, flagged, _, _ in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
