"""The fixed per-step cost of recording, counted in instructions: a tiny model's training step
in one process, bare and under dtprof, run under valgrind (cachegrind, no cache simulation).

    python benchmarks/step_cost.py [--steps 200,1200] [--tree PATH ...]

Timing this cost on a shared machine is hopeless below about 50 µs (two identical bare runs
differ by that much); the instructions a process executes are the same from run to run.
Each mode runs at two step counts; the difference over the extra steps is the instructions per
step, every thread's (dtprof's writer included: its flush interval is stretched as valgrind
slows the process, so that a flush carries as many steps as it would natively). The cost in
µs is the extra instructions at the bare step's own rate, measured natively beside. Each
``--tree`` (a checkout of dtprof) is measured as dtprof, to compare versions.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

SLOWDOWN = 50  # about how much slower a process runs under valgrind
FLUSH_S = 0.5  # dtprof's default flush interval
TRAIN = """
import contextlib, os, sys, tempfile, time, torch
from torch import nn
torch.set_num_threads(1)
mode, steps = sys.argv[1], int(sys.argv[2])
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(4, 8)
ctx = contextlib.nullcontext()
if mode == "dtprof":
    import dtprof
    ctx = dtprof.profile(tempfile.mkdtemp(), model=model, optimizer=opt, clock_sync=False,
                         flush_interval_s=float(os.environ["FLUSH_S"]))
with ctx as prof:
    start = time.perf_counter_ns()
    for _ in range(steps):
        loss = model(x).sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if prof is not None:
            prof.log(loss=loss)
            prof.step()
print((time.perf_counter_ns() - start) / steps)
"""


def instructions(mode: str, steps: int, tree: Path | None) -> int:
    """Instructions the whole process executed (every thread)."""
    env = {**os.environ, "PYTHONHASHSEED": "0", "FLUSH_S": str(FLUSH_S * SLOWDOWN)}
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    done = subprocess.run(
        ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
         sys.executable, "-c", TRAIN, mode, str(steps)],
        capture_output=True, text=True, env=env, timeout=1800,
    )  # fmt: skip
    found = re.search(r"I\s+refs:\s+([\d,]+)", done.stderr)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"valgrind run failed ({mode}, {steps} steps):\n{done.stderr[-2000:]}")
    return int(found.group(1).replace(",", ""))


def native_step_ns(steps: int, rounds: int = 5) -> float:
    """The bare step's time, natively (median of a few runs)."""
    times = []
    for _ in range(rounds):
        done = subprocess.run(
            [sys.executable, "-c", TRAIN, "bare", str(steps)], capture_output=True, text=True
        )
        times.append(float(done.stdout.split()[-1]))
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", default="200,1200", help="the two step counts (default 200,1200)")
    p.add_argument("--tree", action="append", type=Path, help="a dtprof checkout to measure")
    args = p.parse_args(argv)
    if shutil.which("valgrind") is None:
        print("step_cost: needs valgrind (apt-get install valgrind)", file=sys.stderr)
        return 2
    low, high = (int(n) for n in args.steps.split(","))
    trees: list[Path | None] = list(args.tree or [None])

    def per_step(mode: str, tree: Path | None) -> float:
        a = instructions(mode, low, tree)
        b = instructions(mode, high, tree)
        return (b - a) / (high - low)

    started = time.monotonic()
    bare = per_step("bare", trees[0])
    step_ns = native_step_ns(high)
    rate = bare / step_ns  # instructions per ns of the bare step
    lines = [
        f"one process, MLP 8-8-4, batch 4: {high - low} steps counted under valgrind;"
        f" bare step {step_ns / 1e3:.1f} µs natively, {bare:,.0f} instructions",
        f"{'dtprof':<40}{'instructions/step':>18}{'extra':>12}{'≈ µs':>8}",
    ]
    for tree in trees:
        cost = per_step("dtprof", tree)
        extra = cost - bare
        name = str(tree) if tree is not None else "this checkout"
        lines.append(f"{name:<40}{cost:>18,.0f}{extra:>+12,.0f}{extra / rate / 1e3:>+8.1f}")
    lines.append(f"({time.monotonic() - started:.0f} s)")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
