"""``dtprof run`` on scripts written without dtprof: a torchrun DDP job and a process that
trains alone, as a user runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import dtprof
from dtprof.analysis import analyze
from tests.jobs.expected import recorded_as_a_user_expects

pytestmark = pytest.mark.multiprocess

WORKERS = Path(__file__).with_name("workers")
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _dtprof_run(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dtprof", "run", *args],
        cwd=cwd,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_an_unchanged_torchrun_script_is_recorded_and_its_straggler_named(tmp_path: Path) -> None:
    steps = 20
    done = _dtprof_run(
        [
            "--trace",
            "trace",
            "--",
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            str(EXAMPLES / "plain_ddp.py"),
            "--steps",
            str(steps),
            "--slow-rank",
            "1",
        ],
        tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "dtprof analyze trace" in done.stderr
    # the two ranks, nothing from the launcher, a step per optimizer step
    recorded_as_a_user_expects(tmp_path / "trace", steps, samples=2 * 16)


def test_a_script_that_trains_alone_is_recorded_with_its_failure(tmp_path: Path) -> None:
    # the user's own sitecustomize still runs (the script checks it)
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import os\nos.environ['USER_SITE'] = 'ran'\n")
    script = tmp_path / "train.py"
    script.write_text(
        "import os\nassert os.environ.get('USER_SITE') == 'ran'\n"
        + (WORKERS / "plain_alone.py").read_text()
    )
    done = _dtprof_run(
        ["--trace", "trace", "--", sys.executable, str(script)],
        tmp_path,
        PYTHONPATH=str(site),
        FAIL_AT="5",
    )
    assert done.returncode == 1 and "planted failure" in done.stderr, done.stderr[-3000:]
    trace = dtprof.load_trace(tmp_path / "trace")
    assert len(trace.steps) == 6
    # the model was found from the optimizer's parameters: its phases from the second step on
    forward = trace.spans[trace.spans["name"] == "forward"]
    assert sorted(forward["step"]) == [1, 2, 3, 4, 5]
    loss = trace.scalars[trace.scalars["name"] == "loss"]
    assert len(loss) == 6 and (loss["value"] < 10).all()  # the GradScaler's 65536 undone
    meta = json.loads((tmp_path / "trace" / "rank=00000" / "meta.json").read_text())
    assert meta["model_kind"] == "module" and meta["status"] == "raised RuntimeError"
    assert meta["exception"]["file"] == str(script) and meta["exception"]["step"] == 6


def test_an_unchanged_pipeline_script_is_recorded_with_its_schedule(tmp_path: Path) -> None:
    done = _dtprof_run(
        [
            "--trace",
            "trace",
            "--",
            str(Path(sys.executable).with_name("torchrun")),  # the launcher as users call it
            "--nproc-per-node",
            "2",
            str(WORKERS / "plain_pipeline.py"),
        ],
        tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    trace = dtprof.load_trace(tmp_path / "trace")
    assert trace.steps.groupby("rank").size().tolist() == [12, 12]
    meta = json.loads((tmp_path / "trace" / "rank=00001" / "meta.json").read_text())
    assert meta["pipeline"]["schedule"] == "ScheduleGPipe" and meta["model_kind"] == "none"
    actions = trace.spans[trace.spans["kind"] == "pipeline"]
    assert len(actions) == 2 * 12 * 4 * 2  # ranks x steps x microbatches x (F, B)
    codes = {f.code for f in analyze(tmp_path / "trace").findings}
    assert "pipeline-bubble" in codes and "straggler" not in codes
