"""Analysis on Dask: the same report as in-process, from a local cluster and by address."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dtprof.analysis import analyze
from tests import kinetobuild as kb

pytest.importorskip("dask.distributed")

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"


def test_a_local_cluster_gives_the_same_report_as_in_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dask.distributed import LocalCluster

    here = analyze(SAMPLES / "straggler-ddp").to_json()
    on_local = analyze(SAMPLES / "straggler-ddp", workers=2).to_json()
    assert json.dumps(on_local, sort_keys=True) == json.dumps(here, sort_keys=True)
    assert [f["code"] for f in here["findings"]] == ["straggler"]
    # and through a scheduler address, as on a real cluster; PyTorch profiler folders too
    kineto = tmp_path / "kineto"
    for rank in range(3):
        kb.write(kineto, f"rank{rank}.json", kb.trace(rank, world=3, steps=4, seq=True))
    monkeypatch.setenv("DTPROF_CACHE_DIR", str(tmp_path / "cache"))
    imported = analyze(kineto).to_json()
    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    ) as cluster:
        by_address = analyze(SAMPLES / "straggler-ddp", scheduler=cluster.scheduler_address)
        kineto_on_dask = analyze(kineto, scheduler=cluster.scheduler_address).to_json()
    assert json.dumps(by_address.to_json(), sort_keys=True) == json.dumps(here, sort_keys=True)
    assert json.dumps(kineto_on_dask, sort_keys=True) == json.dumps(imported, sort_keys=True)
    assert imported["summary"]["gpu"]["ranks"]  # the GPU figures came back from the workers


def test_an_unreachable_scheduler_is_one_line_and_exit_2() -> None:
    cmd = [sys.executable, "-m", "dtprof", "analyze", str(SAMPLES / "healthy-ddp")]
    out = subprocess.run(
        [*cmd, "--scheduler", "tcp://127.0.0.1:9"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 2
    assert out.stderr.startswith("dtprof: error: tcp://127.0.0.1:9: cannot reach the Dask")
    assert len(out.stderr.strip().splitlines()) == 1
    both = subprocess.run(
        [*cmd, "--scheduler", "tcp://x:1", "--workers", "2"], capture_output=True, text=True
    )
    assert both.returncode == 2 and "not allowed with" in both.stderr
