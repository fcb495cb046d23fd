"""What the dashboard holds: summaries grown poll by poll (no rows), spans read on demand for
a window through a cache bounded in rows."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dashboard.growing_rank import NVML_PREFIX
from dashboard.pages import timeline
from dashboard.rows import RowCache
from dashboard.source import LiveSource
from dtprof.analysis.summarize import summarize_rank
from dtprof.record.writer import TraceWriter, write_json_atomic
from dtprof.trace.follow import read_window
from dtprof.trace.reader import load_trace
from dtprof.trace.schema import META_FILE, TABLES, rank_dir_name
from tests.tracebuild import rank_meta

SAMPLE = Path(__file__).parents[2] / "sample_traces" / "straggler-ddp"


def _frame(n: int) -> pd.DataFrame:
    return pd.DataFrame({"x": range(n)})


def test_row_cache_drops_the_least_recently_used_beyond_its_rows() -> None:
    cache = RowCache(max_rows=25)
    made: list[str] = []

    def make(key: str, n: int) -> pd.DataFrame:
        made.append(key)
        return _frame(n)

    cache.get("a", lambda: make("a", 10))
    cache.get("b", lambda: make("b", 10))
    cache.get("a", lambda: make("a", 10))  # a hit: "a" is now the most recent
    cache.get("c", lambda: make("c", 10))  # 30 rows > 25: "b", the least recent, goes
    assert made == ["a", "b", "c"] and cache.rows == 20 and len(cache) == 2
    cache.get("a", lambda: make("a", 10))
    cache.get("b", lambda: make("b", 10))
    assert made == ["a", "b", "c", "b"] and cache.rows <= cache.max_rows
    cache.get("big", lambda: make("big", 100))  # larger than the bound: kept alone
    assert len(cache) == 1 and cache.rows == 100


def test_read_window_skips_row_groups_outside_the_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / rank_dir_name(0)
    (folder / "spans").mkdir(parents=True)
    steps = list(range(10))
    table = pa.table(
        {
            "step": pa.array(steps, pa.int64()),
            "name": ["forward"] * 10,
            "kind": ["phase"] * 10,
            "start_ns": pa.array([s * 100 for s in steps], pa.int64()),
            "end_ns": pa.array([s * 100 + 50 for s in steps], pa.int64()),
            "depth": pa.array([0] * 10, pa.int16()),
            "stage": pa.array([None] * 10, pa.int16()),
            "microbatch": pa.array([None] * 10, pa.int32()),
        }
    ).cast(TABLES["spans"].schema)
    pq.write_table(table, folder / "spans" / "part-000000.parquet", row_group_size=2)
    asked: list[list[int]] = []
    real = pq.ParquetFile.read_row_groups

    def spy(self: pq.ParquetFile, groups: list[int], **kw: object) -> pa.Table:
        asked.append(list(groups))
        return real(self, groups, **kw)

    monkeypatch.setattr(pq.ParquetFile, "read_row_groups", spy)
    rows = read_window(folder, TABLES["spans"], 5, 7)
    assert rows.column("step").to_pylist() == [5, 6]
    assert asked == [[2, 3]]  # groups of steps 4-5 and 6-7, not the other three
    assert read_window(folder, TABLES["spans"], None, 1).column("step").to_pylist() == [0]
    assert read_window(tmp_path / "nope", TABLES["spans"], 0, 1).num_rows == 0


def test_read_window_reads_a_live_segment(tmp_path: Path) -> None:
    folder = tmp_path / rank_dir_name(0)
    folder.mkdir(parents=True)
    write_json_atomic(folder / META_FILE, rank_meta(0, 1, status="running"))
    writer = TraceWriter(folder)
    for s in range(4):
        writer.buffers["spans"].append(
            (s, "forward", "phase", s * 100, s * 100 + 60, 0, None, None)
        )
    writer.flush()
    rows = read_window(folder, TABLES["spans"], 1, 3)
    assert rows.column("step").to_pylist() == [1, 2]


def test_live_source_holds_summaries_and_reads_spans_on_demand(tmp_path: Path) -> None:
    trace = tmp_path / "trace"
    shutil.copytree(SAMPLE, trace)
    source = LiveSource(trace)
    source.refresh()
    source.refresh()
    assert not hasattr(source, "tables")  # no rank's rows are kept
    snap = source.snapshot()
    rows = snap.data.rows
    got = rows.spans([1, 2], (10, 13))
    full = load_trace(trace).spans
    want = full[full["rank"].isin([1, 2]) & full["step"].between(10, 12)]
    assert len(got) == len(want) > 0
    key = ["rank", "start_ns"]
    assert (
        got.sort_values(key)[key].to_numpy() == want.sort_values(key)[key].to_numpy()
    ).all()  # same rows, on the same (rank 0) clock
    reads = rows.cache.reads
    frame, _, _ = timeline.bars(snap.data, [1, 2], (10, 13))
    assert rows.cache.reads == reads and not frame.empty  # the window again: from the cache
    timeline.bars(snap.data, [1, 3], (10, 13))
    assert rows.cache.reads == reads + 1  # only rank 3 was read
    samples = snap.data.samples
    assert samples.empty or samples["metric"].astype(str).str.startswith(NVML_PREFIX).all()


def test_the_first_full_read_gives_the_same_run_here_and_in_worker_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dashboard import source as source_module

    trace = tmp_path / "trace"
    shutil.copytree(SAMPLE, trace)  # 4 ranks, 340 KB
    runs = []
    for processes_from in (source_module.PROCESSES_FROM, 1):  # as it is, then for any size
        monkeypatch.setattr(source_module, "PROCESSES_FROM", processes_from)
        source = LiveSource(trace)
        source.refresh()
        source.refresh()
        assert source.loaded
        runs.append(source.snapshot().data.run)
    for name in ("steps", "phases", "collectives", "memory", "last_span"):
        assert getattr(runs[0], name).equals(getattr(runs[1], name)), name


def _decoded(table: pa.Table) -> pa.Table:
    """The table with its dictionary columns as plain text (their dictionaries may differ)."""
    for i, field in enumerate(table.schema):
        if pa.types.is_dictionary(field.type):
            table = table.set_column(i, field.name, table.column(i).cast(field.type.value_type))
    return table


def _writer(trace: Path, rank: int) -> TraceWriter:
    folder = trace / rank_dir_name(rank)
    folder.mkdir(parents=True)
    write_json_atomic(folder / META_FILE, rank_meta(rank, 2, status="running"))
    return TraceWriter(folder)


def test_a_summary_grown_poll_by_poll_equals_one_made_at_once(tmp_path: Path) -> None:
    writers = [_writer(tmp_path, r) for r in range(2)]
    source = LiveSource(tmp_path)
    source.refresh()
    source.refresh()
    for s in range(6):
        for r, w in enumerate(writers):
            # the data phase of a step is written a poll before its step row, and so is a
            # synchronous all-reduce inside its forward, a poll before the forward's row
            w.buffers["spans"].append((s, "data", "phase", s * 100, s * 100 + 10, 0, None, None))
            w.buffers["collectives"].append(
                (s, "1", s, "all_reduce", 64, "float32", None, s * 100 + 20, s * 100 + 30,
                 False, "")
            )  # fmt: skip
            w.flush()
            if s % 2:
                source.refresh()
            w.buffers["spans"].append(
                (s, "forward", "phase", s * 100 + 10, s * 100 + 70, 0, None, None)
            )
            w.buffers["steps"].append((s, s * 100, s * 100 + 100))
            w.buffers["collectives"].append(
                (
                    s,
                    "0",
                    s,
                    "all_reduce",
                    64,
                    "float32",
                    None,
                    s * 100 + 70 + r,
                    s * 100 + 90,
                    False,
                    "",
                )
            )
            w.flush()
        source.refresh()
    for rank, growing in source.growing.items():
        once = summarize_rank(tmp_path / rank_dir_name(rank))
        for name in ("steps", "phases", "collectives"):
            a, b = _decoded(getattr(growing.summary, name)), _decoded(getattr(once, name))
            assert a.equals(b), (rank, name, a.to_pydict(), b.to_pydict())
    steps = source.snapshot().data.steps
    # the forward's 60 ns less the 10 it sat in the all-reduce
    assert steps["data_ns"].eq(10).all() and steps["compute_ns"].eq(50).all()
