"""Crash safety and failures on real jobs: SIGKILL, a hang, hooks that raise."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

import dtprof
from dtprof.analysis import analyze
from dtprof.errors import DtprofError
from dtprof.jobs import launch
from tests.conftest import logs_of, native_kernel_or_skip

pytestmark = pytest.mark.multiprocess


def _poll(predicate, timeout_s: float, what: str, log_dir: Path, procs):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            pytest.fail(f"a rank ended while waiting for {what}\n{logs_of(log_dir)}")
        try:
            value = predicate()
        except (DtprofError, FileNotFoundError, KeyError):
            value = None
        if value:
            return value
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for {what}\n{logs_of(log_dir)}")


def test_a_sigkilled_rank_leaves_a_readable_trace_up_to_about_a_flush_before(
    tmp_path: Path,
) -> None:
    trace_dir, logs = tmp_path / "trace", tmp_path / "logs"
    procs = launch.start(
        "until-killed",
        2,
        ["--trace", str(trace_dir), "--steps", "100000", "--fingerprint-every", "0"],
        log_dir=logs,
    )
    try:
        _poll(
            lambda: len(dtprof.load_trace(trace_dir).steps) >= 40,
            120,
            "40 steps on disk",
            logs,
            procs,
        )
        time.sleep(1.0)
        killed_at_ns = time.time_ns()
        os.kill(procs[1].pid, signal.SIGKILL)
        codes = launch.wait(procs, 60)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert codes[1] == -signal.SIGKILL
    trace = dtprof.load_trace(trace_dir)
    # everything older than about a flush interval before the kill is on disk
    last_end = trace.steps.groupby("rank")["end_ns"].max()
    lost_s = (killed_at_ns - last_end[1]) / 1e9
    assert lost_s < trace.meta[1].config.flush_interval_s + 0.7, lost_s
    status = trace.ranks.set_index("rank")["status"]
    assert status[1] == "running"
    # gloo tells rank 0 its peer is gone: the all-reduce fails, and the trace says so
    assert status[0] == "raised RuntimeError", logs_of(logs)
    failed = trace.collectives[trace.collectives["label"].str.endswith(";error", na=False)]
    assert failed["rank"].tolist() == [0] and failed["label"].iloc[0].startswith("ddp.bucket")
    ok_on_0 = trace.collectives[
        (trace.collectives["rank"] == 0) & ~trace.collectives.index.isin(failed.index)
    ]
    assert failed["seq"].iloc[0] == ok_on_0["seq"].max() + 1
    # the analyzer reads the rest normally and says rank 1 stopped early
    stopped = [f for f in analyze(trace_dir).findings if f.code == "rank-stopped"]
    killed = next(f for f in stopped if f.ranks == [1])
    assert killed.evidence["status"] == "running" and killed.severity == "error"
    # its last steps may have died in its writer's buffer, so it need not look behind rank 0
    last_step = trace.steps.groupby("rank")["step"].max()
    assert killed.evidence["last_step"] == last_step[1]
    assert killed.evidence["furthest_step"] == last_step.max()
    # rank 0 completed all-reduces with it up to a later step than its own trace reached
    alive = killed.evidence["alive_until_step"]
    assert alive == ok_on_0["step"].max() >= last_step[1]
    assert killed.first_step == alive + 1 <= killed.last_step
    # rank 0 only lost its peer: a consequence, named as such
    (follower,) = [f for f in stopped if f is not killed]
    assert (follower.ranks, follower.severity, follower.evidence["after"]) == ([0], "warning", [1])


def _hung_job(
    situation: str, trace_dir: Path, logs: Path, *args: str, env: dict[str, str] | None = None
) -> tuple[list[dict], list[dict]]:
    """Run a 2-rank job whose rank 1 stops at step 3 (rank 0 waits for it, the watchdog's
    timeout 1 s) until a hang event is on disk: (the hang events, rank 0's inflight.json). The
    job is killed afterwards; the watchdog must not have ended it."""
    cmd = ["--trace", str(trace_dir), "--steps", "10", "--slow-rank", "1", "--nan-step", "3"]
    procs = launch.start(
        situation, 2, [*cmd, "--hang-timeout-s", "1", *args], log_dir=logs, env=env
    )
    try:
        # rank 0 waits in step 3's all-reduce: a hang event within the timeout and a flush
        events = _poll(lambda: _hangs(trace_dir), 60, "a hang event on disk", logs, procs)
        inflight = json.loads((trace_dir / "rank=00000" / "inflight.json").read_text())
        assert all(p.poll() is None for p in procs), "the watchdog must never end the job"
    finally:
        for p in procs:
            p.kill()
            p.wait()
    return events, inflight


def test_the_watchdog_records_a_hang_with_stacks_and_flushes_it_at_once(tmp_path: Path) -> None:
    trace_dir, logs = tmp_path / "trace", tmp_path / "logs"
    # rank 1 skips the all-reduce of step 3
    events, inflight = _hung_job("skip-collective", trace_dir, logs)
    (event,) = events
    assert [(op["op"], op["seq"], op["step"]) for op in inflight] == [("all_reduce", 3, 3)]
    detail = json.loads(event["detail"])
    assert event["rank"] == 0 and event["step"] == 3
    assert (detail["op"], detail["group"], detail["seq"]) == ("all_reduce", "0", 3)
    assert 1.0 <= detail["waited_s"] < 3.0
    main_stack = next(s for s in detail["stacks"] if s["thread"] == "MainThread")
    functions = [f["function"] for f in main_stack["frames"]]
    assert "skip_collective" in functions
    assert main_stack["frames"][-1]["function"] in ("all_reduce", "wrapper")
    # the analyzer names the rank that never joined and what it was doing instead
    (hang,) = [f for f in analyze(trace_dir).findings if f.code == "hang"]
    assert hang.ranks == [1]
    assert (hang.evidence["op"], hang.evidence["seq"], hang.evidence["joined"]) == (
        "all_reduce",
        3,
        [0],
    )


@pytest.mark.parametrize("kernel", ["native", "python"])
def test_a_hang_in_a_ddp_bucket_is_in_flight_on_disk_and_recorded(
    tmp_path: Path, kernel: str
) -> None:
    """DDP launches its buckets from C++: the kernel that sees them puts a hung one in the
    in-flight table, where inflight.json and the watchdog find it."""
    if kernel == "native":
        native_kernel_or_skip()
    trace_dir, logs = tmp_path / "trace", tmp_path / "logs"
    events, inflight = _hung_job(
        "skip-bucket",
        trace_dir,
        logs,
        "--fingerprint-every",
        "0",
        env={"DTPROF_NATIVE": "0"} if kernel == "python" else None,
    )
    meta = json.loads((trace_dir / "rank=00000" / "meta.json").read_text())
    assert meta["ddp_buckets_kernel"] == kernel
    (op,) = inflight
    assert (op["op"], op["step"], op["label"]) == ("all_reduce", 3, "ddp.bucket0")
    (event,) = events
    detail = json.loads(event["detail"])
    assert (detail["op"], detail["seq"], detail["label"]) == (
        "all_reduce",
        op["seq"],
        "ddp.bucket0",
    )
    assert 1.0 <= detail["waited_s"] < 3.0
    main_stack = next(s for s in detail["stacks"] if s["thread"] == "MainThread")
    assert "skip_bucket" in [f["function"] for f in main_stack["frames"]]
    (hang,) = [f for f in analyze(trace_dir).findings if f.code == "hang"]
    assert hang.ranks == [1] and hang.evidence["joined"] == [0]


def _hangs(trace_dir: Path) -> list[dict]:
    events = dtprof.load_trace(trace_dir).events
    return events[events["kind"] == "hang"].to_dict("records")


def test_hooks_that_raise_do_not_stop_training(run_job, tmp_path: Path) -> None:
    trace = dtprof.load_trace(run_job("faulty-hooks", 2, "--steps", "8"))
    assert trace.steps.groupby("rank").size().tolist() == [8, 8]
    assert all(
        # DDP's buckets are its only collectives: their kernel at the dispatcher is what raised
        sorted(m.disabled_hooks) == ["ddp buckets", "phases"]
        for m in trace.meta.values()
    )
    errors = trace.events[trace.events["kind"] == "hook-error"]
    assert errors.groupby("rank").size().tolist() == [2, 2]
    log = (tmp_path / "faulty-hooks-logs" / "rank-0.log").read_text()
    assert log.count("DtprofWarning") == 2, log
