"""Accuracy: faults planted at random in real gloo jobs, each run analysed and scored.

    python benchmarks/accuracy.py [--seed 0] [--trials 60] [--kinds straggler,hang,...]
                                  [--load N] [--ranks 4] [--keep DIR | --rescore DIR]

Each trial draws, from the seed, a kind of fault, the rank it is planted on, the step it starts
at and its size; runs the job (dtprof.jobs.faults, one process per rank); analyses the trace as
``dtprof analyze`` does; and scores the findings against what was planted:

- localized: a finding of the kind's code names exactly the culprit rank(s);
- onset: that finding's first step is the planted onset, within the kind's tolerance (a fault
  that starts in the warm-up steps the checks skip is expected at the first analysed step);
- precise: no finding at warning or above other than that one and the kind's declared
  consequences (a killed rank makes the others fail; a slow stage makes a bubble);
- healthy kinds: no finding at warning or above at all.

Kinds run in turn (trial i is the i-th kind of the list, round and round), so 60 trials cover
every kind about three times. ``--load N`` keeps N busy processes running beside the jobs: the
thresholds must hold on a busy host. The table goes to stdout, progress and every miss (with
the findings it got and the job's command line) to stderr. Exit code 1 when any trial missed.
``--rescore DIR`` runs no job: it analyses again the traces that ``--keep DIR`` kept (the same
--seed, --trials, --kinds and --ranks draw the same trials), to try a change to a check.

To measure another checkout, run this script from inside it: its jobs start with ``python -m
dtprof.jobs.worker`` in the working folder, which Python puts ahead of PYTHONPATH, so that a
PYTHONPATH set to another checkout changes the analysis here but not the recording in the jobs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from dtprof.analysis import Report, analyze
from dtprof.jobs import launch

DDP = "--steps 40 --device-ms 20 --bucket-mb 0.25 --fingerprint-every 5"
PIPELINE = "--steps 30 --device-ms 160 --microbatches 8"
TENSOR_PARALLEL = "--steps 40 --device-ms 40 --width 384 --bucket-mb 0.25 --fingerprint-every 5"
SEVERE = ("warning", "error")
JOB_TIMEOUT_S = 240


@dataclass(frozen=True)
class Kind:
    """A kind of fault: the job it is planted in, how its place and size are drawn, and what
    the analysis must say about it."""

    name: str
    situation: str
    options: str
    fault: str
    codes: tuple[str, ...]  # findings that may name the culprit (none: a healthy run)
    magnitude: tuple[float, float] = (0.0, 0.0)  # drawn log-uniformly between the two
    onset: tuple[int, int] = (0, 0)  # drawn uniformly, both ends included
    early: int = 0  # onset tolerance: the finding may start this many steps before it
    late: int = 0  # and this many after it
    consequences: tuple[str, ...] = ()  # codes the fault may cause beside its own finding
    extra: str = ""  # options of the kind; {draws} filled in (see draw())
    hang: bool = False  # the job never ends: stopped once its ranks are stuck
    group: int = 1  # the fault acts on the culprit's group of this many consecutive ranks

    def culprits(self, culprit: int) -> list[int]:
        """The ranks a finding must name: the culprit's group."""
        first = culprit - culprit % self.group
        return list(range(first, first + self.group))

    @property
    def steps(self) -> int:
        """The job's ``--steps``."""
        words = shlex.split(self.options)
        return int(words[words.index("--steps") + 1])


