"""The dashboard's live source following a real gloo job while it trains."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.multiprocess


def test_live_source_follows_a_real_running_job(tmp_path: Path) -> None:
    """A real 2-rank gloo job, still training while the dashboard's source polls it."""
    import time

    from dashboard.source import LiveSource
    from dtprof.jobs import launch

    trace, logs = tmp_path / "trace", tmp_path / "logs"
    steps = 60
    args = ["--trace", str(trace), "--steps", str(steps), "--device-ms", "60"]
    procs = launch.start("healthy-ddp", 2, args, logs)
    try:
        deadline = time.monotonic() + 120
        while not (trace / "rank=00001" / "meta.json").exists():
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
            time.sleep(0.2)
        source = LiveSource(trace)
        seen = []
        while all(p.poll() is None for p in procs) and time.monotonic() < deadline:
            if source.refresh() and len(source.snapshot().data.steps):
                seen.append(int(source.snapshot().data.steps["step"].max()))
            time.sleep(0.5)
        assert launch.wait(procs, 60) == [0, 0]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    # steps appeared while the job ran, growing from poll to poll
    grown = sorted(set(seen))
    assert len(grown) >= 3 and grown == sorted(grown) and grown[0] < steps - 10, seen
    while source.refresh():
        pass
    final = source.snapshot()
    assert final.complete and final.data.steps.groupby("rank")["step"].max().to_dict() == {
        0: steps - 1,
        1: steps - 1,
    }
    assert [f.code for f in final.findings if f.severity != "info"] == []
