"""Shared helpers: run real gloo jobs from dtprof.jobs and show their logs when they fail."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dtprof.cache import native_root
from dtprof.jobs import launch

# the native libraries stay where they were built while tests point DTPROF_CACHE_DIR elsewhere
os.environ.setdefault("DTPROF_NATIVE_DIR", str(native_root()))


def logs_of(log_dir: Path) -> str:
    return "\n".join(
        f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
        for p in sorted(log_dir.glob("*.log"))
    )


@pytest.fixture
def run_job(tmp_path: Path):
    """run_job(situation, world_size, *args) -> trace dir; fails with the ranks' logs."""

    def run(situation: str, world_size: int, *args: str, timeout_s: float = 180) -> Path:
        trace = tmp_path / situation
        log_dir = tmp_path / f"{situation}-logs"
        codes = launch.run(
            situation,
            world_size,
            ["--trace", str(trace), *args],
            timeout_s=timeout_s,
            log_dir=log_dir,
        )
        assert codes == [0] * world_size, f"exit codes {codes}\n{logs_of(log_dir)}"
        return trace

    return run


def native_kernel_or_skip() -> None:
    """Skip where the native kernel is not built (``dtprof build-native``; scripts/test.sh
    builds it). In CI it must be there: its absence fails the test."""
    from dtprof.record import native

    loaded, why_not = native.load()
    if loaded is None:
        if os.environ.get("CI"):
            pytest.fail(f"the native kernel is needed in CI: {why_not}")
        pytest.skip(f"the native kernel: {why_not}")


@pytest.fixture(params=["native", "python"])
def kernel(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Which kernel records, DDP's buckets and the backward phase: the native one (where
    built) or the Python one (``DTPROF_NATIVE=0``)."""
    if request.param == "native":
        native_kernel_or_skip()
    else:
        monkeypatch.setenv("DTPROF_NATIVE", "0")
    return str(request.param)


def native_reader_or_skip() -> None:
    """Skip where the native profiler-trace reader was not built at install (no C++ compiler).
    In CI it must be there: its absence fails the test."""
    from dtprof.trace.kineto.scan_ahead import native_reader

    loaded, why_not = native_reader()
    if loaded is None:
        if os.environ.get("CI"):
            pytest.fail(f"the native profiler-trace reader is needed in CI: {why_not}")
        pytest.skip(f"the native profiler-trace reader: {why_not}")
