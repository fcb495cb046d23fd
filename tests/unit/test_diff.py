"""dtprof diff: the test that calls a change, and the command on recorded and profiler traces."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dtprof.analysis.diff import compare, mann_whitney_p, spread

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"
PAIR = Path(__file__).resolve().parents[3] / "shared" / "reference_traces" / "hta_trace_diff"
if not PAIR.is_dir():
    PAIR = Path("/work/shared/reference_traces/hta_trace_diff")


def _diff(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dtprof", "diff", *map(str, args)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_mann_whitney_matches_the_normal_approximation_by_hand() -> None:
    # n1 = n2 = 3, no ties, complete separation: U = 0, mean 4.5, variance 3*3*7/12
    z = (4.5 - 0.5) / math.sqrt(5.25)
    p = mann_whitney_p(np.array([1.0, 2, 3]), np.array([4.0, 5, 6]))
    assert p == pytest.approx(math.erfc(z / math.sqrt(2))) and p == pytest.approx(0.0809, abs=5e-4)
    a, b = np.array([1.0, 1, 2, 3]), np.array([2.0, 3, 3, 5])
    assert mann_whitney_p(a, b) == pytest.approx(mann_whitney_p(b, a))
    assert mann_whitney_p(a, a) == 1.0
    assert mann_whitney_p(np.ones(5), np.ones(5)) == 1.0  # every value ties
    assert mann_whitney_p(a, np.array([])) == 1.0


def test_a_change_is_called_only_when_real_and_larger_than_the_noise() -> None:
    rng = np.random.default_rng(0)
    base = 100 + rng.normal(0, 1, 200)
    assert spread(base) == pytest.approx(1.0, rel=0.15)
    shifted = compare(base, base + 5)
    assert shifted["called"] and shifted["change_pct"] == pytest.approx(5, abs=0.5)
    # real (thousands of steps make p tiny) but inside the step-to-step noise: not called
    wide = 100 + rng.normal(0, 10, 5000)
    small = compare(wide, wide + 3)
    assert small["p"] < 0.01 and not small["called"]
    same = compare(base, 100 + rng.normal(0, 1, 200))
    assert not same["called"]
    assert compare(base, np.array([np.nan]))["called"] is False


def test_a_change_smaller_than_a_hundredth_of_the_step_is_never_called() -> None:
    # a steady 0.20 ms data phase that reads 0.17 ms in the next run of a 70 ms step: real and
    # beyond its own tiny noise, but no change to anyone's training
    rng = np.random.default_rng(1)
    data, again = 0.20 + rng.normal(0, 0.005, 40), 0.17 + rng.normal(0, 0.005, 40)
    alone = compare(data, again)
    assert alone["called"]  # by the noise alone it would be
    held = compare(data, again, least=0.01 * 70)
    assert not held["called"] and held["noise_pct"] == pytest.approx(350, abs=1)
    # the same shift in a 2 ms data phase of a 10 ms step is a tenth of the step: called
    assert compare(data + 1.8, again + 1.5, least=0.01 * 10)["called"]


def test_a_recorded_straggler_against_a_healthy_run() -> None:
    done = _diff(SAMPLES / "healthy-ddp", SAMPLES / "straggler-ddp", "--format", "json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["metrics"]["step_ms"]["called"]
    assert result["metrics"]["step_ms"]["change_pct"] > 10
    assert result["findings"]["appeared"][0]["code"] == "straggler"
    assert result["bandwidth"] and result["memory"]["rss_mib"]["base"] > 0
    markdown = _diff(SAMPLES / "healthy-ddp", SAMPLES / "straggler-ddp", "--format", "markdown")
    assert markdown.stdout.startswith("### dtprof diff:") and "| step |" in markdown.stdout


def test_profiler_traces_compare_too() -> None:
    if not PAIR.is_dir():
        pytest.skip(f"reference traces not here ({PAIR})")
    done = _diff(PAIR / "control.json.gz", PAIR / "test.json.gz", "--format", "json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["base"]["steps_compared"] == result["new"]["steps_compared"] == 6
    compute = result["metrics"]["compute_ms"]  # the GPU's compute kernels, per step
    assert compute["base"] > 0 and compute["new"] > 0
    # +73% in medians, but six steps that vary by half: inside the noise band, not called
    assert compute["change_pct"] > 50 and compute["p"] < 0.01 and not compute["called"]
    assert result["gpu"] == []  # rank 3 of one job against rank 1 of another


def test_traces_without_steps_compare_by_their_gpu_figures() -> None:
    folder = PAIR.parent / "hta_unstepped"
    if not folder.is_dir():
        pytest.skip(f"reference traces not here ({folder})")
    done = _diff(folder / "simple_add.json.gz", folder / "mtia_rank_0.json.gz", "--format", "json")
    assert done.returncode == 0, done.stderr
    (rank,) = json.loads(done.stdout)["gpu"]
    assert rank["rank"] == 0
    assert rank["idle_pct"]["base"] == pytest.approx(99.7, abs=0.1)
    assert rank["compute_pct"]["new"] == pytest.approx(54.8, abs=0.1)


def test_bad_input_is_one_line(tmp_path: Path) -> None:
    done = _diff(tmp_path / "missing", SAMPLES / "healthy-ddp")
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "missing" in done.stderr and "Traceback" not in done.stderr
    done = _diff(SAMPLES / "healthy-ddp", SAMPLES / "healthy-ddp", "--fail-on-regression", "x")
    assert done.returncode == 2 and "--fail-on-regression" in done.stderr
    out = tmp_path / "no" / "such" / "dir" / "diff.json"
    done = _diff(SAMPLES / "healthy-ddp", SAMPLES / "healthy-ddp", "-o", out)
    assert done.returncode == 2 and "cannot write" in done.stderr and not out.exists()
