"""Where recording's time goes on the training thread, natively: the time spent inside each of
dtprof's per-step functions, measured in place on overhead.py's training step.

    python benchmarks/hook_time.py [--steps 300] [--rounds 3] [--session] [--micro-batches N]
                                   [--tree PATH ...]

Every function of dtprof's that the training thread runs at every step (the phase hooks,
``prof.step()``, ``prof.log()``; also, inside the forward's beginning, the counting of the
forward pass's samples, shown apart and not summed) is wrapped in a timer, a region is timed
whole (from before its call to its block, and from its block's end on: its entry and its exit,
whether Python or, where the kernel makes regions, C), and
overhead.py's step (DDP on a one-rank gloo group, MLP 4×512, batch 64, a region around the
batch, the loss logged) runs ``--steps`` steps after 20 warm-up ones. ``--session`` records
the step as ``dtprof run`` and the integrations do (dtprof.record.auto's session, told the
model; the script calls no region, log or step: the session's methods, which torch's wrapped
functions and hooks call, are timed instead). ``--micro-batches N`` runs N forward and backward
passes per optimizer step (gradient accumulation). The timer sees what a
function costs where it runs: between torch's kernels, which push dtprof's code and data out
of the caches, so that a few lines of Python cost microseconds there (the same calls in a
tight loop cost a tenth of that). A few µs timed directly are precise (p10 about 15% under the
median), where the whole step's time varies by ±50 µs from one block of steps to the next.
The timer's own wrapper adds well under a microsecond to each call.

Not in these figures: the native kernel's C++ (where it loads: the forward's wrapper, the
optimizer's hooks, the backward's hook, DDP's buckets; its forms of ``prof.step()`` and
``prof.log()`` are timed, as ``Profiler.step`` and ``Profiler.log``, where the profiler uses
them), the writer thread
(benchmarks/writer_cost.py measures it), and the cost of the way the forward's phase hooks are
called. Those lines stay empty where the kernel times the phases. dtprof times the forward with a
wrapper set as the model's ``forward`` (the kernel's ForwardTimer, else
dtprof.record.phases.TimedForward); older trees used a forward pre-hook and a forward hook, with
which a module takes the slow path of ``nn.Module.__call__``. The last lines measure the ways
apart: the same model called with two empty hooks, through this checkout's TimedForward with
phase hooks that do nothing, through this checkout's forward under ``profile()`` (the kernel's
wrapper doing all its work, where it loads), and plainly, in blocks of 10 steps in a random
order, timed from the call to the start of the model's ``forward`` and from its end to the
return.

Each ``--tree`` (a dtprof checkout; default this one) runs in its own process, the trees in
turn, ``--rounds`` times; the table gives, per function and tree, the median time of a call
and the time per step (all its calls; a function that does not run at every step, such as
reading memory, shows its share), each the median over rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from dtprof.jobs.launch import free_port

# what the training thread runs at every step, where it calls into dtprof
FUNCTIONS = (
    "dtprof.record.phases:PhaseHooks.forward_begins",  # called by TimedForward
    "dtprof.record.phases:PhaseHooks._forward_pre",  # a forward pre-hook, in older trees
    "dtprof.record.throughput:StepWork.forward_begins",  # inside the above: the samples counted
    "dtprof.record.phases:PhaseHooks.forward_ends",
    "dtprof.record.phases:PhaseHooks._forward_post",
    "dtprof.record.phases:PhaseHooks._optimizer_pre",
    "dtprof.record.phases:PhaseHooks._optimizer_post",
    "dtprof.record.phases:PhaseHooks._backward_begins",  # the backward in Python only
    "dtprof.record.phases:PhaseHooks._backward_ends",
    "dtprof.record.auto:Session.backward",  # dtprof run's session (--session)
    "dtprof.record.auto:Session.optimizer_pre",
    "dtprof.record.auto:Session.optimizer_post",
    "dtprof.record.profiler:Profiler.log",
    "dtprof.record.profiler:Profiler.step",
    "dtprof.record.memory:StepMemory.step_ends",  # inside the above: memory, when due
    "dtprof.record.phases:PhaseHooks._step_ends",  # its phases' end, in Python only
    "dtprof.record.phases:PhaseHooks.step_ends",  # the same, in older trees
)
# shown for their share of the one above them, not summed
NESTED = (
    "StepWork.forward_begins",
    "StepMemory.step_ends",
    "PhaseHooks._step_ends",
    "PhaseHooks.step_ends",
)
REGION = "a region, whole"  # TRAIN times it in the step itself (entry and exit, Python or C)
INSIDE_THE_SESSION = ("Profiler.log", "Profiler.step")  # called by Session.optimizer_post
# overhead.py's model and step, on a one-rank gloo group: what both processes below train
MODEL = """
import os, sys, time, torch
import torch.distributed as dist
from torch import nn
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{os.environ['PORT']}",
                        rank=0, world_size=1)
