"""dtprof export --chrome: one merged multi-rank timeline for Perfetto and chrome://tracing."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from dtprof.cli import main
from dtprof.trace.chrome import COLL_TID, GPU_COLL_TID, GPU_SPAN_TID, SPAN_TID, STREAM_TID0
from tests import kinetobuild as kb
from tests.tracebuild import rank_meta, write_rank


def _native(root: Path, world: int = 3, steps: int = 4) -> Path:
    for rank in range(world):
        rows: dict[str, list[tuple[Any, ...]]] = {"steps": [], "spans": [], "collectives": []}
        for s in range(steps):
            t = 1_000_000 + s * 10_000_000 + rank * 1_000
            rows["steps"].append((s, t, t + 10_000_000))
            rows["spans"].append((s, "forward", "phase", t, t + 4_000_000, 0, None, None))
            rows["collectives"].append(
                (s, "0", s, "all_reduce", 64, "float32", None, t + 5_000_000 + rank * 10,
                 t + 6_000_000, False, None)
            )  # fmt: skip
        write_rank(root, rank_meta(rank, world), rows)
    return root


def _load(path: Path) -> list[dict[str, Any]]:
    raw = gzip.decompress(path.read_bytes()) if path.name.endswith(".gz") else path.read_bytes()
    doc = json.loads(raw)
    assert isinstance(doc["traceEvents"], list)
    for e in doc["traceEvents"]:
        assert {"ph", "pid", "name"} <= set(e), e
        if e["ph"] == "X":
            assert isinstance(e["ts"], float | int) and e["dur"] >= 0 and e["ts"] >= 0
    return doc["traceEvents"]


def test_native_trace_exports_processes_tracks_slices_and_flows(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    assert main(["export", str(_native(tmp_path / "t")), "--chrome", str(out)]) == 0
    events = _load(out)
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert names == {0: "rank 0 (test)", 1: "rank 1 (test)", 2: "rank 2 (test)"}
    kinds = Counter((e["ph"], e.get("cat")) for e in events if e["ph"] != "M")
    assert kinds[("X", "step")] == 12 and kinds[("X", "span")] == 12
    assert kinds[("X", "collective")] == 12
    # each all-reduce links its three ranks: one start on the first to enter, two finishes
    assert kinds[("s", "collective")] == 4 and kinds[("f", "collective")] == 8
    starts = [e for e in events if e["ph"] == "s"]
    assert {e["pid"] for e in starts} == {0} and len({e["id"] for e in starts}) == 4
    assert all(e["tid"] == COLL_TID for e in events if e["ph"] in "sf")
    first_step = min(e["ts"] for e in events if e.get("cat") == "step")
    assert first_step == 0.0  # times from the earliest event, aligned across ranks


GPU_SAMPLE = Path(__file__).resolve().parents[2] / "sample_traces" / "gpu-straggler"


@pytest.mark.skipif(not GPU_SAMPLE.exists(), reason="no sample traces")
def test_a_cuda_jobs_gpu_times_get_tracks_beside_the_hosts(tmp_path: Path) -> None:
    out = tmp_path / "gpu.json"
    assert main(["export", str(GPU_SAMPLE), "--chrome", str(out)]) == 0
    events = _load(out)
    tracks = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert tracks[(1, GPU_SPAN_TID)] == "phases and regions (GPU)"
    assert tracks[(1, GPU_COLL_TID)] == "collectives (GPU)"

    def forward_ms(tid: int) -> float:
        durations = sorted(
            e["dur"] for e in events if (e["pid"], e["tid"], e["name"]) == (1, tid, "forward")
        )
        return durations[len(durations) // 2] / 1000

    # rank 1's forward: a launch of a few ms on the host, 30 ms more of work on the GPU
    assert forward_ms(SPAN_TID) < 10 and forward_ms(GPU_SPAN_TID) > 30
    assert any(e["tid"] == GPU_COLL_TID and e["name"] == "all_reduce" for e in events)


def test_imported_profiler_traces_export_gpu_streams_gzipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DTPROF_CACHE_DIR", str(tmp_path / "cache"))
    folder = tmp_path / "k"
    for rank in (0, 1):
        kb.write(folder, f"w{rank}.json.gz", kb.trace(rank, relative=True))
    out = tmp_path / "out.json.gz"
    assert main(["export", str(folder), "--chrome", str(out)]) == 0
    events = _load(out)
    threads = {
        (e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"
    }
    assert threads[(1, STREAM_TID0 + kb.NCCL_STREAM)] == f"GPU 0 stream {kb.NCCL_STREAM}"
    gpu = [e for e in events if e.get("cat") == "gpu"]
    assert len(gpu) == 2 * 9  # 3 steps x (compute, NCCL, memcpy) per rank
    assert Counter(e["ph"] for e in events if e.get("cat") == "collective") == {
        "X": 6, "s": 3, "f": 3,
    }  # fmt: skip


def test_unwritable_output_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "no" / "such" / "dir" / "out.json"
    assert main(["export", str(_native(tmp_path / "t")), "--chrome", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(out) in err
