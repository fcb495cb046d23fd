"""dtprof against Holistic Trace Analysis on the same PyTorch profiler traces: time and memory.

    python benchmarks/vs_hta.py [--ranks 8] [--repeat 1] [--keep DIR]

1. Installs HTA (PyPI ``holistictraceanalysis``, with ``pandas<3``: its critical path breaks on
   pandas 3) into its own environment under ``.bench-venvs/`` (once; gitignored).
2. Builds an N-rank folder in a temporary directory by copying
   ``../shared/reference_traces/hta_v100_allreduce_1rank`` (216,092 events, 54 MB of JSON per
   rank) with only ``distributedInfo.rank`` changed.
3. Times, each in a fresh child process: HTA (import, construct ``TraceAnalysis``, temporal
   breakdown, communication/computation overlap); ``dtprof analyze`` cold (an empty cache) and
   warm (the cache the cold run left). Peak memory is the largest sum of resident memory over
   the child and all its descendants (both tools use worker processes), sampled every 20 ms.
4. Prints a table with the ratios, and both tools' figures for rank 0.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
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


def _tree_rss(pid: int) -> int:
    """Resident bytes of a process and all its descendants (from /proc)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    page = os.sysconf("SC_PAGE_SIZE")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        p = int(entry)
        children.setdefault(int(fields[1]), []).append(p)
        rss[p] = int(fields[21]) * page
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        total += rss.get(p, 0)
        todo += children.get(p, [])
    return total


def measure(cmd: list[str], env: dict[str, str]) -> tuple[float, int, str]:
    """(wall seconds, peak resident bytes of the process tree, stdout) of one command."""
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, _tree_rss(proc.pid))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, _ = proc.communicate()
    wall = time.perf_counter() - started
    done.set()
    sampler.join()
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(cmd)} failed with exit code {proc.returncode}")
    return wall, peak, out.decode()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=1, help="runs of each, best kept")
    parser.add_argument("--keep", help="build the folder here and keep it")
    args = parser.parse_args()
    hta_python = ensure_hta()
    with tempfile.TemporaryDirectory(prefix="vs_hta-") as tmp:
        folder = Path(args.keep) if args.keep else Path(tmp) / "traces"
        size = build_folder(folder, args.ranks)
        cache = Path(tmp) / "cache"
        env = dict(os.environ, DTPROF_CACHE_DIR=str(cache), PYTHONWARNINGS="ignore")
        dtprof_cmd = [sys.executable, "-m", "dtprof", "analyze", str(folder), "--format", "json"]
        results: dict[str, tuple[float, int]] = {}
        figures: dict[str, dict[str, float]] = {}
        for _ in range(args.repeat):
            wall, peak, out = measure([str(hta_python), "-c", HTA_SCRIPT, str(folder)], env)
            figures["HTA 0.5.0"] = json.loads(out.strip().splitlines()[-1])
            _keep_best(results, "HTA 0.5.0", wall, peak)
            subprocess.run(["rm", "-rf", str(cache)], check=True)
            wall, peak, out = measure(dtprof_cmd, env)
            _keep_best(results, "dtprof analyze, cold", wall, peak)
            wall, peak, out = measure(dtprof_cmd, env)
            _keep_best(results, "dtprof analyze, warm", wall, peak)
            gpu = json.loads(out)["summary"]["gpu"]["ranks"][0]
            figures["dtprof"] = {
                "idle": gpu["idle_pct"], "compute": gpu["compute_pct"],
                "non_compute": gpu["non_compute_pct"], "overlap": gpu["comm_overlap_pct"],
            }  # fmt: skip
    print(f"{args.ranks} ranks, {size / 1e6:,.0f} MB of JSON, {os.cpu_count()} CPUs\n")
    hta_wall, hta_peak = results["HTA 0.5.0"]
    print(
        "| run | wall s | peak MiB | HTA / it (time) | it / HTA (memory) |\n|---|---|---|---|---|"
    )
    for name, (wall, peak) in results.items():
        print(
            f"| {name} | {wall:.2f} | {peak / 2**20:,.0f} | {hta_wall / wall:.1f}x "
            f"| {peak / hta_peak:.2f} |"
        )
    print("\nrank 0 figures (idle / compute / non-compute / overlap %):")
    for name, fig in figures.items():
        print(
            f"  {name}: {fig['idle']} / {fig['compute']} / {fig['non_compute']} / {fig['overlap']}"
        )


def _keep_best(results: dict[str, tuple[float, int]], name: str, wall: float, peak: int) -> None:
    old = results.get(name)
    results[name] = (wall, peak) if old is None or wall < old[0] else old


if __name__ == "__main__":
    main()
