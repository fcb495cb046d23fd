"""Regenerate the sample traces from real gloo jobs, one folder per situation.

    python sample_traces/generate.py [--only NAME ...] [--out DIR] [--list]

Each sample is a real multi-process gloo job of ``dtprof.jobs`` on this machine's CPU, seeded
(the same weights and batches every run; the timings are this machine's). A sample's folder is
replaced only once its new trace is complete and shows its situation (see evidence.py); when a
job fails, its ranks' logs stay in a temporary folder that the error names.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import evidence  # beside this file, which runs as a script

from dtprof.errors import DtprofError
from dtprof.jobs import launch
from dtprof.trace.reader import Trace, load_trace

HERE = Path(__file__).resolve().parent
TIMEOUT_S = 300

# --device-ms: simulated accelerator time per batch (the host sleeps, as it would while a GPU
# computes), so four ranks sharing two CPU cores still time steadily and alike.
BASE = "--seed 0 --steps 40 --device-ms 20"
DDP = f"{BASE} --bucket-mb 0.25"  # four gradient buckets, reduced while backward goes on
PIPELINE = "--seed 0 --steps 30 --device-ms 160"


@dataclass(frozen=True)
class Sample:
    """One sample trace: the job that records it and the evidence it must show."""

    name: str
    situation: str
    world_size: int
    options: str
    evidence: Callable[[Trace], str]
    crashes: bool = False  # the job fails by design: its ranks exit with errors
    recorded_on: str = ""  # a machine this one is not (a GPU's): the job cannot run here

    @property
    def args(self) -> list[str]:
        return shlex.split(self.options)

    def command(self, trace_dir: str) -> str:
        """The same job as one torchrun command line (or how it was recorded elsewhere)."""
        if self.recorded_on:
            return f"recorded on {self.recorded_on}: {self.options}"
        argv = ["torchrun", "--nproc-per-node", str(self.world_size), "-m", "dtprof.jobs.worker"]
        return shlex.join([*argv, self.situation, "--trace", trace_dir, *self.args])


SAMPLES = (
    Sample("healthy-ddp", "healthy-ddp", 4, DDP, evidence.healthy_ddp),
    Sample(
        "straggler-ddp",
        "straggler-ddp",
        4,
        f"{DDP} --slow-rank 1 --slow-fraction 0.3",
        partial(evidence.straggler, rank=1),
    ),
    Sample(
        "pipeline-gpipe",
        "pipeline",
        4,
        f"{PIPELINE} --schedule gpipe --microbatches 4",
        partial(evidence.pipeline, schedule="ScheduleGPipe", microbatches=4),
    ),
    Sample(
        "pipeline-1f1b",
        "pipeline",
        4,
        f"{PIPELINE} --schedule 1f1b --microbatches 8",
        partial(evidence.pipeline, schedule="Schedule1F1B", microbatches=8),
    ),
    Sample("poor-overlap", "poor-overlap", 4, BASE, evidence.poor_overlap),
    Sample(
        "divergence",
        "divergence",
        4,
        f"{DDP} --fingerprint-every 1 --perturb-rank 2 --perturb-step 10"
        " --nan-rank 1 --nan-step 30",
        partial(evidence.divergence, perturb_rank=2, perturb_step=10, nan_rank=1, nan_step=30),
    ),
    Sample(
        "data-stall",
        "data-stall",
        4,
        f"{DDP} --slow-rank 3 --stall-every 5 --stall-ms 100",
        partial(evidence.data_stall, rank=3, every=5, stall_ms=100),
    ),
    Sample("fsdp2", "fsdp2", 2, BASE, evidence.fsdp2),
    Sample(
        "pipeline-slow-stage",
        "pipeline",
        4,
        f"{PIPELINE} --schedule 1f1b --microbatches 8 --fault slow-stage --culprit 2"
        " --magnitude 0.5",
        partial(evidence.slow_stage, rank=2, microbatches=8),
    ),
    Sample(
        "slow-link",
        "tensor-parallel",
        4,
        "--seed 0 --steps 40 --device-ms 40 --width 384 --bucket-mb 0.25 --fault slow-link"
        " --culprit 2 --onset 0 --magnitude 4",
        partial(evidence.slow_link, ranks=[2, 3], slowdown=4),
    ),
    # no device time: the gradients' all-reduce outlasts the compute it could hide under
    Sample("comm-bound-ddp", "fault", 4, "--seed 0 --steps 40", evidence.comm_bound),
    Sample(
        "crash-at-start",
        "fault",
        4,
        f"{DDP} --fault exception --culprit 1 --onset 0",
        partial(evidence.crash_at_start, rank=1),
        crashes=True,
    ),
    Sample(
        "gpu-straggler",
        "gpu_check",
        2,
        "bash benchmarks/gpu_check.sh (part 2: two processes sharing the GPU over gloo)",
        partial(evidence.gpu_straggler, rank=1, extra_ms=30.0),
        recorded_on="an NVIDIA H200 (torch 2.11.0+cu130)",
    ),
)


class Failed(Exception):
    """A sample could not be made; the message is one line for the terminal."""


def make(sample: Sample, out: Path) -> str:
    """Record ``sample`` into ``out/<name>``, replacing the old folder; returns its evidence."""
    if sample.recorded_on:
        raise Failed(
            f"{sample.name}: recorded on {sample.recorded_on}, not here ({sample.options})"
        )
    target = out / sample.name
    fresh = out / f".{sample.name}.new"
    shutil.rmtree(fresh, ignore_errors=True)
    logs = Path(tempfile.mkdtemp(prefix=f"dtprof-sample-{sample.name}-"))
    try:
        args = ["--trace", str(fresh), *sample.args]
        codes = launch.run(sample.situation, sample.world_size, args, TIMEOUT_S, logs)
        if sample.crashes and all(code > 0 for code in codes):
            pass  # every rank raised: the situation itself
        elif any(codes):
            raise Failed(f"{sample.name}: {_failure(codes, logs)}")
        try:
            line = sample.evidence(load_trace(fresh))
        except (evidence.Missing, DtprofError) as exc:
            kept = logs / "trace"
            shutil.move(fresh, kept)
            raise Failed(
                f"{sample.name}: the new trace lacks the evidence: {exc} (trace in {kept})"
            ) from None
        _replace(target, fresh)
    finally:
        shutil.rmtree(fresh, ignore_errors=True)
    shutil.rmtree(logs)
    return line


def _failure(codes: list[int], logs: Path) -> str:
    # the launcher kills the other ranks once one fails: name the one that failed itself
    raised = [r for r, c in enumerate(codes) if c > 0]
    if raised:
        rank = raised[0]
        return f"rank {rank} exited with code {codes[rank]}; see {logs / f'rank-{rank}.log'}"
    return f"ranks killed (codes {codes}), a hang past {TIMEOUT_S} s?; see {logs}"


def _replace(target: Path, fresh: Path) -> None:
    """Put ``fresh`` at ``target`` by renames in one folder; the old copy is removed last."""
    old = target.with_name(f".{target.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        target.rename(old)
    fresh.rename(target)
    shutil.rmtree(old, ignore_errors=True)


def _kib(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) // 1024


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    names = [s.name for s in SAMPLES]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", nargs="+", choices=names, metavar="NAME", help=", ".join(names))
    p.add_argument("--out", type=Path, default=HERE, help="parent folder (default: beside this)")
    p.add_argument("--list", action="store_true", help="print each job's command line and exit")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    chosen = [s for s in SAMPLES if not args.only or s.name in args.only]
    if args.list:
        for sample in chosen:
            print(f"{sample.name}: {sample.command(str(args.out / sample.name))}")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.only:  # all of them: those recorded on another machine stay as they are
        for sample in chosen:
            if sample.recorded_on:
                print(f"{sample.name}: recorded on {sample.recorded_on}, kept", file=sys.stderr)
        chosen = [s for s in chosen if not s.recorded_on]
    for i, sample in enumerate(chosen, 1):
        print(f"[{i}/{len(chosen)}] {sample.name} ...", file=sys.stderr, flush=True)
        started = time.monotonic()
        try:
            line = make(sample, args.out)
        except Failed as exc:
            print(f"generate.py: error: {exc}", file=sys.stderr)
            return 1
        took = time.monotonic() - started
        kib = _kib(args.out / sample.name)
        print(f"    {took:.0f} s, {kib} KiB: {line}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
