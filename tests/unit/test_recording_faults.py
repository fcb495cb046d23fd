"""Recording that fails inside a real training process: a full disk, a hook that raises."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import dtprof
from dtprof.analysis import analyze

JOB = Path(__file__).parents[1] / "jobs" / "workers" / "recording_faults.py"


def _run(tmp_path: Path, mode: str) -> tuple[Path, str]:
    trace = tmp_path / mode
    done = subprocess.run(
        [sys.executable, str(JOB), str(trace), mode, "12", "4"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "trained 12 steps"
    return trace, done.stderr


@pytest.mark.timeout(150)
def test_a_full_disk_mid_run(tmp_path: Path) -> None:
    trace_dir, log = _run(tmp_path, "disk")
    assert log.count("DtprofWarning") == 1, log
    assert "trace writing stopped ([Errno 28] No space left on device)" in log
    trace = dtprof.load_trace(trace_dir)
    assert list(trace.steps["step"]) == [0, 1, 2, 3]  # all written before the fault, readable
    assert trace.meta[0].status == "recording stopped: [Errno 28] No space left on device"
    (stopped,) = [f for f in analyze(trace_dir).findings if f.code == "rank-stopped"]
    assert stopped.evidence["status"].startswith("recording stopped")


@pytest.mark.timeout(150)
def test_a_hook_that_raises_mid_run_leaves_partial_data_said_so(tmp_path: Path) -> None:
    trace_dir, log = _run(tmp_path, "hook")
    assert log.count("DtprofWarning") == 1, log
    trace = dtprof.load_trace(trace_dir)
    assert list(trace.steps["step"]) == list(range(12))  # steps go on being recorded
    assert trace.meta[0].disabled_hooks == ("phases",)
    (partial,) = [f for f in analyze(trace_dir).findings if f.code == "partial-data"]
    assert (partial.severity, partial.ranks, partial.first_step) == ("info", [0], 4)
    assert partial.evidence["from_step"] == {0: {"phases": 4}}
    assert "phases from step 4" in partial.message
