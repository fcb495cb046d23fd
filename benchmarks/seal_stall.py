"""What sealing a segment does to the training steps it overlaps.

    python benchmarks/seal_stall.py [--seconds 40] [--seal-s 10]

The writer thread seals each table's open segment into Parquet every ``seal_interval_s``
(300 s by default), reading every row of it back. It does that in Python, holding the GIL for
as long as each call into C lasts, so the training thread can wait: a step that overlaps a seal
is longer than the others. Here a one-rank gloo DDP job (4 linear layers of 256, batch 64,
unpadded steps of about 2 ms, where a stall shows most) records for ``--seconds`` with
``profile(seal_interval_s=--seal-s)``, and each seal inside the run is listed with its rows, its
wall time and the steps it overlapped: how many, their mean and their longest, against the
median step (the tables sealed at one flush, one after another, count as one seal). Run it
from a clone with PYTHONPATH set to the clone to compare two versions.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from writer_cost import train_step  # the benchmark beside this one

import dtprof
from dtprof.jobs.launch import free_port
from dtprof.record.writer import _Segment


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=40.0)
    p.add_argument("--seal-s", type=float, default=10.0, help="profile(seal_interval_s=...)")
    a = p.parse_args()
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    torch.manual_seed(0)
    model = DDP(nn.Sequential(*[nn.Linear(256, 256) for _ in range(4)]))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 256)

    seals: list[tuple[float, float, int, str]] = []  # start, end, rows, table
    seal = _Segment.seal

    def timed_seal(self: _Segment) -> None:
        start = time.perf_counter()
        seal(self)
        seals.append((start, time.perf_counter(), self.rows, self.table.name))

    _Segment.seal = timed_seal  # type: ignore[method-assign]
    steps: list[tuple[float, float]] = []
    print(f"load {os.getloadavg()[0]:.1f}; {a.seconds:.0f} s, a seal every {a.seal_s:.0f} s")
    try:
        with (
            tempfile.TemporaryDirectory() as folder,
            dtprof.profile(
                Path(folder), model=model, optimizer=opt, seal_interval_s=a.seal_s
            ) as prof,
        ):
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < a.seconds:
                began = time.perf_counter()
                train_step(model, opt, x, prof)
                steps.append((began, time.perf_counter()))
    finally:
        _Segment.seal = seal  # type: ignore[method-assign]
    lengths = [end - start for start, end in steps]
    median = statistics.median(lengths)
    print(f"{len(steps)} steps, median {median * 1e3:.2f} ms, longest {max(lengths) * 1e3:.2f} ms")
    print(
        f"{'seal':<6}{'tables':>7}{'rows':>8}{'ms':>7}{'steps':>7}{'mean ms':>9}{'longest ms':>12}"
    )
    for n, (start, end, tables, rows) in enumerate(_flushes(seals, before=steps[-1][1]), 1):
        during = [e - s for s, e in steps if s < end and e > start]
        print(
            f"{n:<6}{tables:>7}{rows:>8}{(end - start) * 1e3:>7.1f}{len(during):>7}"
            f"{statistics.mean(during) * 1e3:>9.2f}{max(during) * 1e3:>12.2f}"
        )
    print(f"load {os.getloadavg()[0]:.1f}")
    dist.destroy_process_group()


def _flushes(
    seals: list[tuple[float, float, int, str]], before: float
) -> list[tuple[float, float, int, int]]:
    """The seals made in one flush (each table's, one after another) as one: its start, end,
    tables and rows; only those that ended before ``before`` (the profile's last is after
    training)."""
    out: list[tuple[float, float, int, int]] = []
    for start, end, rows, _table in seals:
        if end > before:
            continue
        if out and start - out[-1][1] < 1e-3:
            first, _, tables, total = out[-1]
            out[-1] = (first, end, tables + 1, total + rows)
        else:
            out.append((start, end, 1, rows))
    return out


if __name__ == "__main__":
    main()
