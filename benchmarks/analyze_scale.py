"""Analysis at scale: a synthetic DDP trace of R ranks x S steps, then `dtprof analyze` on it.

    python benchmarks/analyze_scale.py --ranks 1024 --steps 1000 [--out DIR] [--repeat 3]

The trace is written in dtprof's real format (hive-style rank folders, Parquet parts, meta.json)
by ``build_trace``. Each step of each rank has about 50 records, like a DDP job with a model of
40 gradient buckets: the step, four phases (data, forward, backward, optimizer), 40 bucket
all-reduces launched during backward, three memory samples, the loss, and 10 parameter
fingerprints every 10 steps. One rank, chosen by the seed, computes 30% slower; the others wait
for it at every bucket, as they would in a real job, and the analysis must name it. Timings come
from a fresh ``dtprof analyze`` process per repeat (cold imports included). Two peaks of memory:
the most that process and its workers held resident together, and the most the system had in use
(MemTotal less MemAvailable) above its level at the start, which counts once the pages forked
workers share with their parent and counts the memory files that carry results back from the
workers before any process maps them. The trace folder is kept when ``--out`` is given (and
reused when it already holds the same ranks, steps and seed), removed otherwise. Progress goes
to stderr, the table to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from dtprof.trace.schema import META_FILE, SCHEMA_VERSION, TABLES, rank_dir_name

BUCKETS = 40
FINGERPRINT_EVERY = 10
FINGERPRINT_TENSORS = 10
SLOWDOWN = 1.3
GOAL_S, GOAL_GIB = 60.0, 8.0
MARKER = "scale.json"


def straggler_of(ranks: int, seed: int) -> int:
    """The rank that build_trace makes slow."""
    return int(np.random.default_rng(seed).integers(ranks))


def timeline(ranks: int, steps: int, seed: int) -> dict[str, np.ndarray]:
    """Every rank's phase times and the bucket all-reduces' arrivals, in ns, shape (step, rank).

    A step starts on every rank when the slowest finished the previous one (DDP's last
    all-reduce lines them up). Bucket k leaves rank r after (k+1)/40 of its backward; its
    transfer starts when the last member arrives and the previous bucket is done.
    """
    rng = np.random.default_rng(seed)
    slow = straggler_of(ranks, seed)
    jitter = lambda mean: rng.normal(mean, 0.03 * mean, (steps, ranks)).clip(0.5 * mean)  # noqa: E731
    data, fwd, bwd, opt = jitter(2e6), jitter(30e6), jitter(60e6), jitter(5e6)
    for a in (fwd, bwd, opt):
        a[:, slow] *= SLOWDOWN
    frac = (np.arange(BUCKETS) + 1) / BUCKETS
    transfer = 1.2e6
    t0 = np.empty(steps)
    done = np.empty((steps, BUCKETS))
    start = 1_000_000_000.0
    for s in range(steps):
        t0[s] = start
        enter = start + data[s, :, None] + fwd[s, :, None] + frac[None, :] * bwd[s, :, None]
        last = enter.max(axis=0)
        finished = start
        for k in range(BUCKETS):
            finished = max(finished, last[k]) + transfer
            done[s, k] = finished
        start = float((finished + opt[s]).max()) + 0.2e6
    return {"t0": t0, "data": data, "fwd": fwd, "bwd": bwd, "opt": opt, "done": done}


def _write(folder: Path, name: str, columns: dict[str, np.ndarray | pa.Array]) -> None:
    schema = TABLES[name].schema
    rows = len(next(iter(columns.values())))
    arrays = [
        pa.array(columns[f.name], f.type) if f.name in columns else pa.nulls(rows, f.type)
        for f in schema
    ]
    out = folder / name
    out.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_arrays(arrays, schema=schema)
    pq.write_table(table, out / "part-000000.parquet")


def write_rank(trace: Path, rank: int, ranks: int, tl: dict[str, np.ndarray]) -> int:
    """One rank's folder; returns how many records it holds."""
    folder = trace / rank_dir_name(rank)
    folder.mkdir(parents=True, exist_ok=True)
    steps = len(tl["t0"])
    step = np.arange(steps, dtype=np.int64)
    t0 = tl["t0"].astype(np.int64)
    d, f, b, o = (tl[k][:, rank].astype(np.int64) for k in ("data", "fwd", "bwd", "opt"))
    fwd_start = t0 + d
    bwd_start = fwd_start + f
    bwd_end = bwd_start + b
    last_done = tl["done"][:, -1].astype(np.int64)
    opt_end = np.maximum(bwd_end, last_done) + o
    _write(folder, "steps", {"step": step, "start_ns": t0, "end_ns": opt_end})

    names = np.array(["data", "forward", "backward", "optimizer"])
    span_start = np.stack([t0, fwd_start, bwd_start, np.maximum(bwd_end, last_done)], axis=1)
    span_end = np.stack([fwd_start, bwd_start, bwd_end, opt_end], axis=1)
    _write(
        folder,
        "spans",
        {
            "step": np.repeat(step, 4),
            "name": np.tile(names, steps),
            "kind": np.full(4 * steps, "phase"),
            "start_ns": span_start.ravel(),
            "end_ns": span_end.ravel(),
            "depth": np.zeros(4 * steps, np.int16),
        },
    )

    frac = (np.arange(BUCKETS) + 1) / BUCKETS
    enter = (bwd_start[:, None] + frac[None, :] * b[:, None]).astype(np.int64)
    n = steps * BUCKETS
    bucket = np.tile(np.arange(BUCKETS), steps)
    _write(
        folder,
        "collectives",
        {
            "step": np.repeat(step, BUCKETS),
            "group": np.full(n, "0"),
            "seq": np.arange(n, dtype=np.int64),
            "op": np.full(n, "all_reduce"),
            "bytes": np.full(n, 25 * 2**20, np.int64),
            "dtype": np.full(n, "float32"),
            "start_ns": enter.ravel(),
            "end_ns": tl["done"].astype(np.int64).ravel(),
            "async_op": np.ones(n, bool),
            "label": np.char.add("ddp.bucket", (BUCKETS - 1 - bucket).astype(str)),
        },
    )

    metrics = np.array(["rss_bytes", "cuda_allocated_bytes", "cuda_reserved_bytes"])
    base = np.array([3e9, 20e9, 24e9])
    _write(
        folder,
        "samples",
        {
            "step": np.repeat(step, 3),
            "ts_ns": np.repeat(opt_end, 3),
            "metric": np.tile(metrics, steps),
            "value": np.tile(base, steps),
        },
    )
    loss = 4.0 * np.exp(-step / 400) + 0.01 * np.sin(step + rank)
    _write(folder, "scalars", {"step": step, "name": np.full(steps, "loss"), "value": loss})

    fp_steps = step[::FINGERPRINT_EVERY]
    m = len(fp_steps) * FINGERPRINT_TENSORS
    tensor = np.tile([f"layers.{i}.weight" for i in range(FINGERPRINT_TENSORS)], len(fp_steps))
    value = np.repeat(fp_steps, FINGERPRINT_TENSORS) * 1e-3 + np.tile(
        np.arange(FINGERPRINT_TENSORS), len(fp_steps)
    )
    _write(
        folder,
        "fingerprints",
        {
            "step": np.repeat(fp_steps, FINGERPRINT_TENSORS),
            "tensor": tensor,
            "sum": value,
            "sumsq": value * value,
        },
    )
    _write(folder, "groups", {"group": ["0"], "backend": ["nccl"], "ranks": [list(range(ranks))]})
    meta = {
        "schema_version": SCHEMA_VERSION,
        "rank": rank,
        "world_size": ranks,
        "host": f"node{rank // 8:04d}",
        "device": f"cuda:{rank % 8}",
        "backend": "nccl",
        "status": "finished",
        "clock": {"mono_to_wall_ns": 0, "start": {"mono_ns": 0, "offset_ns": 0, "error_ns": 0}},
    }
    (folder / META_FILE).write_text(json.dumps(meta))
    return steps * (1 + 4 + BUCKETS + 3 + 1) + m