KINDS = (
    Kind("healthy-compute-bound", "fault", DDP, "none", ()),
    Kind(
        "healthy-comm-bound",
        "fault",
        "--steps 40 --fingerprint-every 5",  # no device time: gradients outweigh compute
        "none",
        (),
    ),
    Kind(
        "chronic-straggler",
        "fault",
        DDP,
        "chronic-straggler",
        ("straggler",),
        magnitude=(0.05, 2.0),
        onset=(0, 16),
        early=2,
        late=2,
    ),
    Kind(
        "transient-straggler",
        "fault",
        DDP,
        "transient-straggler",
        ("straggler",),
        magnitude=(0.3, 2.0),
        onset=(8, 20),
        early=1,
        late=1,
        extra="--duration {duration}",
    ),
    Kind("non-finite", "fault", DDP, "non-finite", ("non-finite",), onset=(5, 35)),
    Kind(
        "perturbed-replica",
        "fault",
        DDP,
        "perturbed-replica",
        ("replica-divergence",),
        magnitude=(1e-4, 1e-2),
        onset=(5, 30),
        late=4,  # fingerprints every 5 steps: the first one at or after the onset
    ),
    Kind(
        "data-stall",
        "fault",
        DDP,
        "data-stall",
        ("data-stall",),
        magnitude=(50, 300),
        onset=(4, 20),
        late=1,
        extra="--period {period}",
    ),
    Kind(
        "hang",
        "fault",
        f"{DDP} --hang-timeout-s 2",
        "hang",
        ("hang",),
        onset=(3, 30),
        hang=True,
    ),
    Kind(
        "killed",
        "fault",
        DDP,
        "killed",
        ("rank-stopped",),
        onset=(3, 30),
        early=1,
        consequences=("rank-stopped", "hang"),
    ),
    Kind(
        "memory-leak",
        "fault",
        DDP.replace("--steps 40", "--steps 80"),
        "memory-leak",
        ("memory-growth",),
        magnitude=(5, 10),
        onset=(4, 18),
        early=2,
        late=2,
        # the leak is in the data loader: making and keeping its batches takes time there, and
        # the growing heap slows the rank's compute too (the report ties both to the leak)
        consequences=("data-stall", "straggler"),
    ),
    Kind(
        "loss-spike",
        "fault",
        DDP,
        "loss-spike",
        ("loss-spike",),
        magnitude=(2.5, 20),
        onset=(6, 35),
    ),
    Kind(
        "slow-stage-gpipe",
        "pipeline",
        f"{PIPELINE} --schedule gpipe",
        "slow-stage",
        ("slow-stage",),
        magnitude=(0.3, 2.0),
        consequences=("pipeline-bubble",),
        early=1,
        late=1,
    ),
    Kind(
        "slow-stage-1f1b",
        "pipeline",
        f"{PIPELINE} --schedule 1f1b",
        "slow-stage",
        ("slow-stage",),
        magnitude=(0.3, 2.0),
        consequences=("pipeline-bubble",),
        early=1,
        late=1,
    ),
    Kind(
        "slow-rank-2d",
        "pipeline-fsdp",
        "--steps 30 --device-ms 80 --microbatches 4",
        "slow-rank",
        ("slow-stage", "straggler"),
        magnitude=(0.3, 2.0),
        consequences=("pipeline-bubble",),
        early=1,
        late=1,
    ),
    Kind("healthy-tensor-parallel", "tensor-parallel", TENSOR_PARALLEL, "none", ()),
    Kind(
        "slow-link",
        "tensor-parallel",
        TENSOR_PARALLEL,
        "slow-link",
        ("slow-link",),
        magnitude=(2.5, 10.0),  # the culprit's tensor-parallel pair: its all-reduces that slow
        group=2,
    ),
    Kind(
        "exception-at-start",
        "fault",
        DDP,
        "exception",
        ("rank-stopped",),
        consequences=("rank-stopped", "hang"),
    ),
    Kind(
        "exception-mid-run",
        "fault",
        DDP,
        "exception",
        ("rank-stopped",),
        onset=(3, 30),
        consequences=("rank-stopped", "hang"),
    ),
)
BY_NAME = {k.name: k for k in KINDS}


@dataclass
class Trial:
    """One drawn fault, and what its analysis said."""

    number: int
    kind: Kind
    culprit: int
    onset: int
    magnitude: float
    draws: dict[str, int]
    argv: list[str] = field(default_factory=list)
    findings: list[dict] = field(default_factory=list)
    failure: str = ""  # the job or the analysis failed: every score is a miss
    localized: bool = False
    onset_ok: bool = False
    false_warnings: list[str] = field(default_factory=list)

    @property
    def healthy(self) -> bool:
        return not self.kind.codes

    @property
    def hit(self) -> bool:
        if self.failure:
            return False
        if self.healthy:
            return not self.false_warnings
        return self.localized and self.onset_ok and not self.false_warnings


def draw(kind: Kind, rng: random.Random, ranks: int, number: int) -> Trial:
    """A trial of this kind, placed and sized by rng."""
    culprit = rng.randrange(ranks)
    onset = rng.randint(*kind.onset)
    lo, hi = kind.magnitude
    magnitude = math.exp(rng.uniform(math.log(lo), math.log(hi))) if lo > 0 else 0.0
    draws = {"duration": rng.randint(6, 15), "period": rng.randint(3, 6)}
    return Trial(number, kind, culprit, onset, magnitude, draws)


def job_args(trial: Trial, trace: Path, seed: int) -> list[str]:
    k = trial.kind
    return [
        "--trace",
        str(trace),
        "--seed",
        str(seed),
        *shlex.split(k.options),
        *shlex.split(k.extra.format(**trial.draws)),
        "--fault",
        k.fault,
        "--culprit",
        str(trial.culprit),
        "--onset",
        str(trial.onset),
        "--magnitude",
        f"{trial.magnitude:.6g}",
    ]


