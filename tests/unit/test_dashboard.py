"""The dashboard without a browser: shaping, figures, callbacks and replay as plain functions."""

from __future__ import annotations

import io
import threading
from contextlib import redirect_stderr
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest
from dash import html

import dtprof
from dashboard import shape
from dashboard.app import PAGES, create_app, route, tick
from dashboard.links import finding_href, format_ranks, parse_ranks, parse_steps, query
from dashboard.pages import (
    communication,
    divergence,
    memory,
    overview,
    pipeline,
    ranks,
    timeline,
)
from dashboard.replay import ReplaySource, raise_steps
from dashboard.rundata import prefix
from dashboard.serve import is_loopback
from dashboard.source import LiveSource, Snapshot
from dtprof.analysis.report import Finding
from dtprof.cli import main
from dtprof.record.writer import TraceWriter, write_json_atomic
from dtprof.trace.schema import META_FILE, rank_dir_name
from tests.tracebuild import rank_meta

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"
_cache: dict[str, Snapshot] = {}


def snapshot(name: str) -> Snapshot:
    """A sample trace read fully (steps first, then the rest), once per test session."""
    if name not in _cache:
        source = LiveSource(SAMPLES / name)
        source.refresh()
        source.refresh()
        _cache[name] = source.snapshot()
    return _cache[name]


def _traces(fig: go.Figure) -> int:
    return len(fig.data)


# links and windows


def test_rank_and_step_windows_parse_and_print() -> None:
    assert parse_ranks("0-2,5, 7") == [0, 1, 2, 5, 7]
    assert parse_ranks("x") is None and parse_ranks("") is None
    assert format_ranks([5, 0, 1, 2, 7, 8]) == "0-2,5,7-8"
    assert parse_steps("4:10") == (4, 10) and parse_steps(":10") == (None, 10)
    assert parse_steps("7") == (7, 8) and parse_steps("a:b") == (None, None)
    assert query("?ranks=0-3&steps=4%3A7") == {"ranks": "0-3", "steps": "4:7"}


def test_each_finding_links_to_the_page_and_window_that_show_it() -> None:
    f = Finding("straggler", "error", [5], 4, 39, "m", "s")
    assert finding_href(f) == "/timeline?ranks=3-7&steps=4%3A7"
    stall = Finding("data-stall", "warning", [3], 4, 39, "m", "s", {"stall_steps": [9, 14]})
    assert "steps=8%3A11" in finding_href(stall)
    assert finding_href(Finding("pipeline-bubble", "info", [0, 1], 3, 29, "m", "s")) == (
        "/pipeline?step=3"
    )
    assert finding_href(Finding("non-finite", "error", [1], 30, 39, "m", "s")).startswith(
        "/divergence?ranks=1&steps=30%3A"
    )
    assert finding_href(Finding("poor-overlap", "warning", [0, 1], 4, 9, "m", "s")).startswith(
        "/communication?ranks=0-1"
    )


# shaping: bounded whatever the size


def test_grid_bins_to_at_most_the_cells_asked_and_keeps_the_worst() -> None:
    r, s = np.meshgrid(np.arange(1024), np.arange(1000), indexing="ij")
    values = pd.DataFrame({"rank": r.ravel(), "step": s.ravel(), "value": 1.0})
    values.loc[(values["rank"] == 700) & (values["step"] == 333), "value"] = 9.0
    g = shape.grid(values, max_ranks=200, max_steps=500)
    assert g.z.shape == (200, 500)
    i = int(np.flatnonzero((g.rank_lo <= 700) & (g.rank_hi >= 700))[0])
    j = int(np.flatnonzero((g.step_lo <= 333) & (g.step_hi >= 333))[0])
    assert g.z[i, j] == 9.0 and np.nanmax(np.delete(g.z, i, axis=0)) == 1.0


def test_band_folds_many_ranks_and_keeps_the_outlier() -> None:
    values = pd.DataFrame(
        {"rank": np.repeat(np.arange(64), 10), "step": np.tile(np.arange(10), 64), "value": 1.0}
    )
    values.loc[values["rank"] == 17, "value"] = 5.0
    lines = shape.band(values)
    labels = set(lines["label"])
    assert {"min of 64 ranks", "median of 64 ranks", "max of 64 ranks", "rank 17"} <= labels
    assert len(labels) <= shape.MAX_LINES
    few = shape.band(values[values["rank"] < 3])
    assert set(few["label"]) == {"rank 0", "rank 1", "rank 2"}


