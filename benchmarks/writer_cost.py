"""What dtprof's writer thread costs while a job trains: its CPU time per second of recording.

    python benchmarks/writer_cost.py [--seconds 20] [--step-ms 6,30] [--flush-s 1]

The writer works per interval, not per step: every ``flush_interval_s`` it ticks (drains the
native kernel's records, the GPU's times, the samplers, the hang watchdog, inflight.json) and
flushes the rows gathered since. So it costs a share of a core whatever the step's length, and
per step it grows with the step; step_cost.py, which charges one flush to 1,000 tiny steps,
does not show that. Here a one-rank gloo DDP job (an MLP of 4 linear layers of 512, batch
64, the size of overhead.py's), padded with a sleep to each ``--step-ms``, records for
``--seconds`` under ``profile()`` with its defaults and every ``--flush-s``; the writer
thread's own CPU time (``time.thread_time()`` inside it, its start-up excluded) is divided by
the recording's wall time. Every row is also sealed once into Parquet: in a long run the writer
does that every ``seal_interval_s`` (300 s), outside a run this short, so the seal at the
profile's end is timed apart and added as a long run would pay it. Its work (read the segment
back, write its Parquet) is timed three times on the thread that seals, just before the seal,
and the median kept: a single seal right after the last step shares the machine with torch's
threads still spinning, and read from 0.5 to 2.4 ms a second in runs of the same code. What a
table's seal costs over sealing an empty segment of that table (timed before the runs) comes
every second in proportion to the rows, the empty seal's own cost once
every 300 s. Each combination runs once, in this one process, in the order given.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import dtprof
from dtprof.jobs.launch import free_port
from dtprof.record.writer import TraceWriter, _Segment
from dtprof.trace import live
from dtprof.trace.schema import TABLES

SEAL_INTERVAL_S = 300.0  # profile()'s default seal_interval_s


def empty_seal_s() -> dict[str, float]:
    """CPU seconds to seal an empty segment of each table: a seal's cost whatever its rows."""
    out = {}
    with tempfile.TemporaryDirectory() as folder:
        for name, table in TABLES.items():
            (Path(folder) / name).mkdir()
            times = []
            for number in range(5):
                segment = _Segment(Path(folder) / name, table, number)
                start = time.thread_time()
                segment.seal()
                times.append(time.thread_time() - start)
            out[name] = sorted(times)[2]
    return out


def train_step(model: DDP, opt: torch.optim.Optimizer, x: torch.Tensor, prof: Any) -> None:
    """One recorded step of the writer's benchmarks (this and seal_stall.py): forward,
    backward, the optimizer's step, the loss logged."""
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    prof.log(loss=loss.detach())
    prof.step()


def measure(
    model: DDP,
    opt: torch.optim.Optimizer,
    step_ms: float,
    seconds: float,
    flush_s: float,
    empty_seal: dict[str, float],
) -> dict[str, Any]:
    """Record for ``seconds``, each step padded to ``step_ms``; the writer's CPU time."""
    used: dict[str, float] = {"rows_seal_s": 0.0, "fixed_seal_s": 0.0, "sealed_rows": 0}
    run, seal = TraceWriter._run, _Segment.seal

    def timed_run(self: TraceWriter) -> None:
        start = time.thread_time()
        try:
            run(self)
        finally:
            used["cpu_s"] = time.thread_time() - start

    def timed_seal(self: _Segment) -> None:
        # the seal's work (read the segment, write its Parquet) three times, the median kept
        times = []
        with tempfile.TemporaryDirectory() as scratch:
            for _ in range(3):
                start = time.thread_time()
                data, _ = live.read(self.path, self.table)
                self.table.write_parquet(data, Path(scratch) / "part.parquet")
                times.append(time.thread_time() - start)
        seal(self)
        fixed = empty_seal[self.table.name]
        used["rows_seal_s"] += max(0.0, sorted(times)[1] - fixed)
        used["fixed_seal_s"] += fixed
        used["sealed_rows"] += self.rows

    TraceWriter._run = timed_run  # type: ignore[method-assign]
    _Segment.seal = timed_seal  # type: ignore[method-assign]
    x = torch.randn(64, 512)
    steps = 0
    try:
        with tempfile.TemporaryDirectory() as folder:
            options: dict[str, Any] = {
                "model": model,
                "optimizer": opt,
                "flush_interval_s": flush_s,
            }
            with dtprof.profile(Path(folder), **options) as prof:
                t0 = time.perf_counter()
                while time.perf_counter() - t0 < seconds:
                    began = time.perf_counter()
                    train_step(model, opt, x, prof)
                    steps += 1
                    time.sleep(max(0.0, step_ms / 1e3 - (time.perf_counter() - began)))
                wall = time.perf_counter() - t0
    finally:
        TraceWriter._run = run  # type: ignore[method-assign]
        _Segment.seal = seal  # type: ignore[method-assign]
    cpu_ms_per_s = used["cpu_s"] * 1e3 / wall
    seal_ms_per_s = (used["rows_seal_s"] / wall + used["fixed_seal_s"] / SEAL_INTERVAL_S) * 1e3
    return {
        "step_ms": wall / steps * 1e3,
        "steps": steps,
        "cpu_ms_per_s": cpu_ms_per_s,
        "seal_ms_per_s": seal_ms_per_s,
        "seal_ns_per_row": used["rows_seal_s"] * 1e9 / max(used["sealed_rows"], 1),
        "core_pct": (cpu_ms_per_s + seal_ms_per_s) / 10,
        "us_per_step": (cpu_ms_per_s + seal_ms_per_s) * 1e3 * wall / steps,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--step-ms", default="6,30", help="step lengths to pad to, comma-separated")
    p.add_argument(
        "--flush-s", default="1", help="flush intervals, comma-separated (profile()'s default: 1)"
    )
    a = p.parse_args()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    torch.manual_seed(0)
    model = DDP(nn.Sequential(*[nn.Linear(512, 512) for _ in range(4)]))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    print(f"load {os.getloadavg()[0]:.1f}; {a.seconds:.0f} s each", flush=True)
    empty_seal = empty_seal_s()
    print(f"sealing an empty segment: {sum(empty_seal.values()) * 1e3:.1f} ms for all tables")
    print(f"{'flush s':>8}{'step ms':>9}{'steps':>7}{'CPU ms/s':>10}{'seal ms/s':>10}", end="")
    print(f"{'ns/row':>8}{'of a core':>11}{'µs/step':>9}")
    for flush_s in (float(f) for f in a.flush_s.split(",")):
        for step_ms in (float(s) for s in a.step_ms.split(",")):
            r = measure(model, opt, step_ms, a.seconds, flush_s, empty_seal)
            print(
                f"{flush_s:>8.1f}{r['step_ms']:>9.2f}{r['steps']:>7}{r['cpu_ms_per_s']:>10.2f}"
                f"{r['seal_ms_per_s']:>10.2f}{r['seal_ns_per_row']:>8.0f}"
                f"{r['core_pct']:>10.2f}%{r['us_per_step']:>9.1f}",
                flush=True,
            )
    print(f"load {os.getloadavg()[0]:.1f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
