"""The native profiler-trace reader against maintained JSON decoders, on one real trace file.

    python benchmarks/json_decoders.py [--repeat 9]

The file is the V100 reference trace (``../shared/reference_traces/hta_v100_allreduce_1rank``,
54 MB of JSON once inflated), read from the page cache. Each way of reading it runs
``--repeat`` times in turn, in this process; the table gives medians and their ratio to the
native reader:

- dtprof's native reader (``dtprof/trace/kineto/cpp``): the file into the columns the mapping
  reads (``read_kineto``);
- dtprof's Python reader: msgspec decoding typed records that hold only the keys the mapping
  reads, a chunk at a time, into the same columns (``read_kineto(native=False)``);
- orjson, msgspec (untyped) and the standard library's json: the whole text into Python
  objects, one dict per event, and no columns yet (what a reader built on them would start
  from);
- the mapping of the columns into dtprof's tables, which every reader is followed by.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import msgspec
import orjson

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT.parent / "shared" / "reference_traces" / "hta_v100_allreduce_1rank"


def median_s(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args()
    sources = sorted(REFERENCE.glob("*.json*"))
    if not sources:
        raise SystemExit(f"{REFERENCE}: no reference trace here")
    from dtprof.trace.kineto.mapping import rank_tables
    from dtprof.trace.kineto.read import read_kineto
    from dtprof.trace.kineto.scan_ahead import native_reader

    module, why = native_reader()
    if module is None:
        raise SystemExit(f"the native reader is not here: {why}")
    raw = sources[0].read_bytes()
    text = gzip.decompress(raw) if sources[0].name.endswith(".gz") else raw
    with tempfile.TemporaryDirectory(prefix="json_decoders-") as tmp:
        path = Path(tmp) / "rank0.json"
        path.write_bytes(text)
        columns = read_kineto(path)
        rows = {
            "dtprof native reader (columns)": lambda: read_kineto(path),
            "dtprof Python reader: msgspec, typed (columns)": lambda: read_kineto(
                path, native=False
            ),
            "orjson.loads (objects)": lambda: orjson.loads(path.read_bytes()),
            "msgspec.json.decode, untyped (objects)": lambda: msgspec.json.decode(
                path.read_bytes()
            ),
            "json.loads (objects)": lambda: json.loads(path.read_bytes()),
            "the mapping of the columns into tables": lambda: rank_tables(columns),
        }
        seconds = {name: median_s(fn, args.repeat) for name, fn in rows.items()}
    base = seconds["dtprof native reader (columns)"]
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"{sources[0].name}: {len(text) / 1e6:.1f} MB of JSON; medians of {args.repeat}; "
        f"{os.cpu_count()} CPUs, load {load}; Python {sys.version.split()[0]}\n"
    )
    print("| reading | s | MB/s | vs the native reader |")
    print("|---|---|---|---|")
    for name, s in seconds.items():
        rate = "-" if name.startswith("the mapping") else f"{len(text) / 1e6 / s:,.0f}"
        print(f"| {name} | {s:.3f} | {rate} | {s / base:.2f}x |")


if __name__ == "__main__":
    main()
