"""The fixed per-step cost of recording, counted in instructions: a tiny model's training step
in one process, bare and under dtprof, run under valgrind (callgrind).

    python benchmarks/step_cost.py [--steps 1000] [--tree PATH ...]

Timing this cost on a shared machine is hopeless below about 50 µs (two identical bare runs
differ by that much); the instructions a process executes in a stretch of its run are the same
from run to run (two bare runs here: within 0.3%). Each mode runs in its own process, which
counts only inside two windows it opens itself (callgrind's client requests, through a tiny C
shim built here), after 50 warm-up steps:

- **steps**: ``--steps`` training steps (every thread; dtprof's writer is told not to flush);
- **flush**: one flush of those steps' rows by dtprof's writer, its tick included (natively,
  at 0.5 s, it flushes about every 1,600 of these steps: charging one flush to ``--steps``
  steps overstates its share a little).

The cost in µs is the extra instructions at the bare step's own rate, measured natively beside.
Modes: bare; hooks, the Python hooks dtprof's phases use (a module's forward pre- and
post-hook, the optimizer's step pre- and post-hook) with empty bodies, what PyTorch charges for
them alone; hooks+backward, those and the backward's in Python (a pre-hook on the output's
autograd node that queues a callback at the pass's end), which the native kernel's C++ hook
replaces; dtprof; dtprof without the native kernel (``DTPROF_NATIVE=0``); and each ``--tree``
(a checkout of dtprof) as dtprof, to compare versions. Needs
valgrind and its headers (Debian: valgrind) and a C compiler.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WINDOW_C = """
#include <valgrind/callgrind.h>
void window_open(void) { CALLGRIND_ZERO_STATS; CALLGRIND_START_INSTRUMENTATION; }
void window_close(const char *name) {
  CALLGRIND_DUMP_STATS_AT(name);
  CALLGRIND_STOP_INSTRUMENTATION;
}
"""
TRAIN = """
import contextlib, ctypes, os, sys, tempfile, time, torch
from torch import nn
torch.set_num_threads(1)
mode, steps = sys.argv[1], int(sys.argv[2])
window = ctypes.CDLL(os.environ["WINDOW_SO"]) if os.environ.get("WINDOW_SO") else None
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(4, 8)
ctx = contextlib.nullcontext()
if mode.startswith("hooks"):  # the hooks dtprof's phases use, doing nothing: PyTorch's charge
    def nothing(*args, **kwargs):
        return None
    def on_gradient(grad):
        torch.autograd.Variable._execution_engine.queue_callback(nothing)
    def on_output(module, args, output):
        output.grad_fn.register_prehook(on_gradient)
    model.register_forward_pre_hook(nothing, with_kwargs=True)
    model.register_forward_hook(on_output if mode == "hooks+backward" else nothing)
    opt.register_step_pre_hook(nothing)
    opt.register_step_post_hook(nothing)
if mode.startswith("dtprof"):
    import dtprof
    ctx = dtprof.profile(tempfile.mkdtemp(), model=model, optimizer=opt, clock_sync=False,
                         flush_interval_s=1e6)  # flushed in its own window below

def train(n):
    for _ in range(n):
        loss = model(x).sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if prof is not None:
            prof.log(loss=loss)
            prof.step()

def flush():
    for tick in prof.writer._tick_hooks:
        tick()
    prof.writer.flush()

with ctx as prof:
    train(50)
    if prof is not None:
        flush()
    if window is None:  # natively: the bare step's time
        start = time.perf_counter_ns()
        train(steps)
        print((time.perf_counter_ns() - start) / steps)
    else:
        window.window_open()
        train(steps)
        window.window_close(b"steps")
        if prof is not None:
            window.window_open()
            flush()
            window.window_close(b"flush")
"""


def build_window(folder: Path) -> Path:
    """The C shim whose two functions open and close a counting window."""
    source, library = folder / "window.c", folder / "window.so"
    source.write_text(WINDOW_C)
    compiler = os.environ.get("CC", "cc")
    subprocess.run([compiler, "-O2", "-shared", "-fPIC", "-o", str(library), str(source)],
                   check=True, capture_output=True)  # fmt: skip
    return library


def windows(mode: str, steps: int, env: dict[str, str], folder: Path) -> dict[str, int]:
    """Instructions counted in each window the training process opened, by window name."""
    out = folder / f"callgrind.{len(list(folder.iterdir()))}"
    done = subprocess.run(
        ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
         sys.executable, "-c", TRAIN, mode, str(steps)],
        capture_output=True, text=True, env=env, timeout=3600,
    )  # fmt: skip
    counts = {}
    for dump in folder.glob(f"{out.name}.*"):
        text = dump.read_text()
        name = re.search(r"^desc: Trigger: Client Request: (\w+)", text, re.M)
        total = re.search(r"^(?:summary|totals): (\d+)", text, re.M)
        if name and total:
            counts[name.group(1)] = int(total.group(1))
    if done.returncode != 0 or "steps" not in counts:
        raise RuntimeError(f"valgrind run failed ({mode}):\n{done.stderr[-2000:]}")
    return counts


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
    p.add_argument("--steps", type=int, default=1000, help="steps counted (default 1000)")
    p.add_argument("--tree", action="append", type=Path, help="a dtprof checkout to measure")
    args = p.parse_args(argv)
    if shutil.which("valgrind") is None:
        print("step_cost: needs valgrind (apt-get install valgrind)", file=sys.stderr)
        return 2
    started = time.monotonic()
    here = Path(__file__).resolve().parent.parent
    modes = [("bare", here), ("hooks", here), ("hooks+backward", here), ("dtprof", here)]
    modes += [("dtprof, DTPROF_NATIVE=0", here)]
    modes += [(str(tree), tree) for tree in args.tree or []]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        base_env = {**os.environ, "PYTHONHASHSEED": "0", "WINDOW_SO": str(build_window(folder))}
        counted = {}
        for name, tree in modes:
            print(f"step_cost: {name} ...", file=sys.stderr, flush=True)
            env = {**base_env, "PYTHONPATH": str(tree)}
            if name.endswith("DTPROF_NATIVE=0"):
                env["DTPROF_NATIVE"] = "0"
            mode = name if tree == here else "dtprof"
            counted[name] = windows(mode, args.steps, env, folder)
    step_ns = native_step_ns(args.steps)
    bare = counted["bare"]["steps"] / args.steps
    rate = bare / step_ns  # instructions per ns of the bare step
    lines = [
        f"one process, MLP 8-8-4, batch 4, prof.log(loss=loss) each step: {args.steps} steps"
        f" counted under valgrind; bare step {step_ns / 1e3:.1f} µs natively,"
        f" {bare:,.0f} instructions",
        f"{'mode':<32}{'steps: instr/step':>18}{'+ flush':>9}{'extra':>10}{'≈ µs':>7}",
    ]
    for name, _ in modes:
        steps = counted[name]["steps"] / args.steps
        flush = counted[name].get("flush", 0) / args.steps
        extra = steps + flush - bare
        lines.append(
            f"{name[:31]:<32}{steps:>18,.0f}{flush:>+9,.0f}{extra:>+10,.0f}"
            f"{extra / rate / 1e3:>+7.1f}"
        )
    lines.append(f"({time.monotonic() - started:.0f} s)")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
