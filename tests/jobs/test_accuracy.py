"""The accuracy benchmark end to end, on a few seeded trials of kinds it must always get right."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.multiprocess

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "accuracy.py"


def test_planted_faults_are_found_where_they_were_planted(tmp_path: Path) -> None:
    kinds = "exception-at-start,killed,slow-stage-1f1b,slow-link"
    proc = subprocess.run(
        [sys.executable, str(BENCHMARK), "--seed", "3", "--trials", "4", "--kinds", kinds],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "| **all** | 4 | 4/4 | 4/4 | 4/4 | 4/4 |" in proc.stdout, proc.stdout
