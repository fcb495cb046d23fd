"""dtprof against Holistic Trace Analysis on the same PyTorch profiler traces: time and memory.

    python benchmarks/vs_hta.py [--ranks 8] [--repeat 3] [--keep DIR]

1. Installs HTA (PyPI ``holistictraceanalysis``, with ``pandas<3``: its critical path breaks on
   pandas 3) into its own environment under ``.bench-venvs/`` (once; gitignored).
2. Builds an N-rank folder in a temporary directory by copying
   ``../shared/reference_traces/hta_v100_allreduce_1rank`` (216,092 events, 54 MB of JSON per
   rank) with only ``distributedInfo.rank`` changed.
3. Times, each in a fresh child process: HTA (import, construct ``TraceAnalysis``, temporal
   breakdown, communication/computation overlap); ``dtprof analyze`` cold (an empty cache) and
   warm (the cache the cold run left), ``--repeat`` times in turn. dtprof's native reader is
   built first where it is missing (``DTPROF_NATIVE=0`` times the Python reader), and its
   bytecode compiled, as pip compiles an installed package's (HTA's included). CPU time is
   the user + system time of the child and all its descendants. Peak memory is the largest sum,
   over the child and all its descendants (both tools use worker processes), of resident memory
   (RSS: pages shared between them, the libraries and what a forked worker inherits, count once
   in each) and of proportional memory (PSS: shared pages split between their users), sampled
   every 20 ms. Sampling takes about a quarter of a CPU (reading ``smaps_rollup`` walks the
   page tables of the process it reads, under its memory map's lock), so every command runs
   twice in turn: timed alone, then with its memory sampled. The times come from the first
   run, the peaks from the second.
   Where the native reader is built, a third dtprof row times a floor for the cold run: a
   process that does only what a cold ``analyze`` cannot skip, importing the analyzer's
   libraries while a thread scans the files with the native reader, then scanning beside
   that thread until every file is read, both CPUs busy from the start (on two), and none of
   the rest of the mapping, the caching, summarizing, checks or report. No cold run of this
   design can be quicker.
4. Prints a table of medians with the ratios, and both tools' figures for rank 0.
"""

from __future__ import annotations

import argparse
import compileall
import gzip
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT.parent / "shared" / "reference_traces" / "hta_v100_allreduce_1rank"
VENV = ROOT / ".bench-venvs" / "hta-0.5.0"
HTA_SPEC = ["holistictraceanalysis==0.5.0", "pandas<3"]
RANK_FIELD = b'"distributedInfo": {"backend": "nccl", "rank": 1, "world_size": 2}'

HTA_SCRIPT = """
import json, sys
from hta.trace_analysis import TraceAnalysis
a = TraceAnalysis(trace_dir=sys.argv[1])
tb = a.get_temporal_breakdown(visualize=False)
ov = a.get_comm_comp_overlap(visualize=False)
r0 = tb[tb["rank"] == 0].iloc[0]
o0 = ov[ov["rank"] == 0].iloc[0]
print(json.dumps({"idle": float(r0["idle_time_pctg"]), "compute": float(r0["compute_time_pctg"]),
                  "non_compute": float(r0["non_compute_time_pctg"]),
                  "overlap": float(o0["comp_comm_overlap_pctg"])}))
"""


# what a cold analyze cannot skip: the imports, and the native reader's scan of every file
FLOOR_SCRIPT = """
import os, sys, threading
from pathlib import Path
from dtprof.commands import own_process
from dtprof.trace.kineto import _scan
from dtprof.trace.kineto.files import kineto_files
files = kineto_files(Path(sys.argv[1]))
lock = threading.Lock()
def scan():
    while True:
        with lock:
            if not files:
                return
            name = str(files.pop())
        if _scan.scan_file(name).status:  # without the GIL
            os._exit(3)  # given back to the Python reader: no floor to time
thread = threading.Thread(target=scan)
thread.start()
own_process.OWN = True
with own_process.pandas_held_back():  # as analyze imports them
    from dtprof.analysis import analyze
    from dtprof.analysis.render import markdown, text
scan()
thread.join()
os._exit(0)
"""


def ensure_hta() -> Path:
    """The HTA environment's python, created on first use."""
    python = VENV / "bin" / "python"
    if not python.exists():
        print(f"installing {' '.join(HTA_SPEC)} into {VENV} ...", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *HTA_SPEC], check=True)
    return python


def build_folder(target: Path, ranks: int) -> int:
    """N copies of the reference trace, rank i in file i; bytes written."""
    source = next(REFERENCE.glob("*.json*"))
    raw = source.read_bytes()
    if source.name.endswith(".gz"):
        raw = gzip.decompress(raw)
    if raw.count(RANK_FIELD) != 1:
        raise SystemExit(f"{source}: distributedInfo is not where this benchmark expects it")
    target.mkdir(parents=True, exist_ok=True)
    for rank in range(ranks):
        new = RANK_FIELD.replace(b'"rank": 1', b'"rank": %d' % rank)
        (target / f"rank{rank}.json").write_bytes(raw.replace(RANK_FIELD, new))
    return len(raw) * ranks