def test_rank_bars_average_consecutive_ranks_into_labelled_bars() -> None:
    per = pd.DataFrame({"rank": np.arange(10), "x": np.arange(10, dtype=float)})
    bars = shape.rank_bars(per, ["x"], max_bins=5)
    assert list(bars["label"]) == ["0-1", "2-3", "4-5", "6-7", "8-9"]
    assert list(bars["x"]) == [0.5, 2.5, 4.5, 6.5, 8.5]
    assert list(shape.rank_bars(per.head(3), ["x"], max_bins=5)["label"]) == ["0", "1", "2"]


def test_step_bars_keep_the_extremes_of_each_bin() -> None:
    band = pd.DataFrame(
        {"step": np.arange(10), "min_ms": np.arange(10.0), "median_ms": 5.0, "max_ms": 20.0}
    )
    band.loc[7, "max_ms"] = 99.0
    bars = shape.step_bars(band, max_bins=2)
    assert list(bars["step"]) == [0, 5] and list(bars["min_ms"]) == [0.0, 5.0]
    assert list(bars["max_ms"]) == [20.0, 99.0]
    assert len(shape.step_bars(band, max_bins=10)) == 10


# pages as plain functions, on real sample traces


def test_overview_headline_and_findings_of_the_straggler() -> None:
    snap = snapshot("straggler-ddp")
    head = overview.headline(snap.data)
    assert head["ranks"] == 4 and head["steps"] == 40 and 50 < head["step_ms"] < 500
    body = overview.update(snap)
    links = [c for c in body[2].children if hasattr(c, "href")]
    assert [link.href for link in links] == ["/timeline?ranks=0-3&steps=4%3A7"]
    band = overview.step_band(snap.data.steps)
    assert len(band) == 40 and (band["min_ms"] <= band["max_ms"]).all()


def test_overview_lists_a_consequence_under_its_cause() -> None:
    body = overview.update(snapshot("pipeline-slow-stage"))
    listing = body[2].children
    assert [getattr(c, "className", None) for c in listing] == [
        "finding-link",
        "consequences",
    ]
    (card,) = [c for c in listing[1].children if hasattr(c, "href")]
    assert "pipeline-bubble" in str(card.children)


def test_ranks_heatmaps_mark_the_culprit_and_show_its_compute() -> None:
    snap = snapshot("straggler-ddp")
    fig = ranks.update(snap, None, None)
    heat = [t for t in fig.data if t.type == "heatmap"]
    assert len(heat) == 4
    compute = np.asarray(heat[1].z)
    assert int(np.nanargmax(np.nanmedian(compute, axis=1))) == 1  # rank 1 computes longest
    waiting = np.asarray(heat[3].z)
    assert int(np.nanargmin(np.nanmedian(waiting, axis=1))) == 1  # and waits least
    marks = [t for t in fig.data if t.type == "scatter"]
    assert marks and all(list(m.y) == ["1"] for m in marks)


def test_timeline_joins_collectives_and_marks_the_last_arriver() -> None:
    snap = snapshot("straggler-ddp")
    frame, links, _ = timeline.bars(snap.data, [0, 1, 2, 3], (10, 13))
    assert {"forward", "backward", "collective"} <= set(frame["name"])
    last = links[links["is_last"]]
    assert not last.empty and (last["y"].round() == 1).mean() > 0.9  # rank 1's row
    fig = timeline.update(snap, "0-3", "10:13")
    assert any(t.name == "last to arrive" for t in fig.data)


def test_timeline_caps_what_it_ships() -> None:
    snap = snapshot("straggler-ddp")
    frame, _, _ = timeline.bars(snap.data, [0, 1, 2, 3], (None, None))
    assert len(frame) <= timeline.MAX_BARS