def run_job(trial: Trial, ranks: int, trace: Path, logs: Path, seed: int) -> str:
    """Run the trial's job to its end (or, for a hang, until its ranks are stuck); returns
    "" or why it failed."""
    args = job_args(trial, trace, seed)
    trial.argv = ["-m", "dtprof.jobs.worker", trial.kind.situation, *args]
    procs = launch.start(trial.kind.situation, ranks, args, log_dir=logs)
    if trial.kind.hang:
        stuck = _wait_stuck(trace, procs, trial.culprit, JOB_TIMEOUT_S)
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
        return "" if stuck else f"the ranks never got stuck within {JOB_TIMEOUT_S} s"
    codes = launch.wait(procs, JOB_TIMEOUT_S)
    planted_failure = trial.kind.fault in ("killed", "exception")
    if any(codes) and not planted_failure:
        log = (logs / f"rank-{codes.index(next(c for c in codes if c))}.log").read_text()
        return f"exit codes {codes}: {log.strip().splitlines()[-1] if log.strip() else ''}"
    return ""


STUCK_S = 4.0  # a rank's in-flight list unchanged this long: it waits in a collective


def _wait_stuck(
    trace: Path, procs: list[subprocess.Popen[bytes]], culprit: int, timeout_s: float
) -> bool:
    """Wait until every rank but the culprit has had something in flight for STUCK_S (the
    watchdog has recorded it by then), or a rank exits, or the timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            return False
        stuck = 0
        for rank in range(len(procs)):
            if rank == culprit:
                continue
            f = trace / f"rank={rank:05d}" / "inflight.json"
            try:
                busy = bool(json.loads(f.read_text()))
                age = time.time() - f.stat().st_mtime
            except (OSError, ValueError):
                continue
            stuck += busy and age > STUCK_S
        if stuck == len(procs) - 1:
            time.sleep(1.0)  # the hang events' flush
            return True
        time.sleep(0.5)
    return False


def score(trial: Trial, report: Report) -> None:
    k = trial.kind
    trial.findings = [f.to_json() for f in report.sorted_findings()]
    warmup = max(2, k.steps // 10)
    # a fault in the warm-up steps the checks skip is expected at the first analysed step;
    # stops and hangs are read whenever they happen
    exact = {"hang", "rank-stopped", "non-finite", "loss-spike", "replica-divergence"}
    expected = trial.onset if exact & set(k.codes) else max(trial.onset, warmup)
    culprits = k.culprits(trial.culprit)
    own = [f for f in report.findings if f.code in k.codes and sorted(f.ranks) == culprits]
    trial.localized = bool(own)
    if own:
        first = min((f.first_step for f in own if f.first_step is not None), default=None)
        trial.onset_ok = first is not None and expected - k.early <= first <= expected + k.late
    for f in report.findings:
        if f.severity not in SEVERE or f in own:
            continue
        if f.code in k.consequences:
            continue
        trial.false_warnings.append(f"{f.severity} {f.code} {f.ranks}")


def _load(n: int) -> list[subprocess.Popen[bytes]]:
    """n processes that keep a CPU busy each."""
    spin = "while True: pass"
    return [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(n)]


def _describe(t: Trial) -> str:
    size = f", magnitude {t.magnitude:.3g}" if t.magnitude else ""
    extra = t.kind.extra.format(**t.draws)
    return f"culprit {t.culprit}, onset {t.onset}{size}{', ' + extra if extra else ''}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--trials", type=int, default=60)
    p.add_argument("--kinds", default=",".join(BY_NAME), help=", ".join(BY_NAME))
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--load", type=int, default=0, help="busy processes beside the jobs")
    p.add_argument("--keep", type=Path, help="keep each trial's trace and logs under DIR")
    p.add_argument(
        "--rescore",
        type=Path,
        metavar="DIR",
        help="run no job: analyse again the traces a run with the same --seed, --trials, "
        "--kinds and --ranks kept in DIR (after a change to the analysis)",
    )
    args = p.parse_args(argv)
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    unknown = sorted(set(kinds) - set(BY_NAME))
    if unknown:
        p.error(f"unknown kinds: {', '.join(unknown)}")
    rng = random.Random(args.seed)
    trials = [draw(BY_NAME[kinds[i % len(kinds)]], rng, args.ranks, i) for i in range(args.trials)]

    load_before = os.getloadavg()[0]
    loaders = [] if args.rescore else _load(args.load)
    started = time.monotonic()
    try:
        for t in trials:
            if args.rescore:
                _rescore(t, args)
            else:
                _run_trial(t, args)
    finally:
        for proc in loaders:
            proc.kill()
    took = time.monotonic() - started
    _table(trials, args, load_before, took)
    return 1 if any(not t.hit for t in trials) else 0


def _run_trial(t: Trial, args: argparse.Namespace) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="dtprof-accuracy-"))
    begun = time.monotonic()
    try:
        trace, logs = tmp / "trace", tmp / "logs"
        t.failure = run_job(t, args.ranks, trace, logs, seed=args.seed * 1000 + t.number)
        if not t.failure:
            try:
                score(t, analyze(trace))
            except Exception as exc:  # the analysis itself failed: a miss, shown
                t.failure = f"analysis raised {type(exc).__name__}: {exc}"
        if args.keep:
            dest = args.keep / f"{t.number:03d}-{t.kind.name}"
            shutil.rmtree(dest, ignore_errors=True)
            shutil.copytree(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    verdict = "ok" if t.hit else "MISS"
    print(
        f"[accuracy] {t.number + 1}/{args.trials} {t.kind.name} ({_describe(t)}): {verdict} "
        f"({time.monotonic() - begun:.0f} s)",
        file=sys.stderr,
        flush=True,
    )
    if not t.hit:
        _print_miss(t, args.ranks)


def _rescore(t: Trial, args: argparse.Namespace) -> None:
    """Score a kept trial's trace with this analysis."""
    trace = args.rescore / f"{t.number:03d}-{t.kind.name}" / "trace"
    if not trace.is_dir():
        t.failure = f"{trace} was not kept"
    else:
        t.argv = ["-m", "dtprof.jobs.worker", t.kind.situation, *job_args(t, trace, 0)]
        try:
            score(t, analyze(trace))
        except Exception as exc:
            t.failure = f"analysis raised {type(exc).__name__}: {exc}"
    if not t.hit:
        print(f"[accuracy] {t.number + 1} {t.kind.name} ({_describe(t)}): MISS", file=sys.stderr)
        _print_miss(t, args.ranks)


