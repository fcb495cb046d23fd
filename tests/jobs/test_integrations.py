"""The examples of each framework, run on 2 gloo ranks with a slow rank 1: the Hugging Face
Trainer and Lightning with their callbacks, an Accelerate loop under ``dtprof run``."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.jobs.expected import recorded_as_a_user_expects

pytestmark = pytest.mark.multiprocess

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]


def _needs(module: str) -> None:
    """Skip where the framework is not installed; CI installs it (the test extra)."""
    if importlib.util.find_spec(module) is None:
        if os.environ.get("CI"):
            pytest.fail(f"{module} is needed in CI (pip install -e '.[test]')")
        pytest.skip(f"{module} is not installed")


def _run(command: list[str], cwd: Path) -> None:
    done = subprocess.run(
        command, cwd=cwd, capture_output=True, text=True, timeout=300, env=dict(os.environ)
    )
    assert done.returncode == 0, done.stderr[-4000:]


def test_hugging_face_trainer_with_the_callback(tmp_path: Path) -> None:
    _needs("transformers")
    _run(
        [
            *TORCHRUN,
            str(EXAMPLES / "hf_trainer.py"),
            "--trace",
            "trace",
            "--steps",
            "10",
            "--slow-rank",
            "1",
        ],
        tmp_path,
    )
    recorded_as_a_user_expects(tmp_path / "trace", 10, samples=2 * 4, tokens=2 * 4 * 32)


def test_lightning_ddp_with_the_callback(tmp_path: Path) -> None:
    _needs("lightning")
    _run(
        [
            *TORCHRUN,
            str(EXAMPLES / "lightning_ddp.py"),
            "--trace",
            "trace",
            "--steps",
            "12",
            "--slow-rank",
            "1",
        ],
        tmp_path,
    )
    recorded_as_a_user_expects(tmp_path / "trace", 12, samples=2 * 16)


def test_an_accelerate_loop_under_dtprof_run(tmp_path: Path) -> None:
    _needs("accelerate")
    _run(
        [
            sys.executable,
            "-m",
            "dtprof",
            "run",
            "--trace",
            "trace",
            "--",
            *TORCHRUN,
            str(EXAMPLES / "accelerate_loop.py"),
            "--steps",
            "12",
            "--slow-rank",
            "1",
        ],
        tmp_path,
    )
    recorded_as_a_user_expects(tmp_path / "trace", 12, samples=2 * 16)