def test_communication_of_poor_overlap_is_exposed() -> None:
    snap = snapshot("poor-overlap")
    per = communication.overlap(snap.data, None)
    assert (per["exposed_fraction"] > 0.25).all()
    figs = communication.update(snap, None, None)
    assert len(figs) == 3 and all(_traces(f) for f in figs)
    ops = communication.ops(snap.data)
    assert "all_reduce" in set(ops["op"]) and (ops["mib_per_step"] > 0).all()
    bandwidth = communication.bandwidth(snap.data)
    assert set(bandwidth["op"]) == {"all_reduce"} and (bandwidth["busbw_gbs"] > 0).all()
    assert bandwidth["hover"].str.contains("busbw").all()
    later = communication.bandwidth(snap.data, (20, None))  # the steps shown
    assert later["calls"].sum() < bandwidth["calls"].sum()
    # steps the trace does not have: every figure says so, none fails
    beyond = communication.update(snap, None, "1000:")
    assert len(beyond) == 3 and not _traces(beyond[0]) and not _traces(beyond[1])


def test_pipeline_chart_shades_idle_and_compares_with_theory() -> None:
    snap = snapshot("pipeline-gpipe")
    acts, idle, stage_rows = pipeline.step_chart(snap.data, 10)
    assert stage_rows == [0, 1, 2, 3] and len(acts) == 4 * 4 * 2  # 4 microbatches, F and B
    assert (idle["end_ms"] > idle["start_ms"]).all() and not idle.empty
    chart, theory = pipeline.update(snap, "10")
    assert any(t.name == "idle (bubble)" for t in chart.data)
    assert theory.layout.shapes  # the theory line
    share = pipeline.idle_share(snap.data)
    assert (share["idle_fraction"] > 0.2).all()


def test_divergence_marks_non_finite_and_the_drifting_replica() -> None:
    snap = snapshot("divergence")
    _lines, marks = divergence.scalar_lines(snap.data, "loss", None, (None, None))
    assert not marks.empty and marks["step"].min() == 30
    grid = divergence.fingerprint_grid(snap.data, None)
    odd = grid[grid["value"] > 0]
    assert set(odd["rank"]) == {2} and odd["step"].min() == 10


def test_memory_and_pages_without_data_say_why() -> None:
    snap = snapshot("straggler-ddp")
    mem, gpu = memory.update(snap, None, None, None)
    assert _traces(mem) == 4
    assert "NVML" in gpu.layout.annotations[0].text
    chart, _ = pipeline.update(snap, None)
    assert "pipeline" in chart.layout.annotations[0].text


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.TITLE)
def test_every_page_routes_with_a_window(page: object) -> None:
    snap = snapshot("straggler-ddp")
    nav, body = route(snap, page.PATH, "?ranks=0-1&steps=5:8")  # type: ignore[attr-defined]
    assert [link.className for link in nav].count("active") == 1
    assert isinstance(body, html.Div)


def test_tick_updates_only_when_the_snapshot_changed() -> None:
    snap = snapshot("straggler-ddp")
    version, status = tick(snap, snap.version)
    assert version is not snap.version and "4 ranks" in status
    assert tick(snap, snap.version - 1)[0] == snap.version


# live: a growing trace


def _writer(trace: Path, rank: int) -> TraceWriter:
    folder = trace / rank_dir_name(rank)
    folder.mkdir(parents=True)
    write_json_atomic(folder / META_FILE, rank_meta(rank, 2, status="running"))
    return TraceWriter(folder)


def _step(w: TraceWriter, step: int) -> None:
    w.buffers["steps"].append((step, step * 100, step * 100 + 100))
    w.buffers["spans"].append(
        (step, "forward", "phase", step * 100, step * 100 + 60, 0, None, None)
    )
    w.buffers["scalars"].append((step, "loss", 1.0 / (step + 1)))
    w.flush()


def test_live_source_picks_up_new_steps_without_rereading(tmp_path: Path) -> None:
    writers = [_writer(tmp_path, r) for r in range(2)]
    for s in range(3):
        for w in writers:
            _step(w, s)
    source = LiveSource(tmp_path)
    assert source.refresh() and not source.snapshot().complete  # the steps first
    assert source.refresh() and source.snapshot().complete
    assert source.snapshot().data.last_step == 2
    read = source.follower.bytes_read
    assert not source.refresh()  # nothing new: no new snapshot, nothing read
    assert source.follower.bytes_read == read
    _step(writers[1], 3)
    assert source.refresh()
    snap = source.snapshot()
    assert snap.data.steps.groupby("rank")["step"].max().to_dict() == {0: 2, 1: 3}
    assert source.follower.bytes_read - read < 2000
    assert overview.headline(snap.data)["steps"] == 4