def _tree(pid: int) -> list[int]:
    """A process and all its descendants (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo += children.get(p, [])
    return found


def _memory(pids: list[int]) -> tuple[int, int]:
    """(RSS, PSS) bytes summed over these processes."""
    rss = pss = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Rss:"):
                        rss += int(line.split()[1]) * 1024
                    elif line.startswith("Pss:"):
                        pss += int(line.split()[1]) * 1024
        except OSError:
            continue
    return rss, pss


Run = tuple[float, float, int, int]  # wall s, CPU s, peak RSS bytes, peak PSS bytes


def measure(
    cmd: list[str], env: dict[str, str], before: Callable[[], None] = lambda: None
) -> tuple[Run, str]:
    """((wall, CPU, peak RSS, peak PSS) of the process tree, stdout) of one command: run once
    timed, then, after ``before()`` again, once with its memory sampled."""
    before()
    (wall, cpu), out = _run(cmd, env, sampled=False)
    before()
    (rss, pss), _ = _run(cmd, env, sampled=True)
    return (wall, cpu, int(rss), int(pss)), out


def _run(cmd: list[str], env: dict[str, str], sampled: bool) -> tuple[tuple[float, float], str]:
    """(wall s, CPU s) or, sampled, (peak RSS, peak PSS bytes) of one run of a command; its
    stdout."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    peak_rss = peak_pss = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak_rss, peak_pss
        while not done.is_set():
            rss, pss = _memory(_tree(proc.pid))
            peak_rss, peak_pss = max(peak_rss, rss), max(peak_pss, pss)
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    if sampled:
        sampler.start()
    out, _ = proc.communicate()
    wall = time.perf_counter() - started
    done.set()
    if sampled:
        sampler.join()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = sum(getattr(after, k) - getattr(before, k) for k in ("ru_utime", "ru_stime"))
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(cmd)} failed with exit code {proc.returncode}")
    return ((peak_rss, peak_pss) if sampled else (wall, cpu)), out.decode()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3, help="runs of each; medians shown")
    parser.add_argument("--keep", help="build the folder here and keep it")
    args = parser.parse_args()
    hta_python = ensure_hta()
    from dtprof.trace.kineto.scan_ahead import native_reader

    library, why_not = native_reader()  # built at install, or not
    # both tools as pip installs them, bytecode compiled: pip compiled HTA's when it installed
    # it; setup compiles dtprof's, and this catches sources changed since
    compileall.compile_dir(ROOT / "dtprof", quiet=2)
    reader = "native" if library is not None else f"Python ({why_not})"
    with tempfile.TemporaryDirectory(prefix="vs_hta-") as tmp:
        folder = Path(args.keep) if args.keep else Path(tmp) / "traces"
        size = build_folder(folder, args.ranks)
        cache = Path(tmp) / "cache"
        env = dict(
            os.environ,
            DTPROF_CACHE_DIR=str(cache),  # emptied before each cold run
            PYTHONWARNINGS="ignore",
        )
        dtprof_cmd = [sys.executable, "-m", "dtprof", "analyze", str(folder), "--format", "json"]
        runs: dict[str, list[Run]] = {}
        figures: dict[str, dict[str, float]] = {}
        for _ in range(args.repeat):
            run, out = measure([str(hta_python), "-c", HTA_SCRIPT, str(folder)], env)
            figures["HTA 0.5.0"] = json.loads(out.strip().splitlines()[-1])
            runs.setdefault("HTA 0.5.0", []).append(run)
            run, out = measure(dtprof_cmd, env, before=lambda: shutil.rmtree(cache, True))
            runs.setdefault("dtprof analyze, cold", []).append(run)
            run, out = measure(dtprof_cmd, env)
            runs.setdefault("dtprof analyze, warm", []).append(run)
            if library is not None:
                run, _ = measure([sys.executable, "-c", FLOOR_SCRIPT, str(folder)], env)
                runs.setdefault("floor: imports + scans alone", []).append(run)
            gpu = json.loads(out)["summary"]["gpu"]["ranks"][0]
            figures["dtprof"] = {
                "idle": gpu["idle_pct"], "compute": gpu["compute_pct"],
                "non_compute": gpu["non_compute_pct"], "overlap": gpu["comm_overlap_pct"],
            }  # fmt: skip
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"{args.ranks} ranks, {size / 1e6:,.0f} MB of JSON, {os.cpu_count()} CPUs, load {load}, "
        f"medians of {args.repeat} runs, dtprof's {reader} profiler-trace reader\n"
    )
    median = {
        name: tuple(statistics.median(r[i] for r in rs) for i in range(4))
        for name, rs in runs.items()
    }
    hta = median["HTA 0.5.0"]
    print(
        "| run | wall s | CPU s | peak RSS MiB | peak PSS MiB | HTA / it (wall, CPU) "
        "| it / HTA (RSS, PSS) |\n|---|---|---|---|---|---|---|"
    )
    for name, (wall, cpu, rss, pss) in median.items():
        print(
            f"| {name} | {wall:.2f} | {cpu:.2f} | {rss / 2**20:,.0f} | {pss / 2**20:,.0f} "
            f"| {hta[0] / wall:.1f}x, {hta[1] / cpu:.1f}x "
            f"| {rss / hta[2]:.2f}, {pss / hta[3]:.2f} |"
        )
    print("\nevery run (wall s, CPU s, RSS MiB, PSS MiB):")
    for name, rs in runs.items():
        cells = [f"{w:.1f}/{c:.1f}/{r / 2**20:,.0f}/{p / 2**20:,.0f}" for w, c, r, p in rs]
        print(f"  {name}: {'  '.join(cells)}")
    print("\nrank 0 figures (idle / compute / non-compute / overlap %):")
    for name, fig in figures.items():
        print(
            f"  {name}: {fig['idle']} / {fig['compute']} / {fig['non_compute']} / {fig['overlap']}"
        )


if __name__ == "__main__":
    main()