def build_trace(out: str | os.PathLike[str], ranks: int, steps: int, seed: int = 0) -> int:
    """Write the synthetic trace into ``out`` (reused if it holds the same one); its records."""
    out = Path(out)
    wanted = {"ranks": ranks, "steps": steps, "seed": seed, "buckets": BUCKETS}
    marker = out / MARKER
    if marker.exists():
        held = json.loads(marker.read_text())
        if {k: held.get(k) for k in wanted} == wanted:
            return int(held["records"])
        sys.exit(f"{out}: holds another synthetic trace ({held}); give an empty --out")
    if out.exists() and any(out.iterdir()):
        sys.exit(f"{out}: exists and is not empty; give an empty or new --out")
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    tl = timeline(ranks, steps, seed)
    records = 0
    for rank in range(ranks):
        records += write_rank(out, rank, ranks, tl)
        if (rank + 1) % 64 == 0 or rank + 1 == ranks:
            print(
                f"[scale] wrote {rank + 1}/{ranks} ranks ({time.monotonic() - started:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
    marker.write_text(json.dumps({**wanted, "records": records}))
    return records


def tree_rss_bytes(pid: int) -> int:
    """Resident memory of a process and all its descendants, from /proc."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            status = Path(f"/proc/{p}/status").read_text()
            total += int(status.split("VmRSS:")[1].split()[0]) * 1024
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, IndexError, ValueError):
            continue
    return total


def used_bytes() -> int:
    """The system's memory in use: MemTotal less MemAvailable, from /proc/meminfo."""
    fields = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    return (int(fields["MemTotal"].split()[0]) - int(fields["MemAvailable"].split()[0])) * 1024


def peak_rss_until_exit(proc: subprocess.Popen[str], used_before: int) -> tuple[int, int]:
    """Wait for ``proc``, sampling every 50 ms: the peaks in bytes of its and its workers'
    resident memory, and of the system's memory in use above ``used_before``."""
    peak = system = 0
    while proc.poll() is None:
        peak = max(peak, tree_rss_bytes(proc.pid))
        system = max(system, used_bytes() - used_before)
        time.sleep(0.05)
    return peak, system


def run_analyze(trace: Path, extra: list[str]) -> tuple[float, float, float, dict[str, object]]:
    """One fresh `dtprof analyze --format json`: wall seconds, the peaks in GiB of the resident
    memory of the process and its workers together and of the system's memory in use above its
    level at the start (each sampled every 50 ms), the report."""
    with tempfile.NamedTemporaryFile(suffix=".json") as report:
        cmd = [sys.executable, "-m", "dtprof", "analyze", str(trace), "--format", "json"]
        cmd += ["-o", report.name, *extra]
        used_before = used_bytes()
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
        peak, system = peak_rss_until_exit(proc, used_before)
        wall = time.perf_counter() - started
        err = proc.stderr.read() if proc.stderr else ""
        if proc.returncode not in (0, 1):
            sys.exit(f"dtprof analyze failed ({proc.returncode}): {err.strip()}")
        for line in err.splitlines():  # its own split: reading the ranks, then the checks
            if " combined and checked " in line:
                print(f"[scale] {line}", file=sys.stderr)
        return wall, peak / 2**30, system / 2**30, json.loads(Path(report.name).read_text())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--ranks", type=int, default=1024)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeat", type=int, default=3, help="analyze runs; the median is reported")
    p.add_argument("--out", help="keep (or reuse) the synthetic trace here")
    p.add_argument(
        "--dask",
        default="",
        metavar="N,M",
        help="also analyse on local Dask clusters of these worker counts, e.g. 1,2",
    )
    p.add_argument("--fail-above", type=float, help="exit 1 if the median exceeds this many s")
    args = p.parse_args(argv)

    tmp = None if args.out else tempfile.mkdtemp(prefix="dtprof-scale-")
    trace = Path(args.out or tmp or "")
    try:
        started = time.monotonic()
        records = build_trace(trace, args.ranks, args.steps, args.seed)
        built = time.monotonic() - started
        size = sum(f.stat().st_size for f in trace.rglob("*") if f.is_file())
        modes = [("in-process", [])] + [
            (f"dask {n} worker" + "s" * (n != "1"), ["--workers", n])
            for n in args.dask.split(",")
            if n.strip()
        ]
        results = {}
        report: dict[str, object] = {}
        for name, extra in modes:
            walls, peaks, systems = [], [], []
            for i in range(args.repeat):
                wall, peak, system, report = run_analyze(trace, extra)
                walls.append(wall)
                peaks.append(peak)
                systems.append(system)
                print(f"[scale] {name} {i + 1}/{args.repeat}: {wall:.1f} s", file=sys.stderr)
            results[name] = (walls, peaks, systems, report)
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)

    planted = straggler_of(args.ranks, args.seed)
    print(
        f"{args.ranks} ranks x {args.steps} steps, {records:,} records, "
        f"{size / 2**20:.0f} MiB on disk (written in {built:.0f} s)"
    )
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} after\n")
    head = [("median s", 10), ("min s", 8), ("max s", 8), ("events/s", 14), ("peak GiB", 10)]
    head.append(("system GiB", 12))
    print(f"{'analyze':<18}" + "".join(f"{h:>{w}}" for h, w in head) + "  found")
    found = True
    for name, (walls, peaks, systems, report) in results.items():
        findings = report.get("findings", [])
        assert isinstance(findings, list)
        straggler = [f for f in findings if f["code"] == "straggler"]
        found &= bool(straggler) and straggler[0]["ranks"] == [planted]
        wall = statistics.median(walls)
        print(
            f"{name:<18}{wall:>10.1f}{min(walls):>8.1f}{max(walls):>8.1f}"
            f"{records / wall:>14,.0f}{max(peaks):>10.2f}{max(systems):>12.2f}  "
            + (", ".join(f"{f['code']} {f['ranks']}" for f in findings) or "nothing")
        )
    walls, peaks, systems, _ = results["in-process"]
    wall, peak = statistics.median(walls), max(*peaks, *systems)
    print(f"\nplanted straggler: rank {planted}")
    verdict = "met" if wall <= GOAL_S and peak <= GOAL_GIB and found else "missed"
    print(f"goal in-process <= {GOAL_S:.0f} s, <= {GOAL_GIB:.0f} GiB, straggler named: {verdict}")
    if not found:
        return 1
    return 1 if args.fail_above is not None and wall > args.fail_above else 0


if __name__ == "__main__":
    sys.exit(main())