torch.manual_seed(0)
layers = []
for _ in range(4):
    layers += [nn.Linear(512, 512), nn.ReLU()]
model = nn.parallel.DistributedDataParallel(nn.Sequential(*layers, nn.Linear(512, 16)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loss_fn = nn.CrossEntropyLoss()
gen = torch.Generator().manual_seed(0)
now = time.perf_counter_ns
"""
TRAIN = (
    MODEL
    + """
import contextlib, importlib, json, tempfile
import dtprof
steps = int(sys.argv[1])
times = {}
for target in json.loads(os.environ["FUNCTIONS"]):
    module, qualname = target.split(":")
    owner_name, name = qualname.split(".")
    owner = getattr(importlib.import_module(module), owner_name, None)
    inner = getattr(owner, name, None)
    if inner is None:  # not in this tree
        continue
    spent = times[qualname] = []
    def timed(*args, __inner=inner, __spent=spent, **kwargs):
        start = now()
        try:
            return __inner(*args, **kwargs)
        finally:
            __spent.append(now() - start)
    setattr(owner, name, timed)
micro_batches = int(os.environ["MICRO_BATCHES"])
region_spent = times["a region, whole"] = []
def train(n):
    for _ in range(n):
        opt.zero_grad(set_to_none=True)
        for _ in range(micro_batches):
            if prof is not None:
                before = now()
                with prof.region("data"):
                    entered = now()
                    x = torch.randn(64, 512, generator=gen)
                    y = torch.randint(0, 16, (64,), generator=gen)
                    leaving = now()
                region_spent.append(entered - before + now() - leaving)
            else:
                x = torch.randn(64, 512, generator=gen)
                y = torch.randint(0, 16, (64,), generator=gen)
            loss = loss_fn(model(x), y)
            loss.backward()
        opt.step()
        if prof is not None:
            prof.log(loss=loss)
            prof.step()
if os.environ["SESSION"] == "1":  # as dtprof run records it: the script calls nothing
    from dtprof.record import auto
    session = auto.open_session(tempfile.mkdtemp(), {"clock_sync": False}, starts_itself=False)
    session.start()
    session.use_model(model)
    recording = contextlib.nullcontext()  # prof: None
else:
    session = None
    recording = dtprof.profile(tempfile.mkdtemp(), model=model, optimizer=opt, clock_sync=False)
with recording as prof:
    recorder = prof if prof is not None else session.prof
    for name in ("step", "log"):  # the kernel's forms of Profiler.step and .log: timed as them
        native_form = vars(recorder).get(name)
        if native_form is None:
            continue
        spent = times[f"Profiler.{name}"] = []
        def timed(*args, __inner=native_form, __spent=spent, **kwargs):
            start = now()
            try:
                return __inner(*args, **kwargs)
            finally:
                __spent.append(now() - start)
        setattr(recorder, name, timed)
    train(20)
    for spent in times.values():
        spent.clear()
    start = now()
    train(steps)
    step_ns = (now() - start) / steps
if session is not None:
    session.end()
dist.destroy_process_group()
print(json.dumps({"step_ns": step_ns, "times": times}))
"""
)


CALLING = (
    MODEL
    + """
import json, random, statistics, tempfile
import dtprof
from dtprof.record.phases import release_forward, time_forward
rounds = int(sys.argv[1])
DDP = nn.parallel.DistributedDataParallel
forward = DDP.forward
edges = {}
def timed_forward(self, *args, **kwargs):
    edges["in"] = now()
    out = forward(self, *args, **kwargs)
    edges["out"] = now()
    return out
DDP.forward = timed_forward
def nothing(*args, **kwargs):
    return None
class Nothing:  # dtprof's phase hooks in Python, doing nothing
    native = None  # the Python wrapper, TimedForward
    def forward_begins(self, module, args, kwargs):
        return None
    def forward_ends(self, output):
        return None
ways = ("none", "hooks", "timed_forward", "profiled")
extra = {way: [] for way in ways}
for r in range(rounds):
    for way in random.Random(r).sample(ways, len(ways)):
        handles, timed, prof = [], None, None
        if way == "hooks":
            handles = [model.register_forward_pre_hook(nothing, with_kwargs=True),
                       model.register_forward_hook(nothing)]
        elif way == "timed_forward":
            timed = time_forward(Nothing(), model)
        elif way == "profiled":
            prof = dtprof.profile(tempfile.mkdtemp(), model=model, clock_sync=False)
            prof.__enter__()
        for i in range(11):
            x = torch.randn(64, 512, generator=gen)
            y = torch.randint(0, 16, (64,), generator=gen)
            start = now()
            out = model(x)
            end = now()
            loss = loss_fn(out, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if prof is not None:
                prof.step()  # the first step's passes count its FLOPs, as dtprof does once
            if i:  # the first step of a block is dropped
                extra[way].append((edges["in"] - start) + (end - edges["out"]))
        for handle in handles:
            handle.remove()
        if timed is not None:
            release_forward(timed)
        if prof is not None:
            prof.__exit__(None, None, None)
dist.destroy_process_group()
none = statistics.median(extra["none"])
print(json.dumps({way: statistics.median(extra[way]) - none for way in ways[1:]}))
"""
)


def calling_ns(rounds: int) -> dict[str, float]:
    """What calling the model costs over a plain call, in ns: with two empty hooks, through
    this checkout's TimedForward with phase hooks that do nothing, and under profile()."""
    here = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PORT": str(free_port()), "PYTHONPATH": str(here)}
    done = subprocess.run(
        [sys.executable, "-c", CALLING, str(rounds)],
        capture_output=True,
        text=True,
        env=env,
        cwd=here,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the calling process failed:\n{done.stderr[-2000:]}")
    result: dict[str, float] = json.loads(done.stdout.splitlines()[-1])
    return result


def run_once(tree: Path, args: argparse.Namespace) -> dict[str, object]:
    """One process on ``tree``: the step's time and each function's call times."""
    env = {
        **os.environ,
        "PYTHONPATH": str(tree),
        "PORT": str(free_port()),
        "FUNCTIONS": json.dumps(FUNCTIONS),
        "SESSION": "1" if args.session else "0",
        "MICRO_BATCHES": str(args.micro_batches),
    }
    # run in the tree: `python -c` puts the working folder first on the path, ahead of
    # PYTHONPATH, so that a dtprof there would be the one imported
    done = subprocess.run(
        [sys.executable, "-c", TRAIN, str(args.steps)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tree,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{tree}: the training process failed:\n{done.stderr[-2000:]}")
    result: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=300, help="steps timed per process")
    p.add_argument("--rounds", type=int, default=3, help="processes per tree, in turn")
    p.add_argument("--session", action="store_true", help="record as dtprof run does")
    p.add_argument("--micro-batches", type=int, default=1, help="per optimizer step")
    p.add_argument("--tree", action="append", type=Path, help="a dtprof checkout (repeatable)")
    args = p.parse_args(argv)
    if args.steps < 1 or args.rounds < 1 or args.micro_batches < 1:
        p.error("--steps, --rounds and --micro-batches must be at least 1")
    here = Path(__file__).resolve().parent.parent
    trees = [tree.resolve() for tree in args.tree] if args.tree else [here]
    for tree in trees:
        if not (tree / "dtprof" / "__init__.py").is_file():
            p.error(f"{tree}: not a dtprof checkout (no dtprof/__init__.py)")
    started, load = time.monotonic(), os.getloadavg()[0]
    # per tree: the step's ns per round; per function, (median call ns, ns per step) per round
    step_ns: dict[Path, list[float]] = {tree: [] for tree in trees}
    figures: dict[Path, dict[str, list[tuple[float, float]]]] = {tree: {} for tree in trees}
    for r in range(args.rounds):
        for tree in trees:
            print(f"hook_time: round {r + 1}/{args.rounds}, {tree}", file=sys.stderr, flush=True)
            result = run_once(tree, args)
            step_ns[tree].append(float(result["step_ns"]))  # type: ignore[arg-type]
            for name, spent in result["times"].items():  # type: ignore[attr-defined]
                if spent:
                    per_call = statistics.median(spent)
                    figures[tree].setdefault(name, []).append((per_call, sum(spent) / args.steps))
    print("hook_time: the cost of calling the model hooked", file=sys.stderr, flush=True)
    calling = [calling_ns(max(40, args.steps // 5)) for _ in range(args.rounds)]
    med = statistics.median
    names = [
        name
        for name in (*(f.split(":")[1] for f in FUNCTIONS), REGION)
        if any(name in figures[t] for t in trees)
    ]
    nested = NESTED + (INSIDE_THE_SESSION if args.session else ())
    recorded = "as dtprof run records it" if args.session else "under profile()"
    lines = [
        f"one process, overhead.py's step (DDP, one-rank gloo group, MLP 4x512, batch 64)"
        f" {recorded}, {args.micro_batches} micro-batch(es) a step;"
        f" {args.steps} steps, {args.rounds} rounds; load {load:.1f} before,"
        f" {os.getloadavg()[0]:.1f} after; medians over rounds",
    ]
    for i, tree in enumerate(trees):
        lines.append(f"  [{i}] {tree}: step {med(step_ns[tree]) / 1e3:.0f} µs")
    header = "".join(f"{f'[{i}] µs a call':>16}{f'[{i}] µs a step':>16}" for i in range(len(trees)))
    lines.append(f"{'function':<34}{header}")
    totals = [0.0] * len(trees)
    for name in names:
        cells = ""
        for i, tree in enumerate(trees):
            rounds = figures[tree].get(name)
            if not rounds:
                cells += f"{'-':>16}{'-':>16}"
                continue
            per_step = med(r[1] for r in rounds)
            if name not in nested:
                totals[i] += per_step
            cells += f"{med(r[0] for r in rounds) / 1e3:>16.1f}{per_step / 1e3:>16.1f}"
        lines.append(f"{('  of which ' if name in nested else '') + name:<34}{cells}")
    lines.append(f"{'all, per step':<34}" + "".join(f"{'':>16}{t / 1e3:>16.1f}" for t in totals))
    lines.append("calling the model, over a plain call, not in the table (µs a forward pass):")
    for way, what in (
        ("hooks", "two empty hooks (forward pre-hook and hook): PyTorch's slow path"),
        ("timed_forward", "this checkout's TimedForward, the phase hooks doing nothing"),
        ("profiled", "this checkout's forward under profile(), doing its work"),
    ):
        ns = [c[way] for c in calling]
        rounds = ", ".join(f"{n / 1e3:+.1f}" for n in ns)
        lines.append(f"  {what}: {med(ns) / 1e3:+.1f} (rounds: {rounds})")
    if len(trees) > 1:
        lines.append(
            "per step against [0]: "
            + ", ".join(f"[{i}] {totals[i] / totals[0]:.2f}" for i in range(1, len(trees)))
        )
    lines.append(f"({time.monotonic() - started:.0f} s)")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