def test_live_source_names_a_rank_without_a_trace_until_it_writes(tmp_path: Path) -> None:
    first = _writer(tmp_path, 0)
    for s in range(3):
        _step(first, s)
    source = LiveSource(tmp_path)
    while source.refresh() and not source.snapshot().complete:
        pass

    def absent() -> list[list[int]]:
        found = source.snapshot().findings
        return [f.ranks for f in found if f.code == "rank-stopped" and f.first_step is None]

    assert absent() == [[1]]
    second = _writer(tmp_path, 1)
    for s in range(3):
        _step(second, s)
    assert source.refresh() and absent() == []


def test_live_source_thread_publishes_snapshots(tmp_path: Path) -> None:
    w = _writer(tmp_path, 0)
    _step(w, 0)
    source = LiveSource(tmp_path, poll_s=0.05)
    source.start()
    try:
        done = threading.Event()
        for _ in range(100):
            if source.snapshot().complete:
                done.set()
                break
            threading.Event().wait(0.05)
        assert done.is_set()
        _step(w, 1)
        for _ in range(100):
            if source.snapshot().data.last_step == 1:
                break
            threading.Event().wait(0.05)
        assert source.snapshot().data.last_step == 1
    finally:
        source.stop()


# replay


def test_findings_appear_at_the_step_an_online_check_first_raises_them() -> None:
    data = snapshot("divergence").data
    raised = raise_steps(data)
    assert [(f.code, f.ranks) for _, f in raised] == [
        ("replica-divergence", [2]),
        ("non-finite", [1]),
    ]
    (drift_step, _), (nan_step, _) = raised
    assert drift_step == 10 and nan_step == 30  # where the trace's README says they happen
    before = prefix(data, nan_step - 1).run
    from dtprof.analysis.checks import non_finite

    assert non_finite.check(before) == []  # not raised one step earlier


def test_replay_advances_with_its_clock() -> None:
    now = [0.0]
    replay = ReplaySource(SAMPLES / "divergence", speed=2.0, clock=lambda: now[0])
    assert replay.refresh() and replay.snapshot().data.last_step == 0
    assert replay.snapshot().findings == []
    ends = replay.step_at_s
    now[0] = float(ends[15]) / 2.0 + 1e-6  # step 15 reached at double speed
    replay.refresh()
    snap = replay.snapshot()
    assert snap.data.last_step == 15 and [f.code for f in snap.findings] == ["replica-divergence"]
    now[0] = 1e6
    replay.refresh()
    assert {f.code for f in replay.snapshot().findings} == {"replica-divergence", "non-finite"}
    assert "done" in replay.snapshot().status


# app and command line


def test_create_app_serves_the_app_and_no_files(tmp_path: Path) -> None:
    app = create_app(SAMPLES / "straggler-ddp", start=False)
    client = app.server.test_client()
    assert client.get("/").status_code == 200
    assert b"dtprof" in client.get("/").data
    for path in ("/assets/../README.md", "/rank=00000/meta.json", "/assets/style.css"):
        body = client.get(path).data
        assert b"schema_version" not in body and b"# dtprof" not in body


def test_bad_trace_is_one_line_and_exit_2(tmp_path: Path) -> None:
    err = io.StringIO()
    with redirect_stderr(err):
        code = main(["dashboard", str(tmp_path / "missing")])
    assert code == 2 and err.getvalue().count("\n") == 1 and "no such directory" in err.getvalue()
    with redirect_stderr(io.StringIO()) as err2:
        assert main(["replay", str(SAMPLES / "divergence"), "--speed", "-1"]) == 2
    assert "--speed" in err2.getvalue()


def test_only_loopback_is_quiet() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3")


def test_analysis_and_dashboard_agree() -> None:
    snap = snapshot("data-stall")
    report = dtprof.analyze(SAMPLES / "data-stall")
    assert sorted(f.message for f in snap.findings) == sorted(f.message for f in report.findings)
