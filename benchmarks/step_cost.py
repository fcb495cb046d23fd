"""The fixed per-step cost of recording, counted in instructions: a tiny model's training step
in one process, bare and under dtprof, run under valgrind (callgrind).

    python benchmarks/step_cost.py [--steps 1000] [--model tiny|ddp] [--modes ...]
        [--without PIECES] [--sim] [--tree PATH ...]

``--model ddp`` counts overhead.py's own step instead (its DDP model and two buckets, on a
one-rank gloo group, with a region around the batch), with a batch of 1: valgrind runs the
GEMMs of overhead.py's 64 about a thousand times slower than natively, and what dtprof does
per step does not depend on the batch.

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
That is a floor: natively dtprof's per-step code runs cold, between long stretches of torch's
kernels, and ``--sim`` (callgrind's cache and branch simulation) counts what that adds, the
steps' extra cache misses and mispredicted branches.
Modes: bare; hooks, dtprof's phase hooks called as dtprof calls them (the model's forward
through dtprof's TimedForward, the optimizer's step pre- and post-hook) with empty bodies,
what calling them costs alone; hooks+backward, those and the backward's in Python (a pre-hook
on the output's autograd node that queues a callback at the pass's end), which the native
kernel's C++ hook replaces; dtprof; dtprof without the native kernel (``DTPROF_NATIVE=0``);
with ``--without``, dtprof with one piece of its step left out at a time (see ``--help``); and each
``--tree`` (a checkout of dtprof) as dtprof, to compare versions. Needs
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

from dtprof.jobs.launch import free_port

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
ddp = os.environ["STEP_MODEL"] == "ddp"
if ddp:  # overhead.py's model (its buckets) and step, a batch of 1 (valgrind is slow at GEMMs)
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{os.environ['PORT']}",
                            rank=0, world_size=1)
    layers = []
    for _ in range(4):
        layers += [nn.Linear(512, 512), nn.ReLU()]
    model = nn.parallel.DistributedDataParallel(nn.Sequential(*layers, nn.Linear(512, 16)))
    gen = torch.Generator().manual_seed(0)
    def batch():
        return torch.randn(1, 512, generator=gen), torch.randint(0, 16, (1,), generator=gen)
    loss_fn = nn.CrossEntropyLoss()
else:
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
    x = torch.randn(4, 8)
    def batch():
        return x, None
    def loss_fn(out, _):
        return out.sum()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
ctx = contextlib.nullcontext()
if mode.startswith("hooks"):  # dtprof's phase hooks, called as dtprof calls them, doing nothing
    from dtprof.record.phases import time_forward
    def nothing(*args, **kwargs):
        return None
    def on_gradient(grad):
        torch.autograd.Variable._execution_engine.queue_callback(nothing)
    class Nothing:
        native = None  # the Python wrapper, TimedForward
        def forward_begins(self, module, args, kwargs):
            return None
        def forward_ends(self, output):
            if mode == "hooks+backward":
                output.grad_fn.register_prehook(on_gradient)
    time_forward(Nothing(), model)
    opt.register_step_pre_hook(nothing)
    opt.register_step_post_hook(nothing)
without = set(os.environ.get("WITHOUT", "").split(","))  # pieces of dtprof's step left out
if mode.startswith("dtprof"):
    import dtprof
    attached = {} if "model" in without else {"model": model, "optimizer": opt}
    ctx = dtprof.profile(tempfile.mkdtemp(), **attached, clock_sync=False,
                         ddp_buckets="buckets" not in without,
                         flush_interval_s=1e6)  # flushed in its own window below

def train(n):
    for _ in range(n):
        region = prof is not None and ddp and "region" not in without
        with prof.region("data") if region else contextlib.nullcontext():
            x, y = batch()
        loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if prof is not None:
            if "log" not in without:
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


MODELS = {
    "tiny": "MLP 8-8-4, batch 4, prof.log(loss=loss) each step",
    "ddp": "overhead.py's step: DDP on a one-rank gloo group, MLP 4×512 (two buckets), a"
    " region around the batch, prof.log(loss=loss) each step; batch 1, not 64 (valgrind runs"
    " the GEMMs of 64 a thousand times slower than natively)",
}
MODES = ("bare", "hooks", "hooks+backward", "dtprof", "dtprof DTPROF_NATIVE=0")
# --without: dtprof with one piece of its step left out, through the public API
PIECES = {
    "model": "no model and optimizer given: no phase hooks, DDP buckets or samples counted",
    "buckets": "ddp_buckets=False",
    "region": "no region around the batch (--model ddp)",
    "log": "no logged loss",
}


def build_window(folder: Path) -> Path:
    """The C shim whose two functions open and close a counting window."""
    source, library = folder / "window.c", folder / "window.so"
    source.write_text(WINDOW_C)
    compiler = os.environ.get("CC", "cc")
    subprocess.run([compiler, "-O2", "-shared", "-fPIC", "-o", str(library), str(source)],
                   check=True, capture_output=True)  # fmt: skip
    return library


def windows(
    mode: str, steps: int, env: dict[str, str], folder: Path, sim: bool, tree: Path, label: str
) -> dict[str, dict[str, int]]:
    """Callgrind's counts in each window the training process opened, by window name and
    event (Ir, the instructions; with ``sim``, also the simulated caches' misses and the
    mispredicted branches). The process runs in ``tree``: ``python -c`` puts its working folder
    first on the path, ahead of PYTHONPATH, so that a dtprof there would be the one imported."""
    out = folder / f"callgrind.{len(list(folder.iterdir()))}"
    simulate = ["--cache-sim=yes", "--branch-sim=yes"] if sim else []
    done = subprocess.run(
        ["valgrind", "--tool=callgrind", *simulate, "--instr-atstart=no",
         f"--callgrind-out-file={out}", sys.executable, "-c", TRAIN, mode, str(steps)],
        capture_output=True, text=True, env=env, timeout=3600, cwd=tree,
    )  # fmt: skip
    counts = {}
    for dump in folder.glob(f"{out.name}.*"):
        text = dump.read_text()
        name = re.search(r"^desc: Trigger: Client Request: (\w+)", text, re.M)
        events = re.search(r"^events: (.+)$", text, re.M)
        total = re.search(r"^totals: ([\d ]+)$", text, re.M)
        summary = re.search(r"^summary: ([\d ]+)$", text, re.M)
        if name and events and total:
            counts[name.group(1)] = dict(
                zip(events.group(1).split(), map(int, total.group(1).split()), strict=True)
            )
            said, counted = (
                int(summary.group(1).split()[0]) if summary else 0,
                int(total.group(1).split()[0]),
            )
            if summary and abs(said - counted) > 0.01 * counted:  # seen in a flush window
                DISAGREE.append(
                    f"{label}, {name.group(1)}: callgrind's summary says {said:,} instructions,"
                    f" its totals {counted:,} (the table has the totals)"
                )
    if done.returncode != 0 or "steps" not in counts:
        raise RuntimeError(f"valgrind run failed ({mode}):\n{done.stderr[-2000:]}")
    return counts


DISAGREE: list[str] = []  # windows whose two counts differ by over 1%: doubtful figures

# --sim: what the steps' extra instructions cost beyond their number
MISSES = {
    "L1 misses": ("I1mr", "D1mr", "D1mw"),
    "LL misses": ("ILmr", "DLmr", "DLmw"),
    "mispredicted branches": ("Bcm", "Bim"),
}


def native_step_ns(steps: int, env: dict[str, str], rounds: int = 5) -> float:
    """The bare step's time, natively (median of a few runs)."""
    times = []
    for _ in range(rounds):
        done = subprocess.run(
            [sys.executable, "-c", TRAIN, "bare", str(steps)],
            capture_output=True,
            text=True,
            env={**env, "PORT": str(free_port())},
        )
        times.append(float(done.stdout.split()[-1]))
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=1000, help="steps counted (default 1000)")
    p.add_argument("--tree", action="append", type=Path, help="a dtprof checkout to measure")
    p.add_argument(
        "--model",
        choices=MODELS,
        default="tiny",
        help="tiny (default): " + MODELS["tiny"] + "; ddp: " + MODELS["ddp"],
    )
    p.add_argument("--modes", default=",".join(MODES), help=f"of {', '.join(MODES)}")
    p.add_argument(
        "--sim",
        action="store_true",
        help="also simulate the caches and the branch predictor (about twice as slow): the"
        " steps' extra misses and mispredictions per step",
    )
    p.add_argument(
        "--without",
        default="",
        help="also dtprof without each of these pieces, comma-separated: "
        + "; ".join(f"{name} ({doc})" for name, doc in PIECES.items()),
    )
    args = p.parse_args(argv)
    unknown = set(args.modes.split(",")) - set(MODES)
    if unknown:
        p.error(f"unknown modes: {', '.join(sorted(unknown))}")
    args.without = [piece for piece in args.without.split(",") if piece]
    if set(args.without) - set(PIECES):
        p.error(f"unknown pieces: {', '.join(sorted(set(args.without) - set(PIECES)))}")
    if shutil.which("valgrind") is None:
        print("step_cost: needs valgrind (apt-get install valgrind)", file=sys.stderr)
        return 2
    started = time.monotonic()
    here = Path(__file__).resolve().parent.parent
    chosen = ["bare", *(m for m in args.modes.split(",") if m != "bare")]
    modes = [(name, here) for name in MODES if name in chosen]
    modes += [(f"dtprof without {piece}", here) for piece in args.without]
    modes += [(str(tree), tree) for tree in args.tree or []]
    model_env = {"STEP_MODEL": args.model, "PYTHONHASHSEED": "0"}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        base_env = {**os.environ, **model_env, "WINDOW_SO": str(build_window(folder))}
        counted = {}
        for name, tree in modes:
            print(f"step_cost: {name} ...", file=sys.stderr, flush=True)
            env = {**base_env, "PYTHONPATH": str(tree), "PORT": str(free_port())}
            if name.endswith("DTPROF_NATIVE=0"):
                env["DTPROF_NATIVE"] = "0"
            if name.startswith("dtprof without "):
                env["WITHOUT"] = name.removeprefix("dtprof without ")
            mode = name if tree == here else "dtprof"
            counted[name] = windows(mode, args.steps, env, folder, args.sim, tree, name)
    step_ns = native_step_ns(args.steps, {**os.environ, **model_env})
    bare = counted["bare"]["steps"]["Ir"] / args.steps
    rate = bare / step_ns  # instructions per ns of the bare step
    lines = [
        f"one process, {MODELS[args.model]}: {args.steps} steps"
        f" counted under valgrind; bare step {step_ns / 1e3:.1f} µs natively,"
        f" {bare:,.0f} instructions",
        f"{'mode':<32}{'steps: instr/step':>18}{'+ flush':>9}{'extra':>10}{'≈ µs':>7}",
    ]
    for name, _ in modes:
        steps = counted[name]["steps"]["Ir"] / args.steps
        flush = counted[name].get("flush", {"Ir": 0})["Ir"] / args.steps
        extra = steps + flush - bare
        lines.append(
            f"{name[:31]:<32}{steps:>18,.0f}{flush:>+9,.0f}{extra:>+10,.0f}"
            f"{extra / rate / 1e3:>+7.1f}"
        )
    if args.sim:
        lines.append("per step, the steps' window, over bare (simulated):")
        lines.append(f"{'mode':<32}" + "".join(f"{kind:>24}" for kind in MISSES))
        for name, _ in modes:
            extra = [
                sum(counted[name]["steps"][e] - counted["bare"]["steps"][e] for e in events)
                for events in MISSES.values()
            ]
            lines.append(f"{name[:31]:<32}" + "".join(f"{n / args.steps:>+24,.0f}" for n in extra))
    lines += [f"doubtful: {note}" for note in DISAGREE]
    lines.append(f"({time.monotonic() - started:.0f} s)")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