def _print_miss(t: Trial, ranks: int) -> None:
    why = []
    if t.failure:
        why.append(t.failure)
    elif not t.healthy:
        if not t.localized:
            named = ", ".join(map(str, t.kind.culprits(t.culprit)))
            why.append(f"no {' or '.join(t.kind.codes)} finding naming ranks {named}")
        elif not t.onset_ok:
            why.append(f"onset outside [-{t.kind.early}, +{t.kind.late}] of step {t.onset}")
    if t.false_warnings:
        why.append(f"false: {', '.join(t.false_warnings)}")
    print(f"    miss: {'; '.join(why)}", file=sys.stderr)
    for f in t.findings:
        print(
            f"    got: {f['severity']} {f['code']} ranks {f['ranks']} steps "
            f"{f['first_step']}-{f['last_step']}: {f['message']}",
            file=sys.stderr,
        )
    print(
        f"    job: torchrun --nproc-per-node {ranks} {shlex.join(t.argv)}",
        file=sys.stderr,
        flush=True,
    )


def _table(trials: list[Trial], args: argparse.Namespace, load_before: float, took: float) -> None:
    by_kind: dict[str, list[Trial]] = defaultdict(list)
    for t in trials:
        by_kind[t.kind.name].append(t)
    if args.rescore:
        print(f"seed {args.seed}, {len(trials)} trials kept in {args.rescore}, analysed again")
    else:
        print(
            f"seed {args.seed}, {len(trials)} trials, {args.ranks} ranks, gloo on CPU, "
            f"{args.load} busy processes beside; {took / 60:.1f} min"
        )
    print(
        f"machine: {os.cpu_count()} CPUs, load average {load_before:.1f} before, "
        f"{os.getloadavg()[0]:.1f} after\n"
    )
    print("| kind | trials | localized | onset | no false warning | all right |")
    print("|---|---|---|---|---|---|")
    faults = [t for t in trials if not t.healthy]
    for name, ts in by_kind.items():
        healthy = ts[0].healthy
        loc = "-" if healthy else _share(t.localized and not t.failure for t in ts)
        ons = "-" if healthy else _share(t.onset_ok and not t.failure for t in ts)
        clean = _share(not t.false_warnings and not t.failure for t in ts)
        print(f"| {name} | {len(ts)} | {loc} | {ons} | {clean} | {_share(t.hit for t in ts)} |")
    healthy = [t for t in trials if t.healthy]
    print(
        f"| **all** | {len(trials)} | {_share(t.localized and not t.failure for t in faults)} "
        f"| {_share(t.onset_ok and not t.failure for t in faults)} "
        f"| {_share(not t.false_warnings and not t.failure for t in trials)} "
        f"| {_share(t.hit for t in trials)} |"
    )
    if healthy:
        print(f"\nhealthy runs with no warning: {_share(t.hit for t in healthy)}")


def _share(flags: object) -> str:
    values = list(flags)  # type: ignore[call-overload]
    return f"{sum(values)}/{len(values)}" if values else "-"


if __name__ == "__main__":
    sys.exit(main())
