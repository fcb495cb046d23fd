"""Analysis of recorded CUDA jobs: the checks read the GPU's times (gpu_spans), the report shows
them beside the host's, and a slow rank's throttled clocks (NVML samples) reach its suggestion.

The traces are written by hand: on a GPU the host only launches the work, so every rank's host
phases look alike here, and only the GPU's times say which rank is slow.
"""

from __future__ import annotations

from pathlib import Path

from dtprof.analysis import analyze
from dtprof.analysis.render import text
from tests.tracebuild import rank_meta, write_rank

MS = 1_000_000
WORLD, STEPS, STEP_MS = 3, 24, 40


def _gpu_job(
    trace: Path, gpu_ms: dict[int, float], samples: dict[int, list[tuple[str, float]]] | None = None
) -> None:
    """A DDP-like job whose host launches forward (2 ms) and backward (4 ms) alike on every rank,
    while the GPU runs forward and backward for gpu_ms[rank] in all, then the all-reduce, which
    ends 1 ms after the last rank's GPU reached it."""
    for rank in range(WORLD):
        rows: dict[str, list[tuple]] = {"steps": [], "spans": [], "collectives": []}
        rows["gpu_spans"], rows["samples"] = [], []
        rows["groups"] = [("0", "nccl", list(range(WORLD)))]
        for step in range(STEPS):
            t0 = step * STEP_MS * MS
            fwd, bwd = t0 + 2 * MS, t0 + 6 * MS  # host: launches end here
            gpu0 = t0 + MS // 2  # the GPU starts half a ms behind the host
            own = gpu_ms[rank] * MS
            g_fwd, g_bwd = gpu0 + int(own / 3), gpu0 + int(own)
            done = gpu0 + int(max(gpu_ms.values()) * MS) + MS
            rows["steps"].append((step, t0, t0 + STEP_MS * MS))
            rows["spans"] += [
                (step, "forward", "phase", t0, fwd, 0, None, None),
                (step, "backward", "phase", fwd, bwd, 0, None, None),
            ]
            rows["collectives"].append(
                (step, "0", step, "all_reduce", 4096, "float32", None, bwd, bwd + 50_000, True,
                 "ddp.bucket0")
            )  # fmt: skip
            rows["gpu_spans"] += [
                (step, "forward", "phase", None, None, t0, fwd, gpu0, g_fwd),
                (step, "backward", "phase", None, None, fwd, bwd, g_fwd, g_bwd),
                (step, "all_reduce", "collective", "0", step, bwd, bwd + 50_000, g_bwd, done),
            ]
            for metric, value in (samples or {}).get(rank, []):
                rows["samples"].append((step, t0, metric, value))
        write_rank(trace, rank_meta(rank, WORLD, device="cuda:0", backend="nccl"), rows)


def test_the_slow_rank_is_found_from_the_gpus_times(tmp_path: Path) -> None:
    _gpu_job(tmp_path, {0: 20.0, 1: 30.0, 2: 20.0})
    report = analyze(tmp_path)
    (finding,) = [f for f in report.findings if f.code == "straggler"]
    assert finding.ranks == [1] and finding.evidence["slowdown"] > 1.4
    # the host's view alone (the same trace without gpu_spans) says nothing of it
    assert report.summary["ranks"][1]["compute_ms"] == 30.0
    rows = {(r["rank"], r["name"]): r for r in report.summary["gpu_timing"]["rows"]}
    assert rows[(1, "forward")]["host_ms"] == 2.0 and rows[(1, "forward")]["gpu_ms"] == 10.0
    # the GPU began rank 0's backward at 0.5 + 20/3 ms into the step, the host at 2 ms
    assert rows[(0, "backward")]["launch_ms"] == round(0.5 + 20 / 3 - 2.0, 3)
    assert "timed on the GPU (CUDA events)" in text(report)


def test_without_gpu_times_the_same_host_phases_name_no_one(tmp_path: Path) -> None:
    _gpu_job(tmp_path, {0: 20.0, 1: 30.0, 2: 20.0})
    for folder in tmp_path.iterdir():
        for part in (folder / "gpu_spans").iterdir():
            part.unlink()
    report = analyze(tmp_path)
    assert "straggler" not in {f.code for f in report.findings}
    assert "gpu_timing" not in report.summary


def test_a_throttled_gpu_is_named_in_the_suggestion(tmp_path: Path) -> None:
    fast = [("gpu_sm_clock_mhz", 1980.0), ("gpu_clock_reasons", 0.0)]
    slow = [("gpu_sm_clock_mhz", 1410.0), ("gpu_clock_reasons", float(0x40 | 0x4))]
    _gpu_job(tmp_path, {0: 20.0, 1: 30.0, 2: 20.0}, {0: fast, 1: slow, 2: fast})
    (finding,) = [f for f in analyze(tmp_path).findings if f.code == "straggler"]
    assert "rank 1's GPU is throttled" in finding.suggestion
    assert "1,410 MHz against 1,980 MHz" in finding.suggestion
    assert "hardware thermal slowdown in 100%" in finding.suggestion
    assert "software power cap in 100%" in finding.suggestion


def test_a_slow_rank_at_full_clocks_is_said_not_throttled(tmp_path: Path) -> None:
    normal = [("gpu_sm_clock_mhz", 1980.0), ("gpu_clock_reasons", 0.0)]
    _gpu_job(tmp_path, {0: 20.0, 1: 30.0, 2: 20.0}, dict.fromkeys(range(WORLD), normal))
    (finding,) = [f for f in analyze(tmp_path).findings if f.code == "straggler"]
    assert finding.suggestion.startswith("rank 1's GPU is not throttled (its SM clock was 1,980")
    assert finding.evidence["gpu_throttled"] is False


def test_without_nvml_samples_the_suggestion_is_the_general_one(tmp_path: Path) -> None:
    _gpu_job(tmp_path, {0: 20.0, 1: 30.0, 2: 20.0})
    (finding,) = [f for f in analyze(tmp_path).findings if f.code == "straggler"]
    assert "throttled" not in finding.suggestion and "gpu_clocks" not in finding.evidence
    assert finding.suggestion.startswith("look at rank 1's host")
