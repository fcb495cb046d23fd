"""The writer's segments: live frames of columns, sealing to Parquet, torn tails, failures."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dtprof.record.writer import DtprofWarning, TraceWriter
from dtprof.trace import live
from dtprof.trace.reader import read_table
from dtprof.trace.schema import KERNELS, STEPS


def _steps(writer: TraceWriter, first: int, n: int) -> None:
    for s in range(first, first + n):
        writer.buffers["steps"].append((s, 1000 * s, 1000 * s + 500))


def test_flush_appends_to_a_live_segment_readable_before_close(tmp_path: Path) -> None:
    w = TraceWriter(tmp_path)
    _steps(w, 0, 3)
    w.flush()
    _steps(w, 3, 2)
    w.flush()
    assert [p.name for p in (tmp_path / "steps").iterdir()] == ["_live-000000.msgpack"]
    assert read_table(tmp_path, STEPS).column("step").to_pylist() == [0, 1, 2, 3, 4]
    assert w.batches_written == 2


def test_close_seals_parquet_and_removes_the_segment(tmp_path: Path) -> None:
    w = TraceWriter(tmp_path)
    _steps(w, 0, 4)
    w.close()
    files = sorted(p.name for p in (tmp_path / "steps").iterdir())
    assert files == ["part-000000.parquet"]
    table = pq.read_table(tmp_path / "steps" / "part-000000.parquet")
    assert table.schema.equals(STEPS.schema)
    assert table.column("end_ns").to_pylist() == [500, 1500, 2500, 3500]


def test_sealed_parquet_has_dictionaries_for_strings_only_and_delta_times(
    tmp_path: Path,
) -> None:
    rows = [(s, 0, 7, f"k{s % 3}", "compute", 10 * s, 10 * s + 5, s, None) for s in range(50)]
    data = pa.Table.from_pylist(
        [dict(zip(KERNELS.column_names, r, strict=True)) for r in rows], schema=KERNELS.schema
    )
    KERNELS.write_parquet(data, tmp_path / "k.parquet")
    meta = pq.ParquetFile(tmp_path / "k.parquet").metadata
    encodings = {
        meta.schema.column(i).name: meta.row_group(0).column(i).encodings
        for i in range(meta.num_columns)
    }
    assert "RLE_DICTIONARY" in encodings["name"] and "RLE_DICTIONARY" in encodings["category"]
    assert "DELTA_BINARY_PACKED" in encodings["start_ns"]
    assert "DELTA_BINARY_PACKED" in encodings["end_ns"]
    assert not any("DICTIONARY" in e for e in encodings["correlation"])
    assert meta.row_group(0).column(0).compression == "ZSTD"
    assert pq.read_table(tmp_path / "k.parquet").equals(data)


def test_segments_roll_over_at_seal_rows(tmp_path: Path) -> None:
    w = TraceWriter(tmp_path, seal_rows=3)
    for first in (0, 3, 6):
        _steps(w, first, 3)
        w.flush()
    _steps(w, 9, 1)
    w.flush()
    names = sorted(p.name for p in (tmp_path / "steps").iterdir())
    assert names == [
        "_live-000003.msgpack",
        "part-000000.parquet",
        "part-000001.parquet",
        "part-000002.parquet",
    ]
    assert read_table(tmp_path, STEPS).column("step").to_pylist() == list(range(10))


def test_a_torn_last_batch_is_dropped_and_the_rest_kept(tmp_path: Path) -> None:
    w = TraceWriter(tmp_path)
    _steps(w, 0, 3)
    w.flush()
    _steps(w, 3, 3)
    w.flush()
    live = tmp_path / "steps" / "_live-000000.msgpack"
    data = live.read_bytes()
    live.write_bytes(data[:-10])  # a SIGKILL in the middle of the second frame
    assert read_table(tmp_path, STEPS).column("step").to_pylist() == [0, 1, 2]


def test_a_sealed_part_wins_over_a_segment_left_by_a_crash_mid_seal(tmp_path: Path) -> None:
    w = TraceWriter(tmp_path)
    _steps(w, 0, 2)
    w.flush()
    live = tmp_path / "steps" / "_live-000000.msgpack"
    leftover = live.read_bytes()
    w.close()
    live.write_bytes(leftover)  # the crash happened after the rename, before the unlink
    assert read_table(tmp_path, STEPS).column("step").to_pylist() == [0, 1]


def test_a_write_failure_stops_recording_once_without_raising(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    failures: list[BaseException] = []
    w = TraceWriter(tmp_path, on_failure=failures.append)
    _steps(w, 0, 2)
    w.flush()
    fd = w._segments["steps"]._fd

    def disk_full(self: object, frame: bytes, rows: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("dtprof.record.writer._Segment.append_frames", disk_full)
    _steps(w, 2, 2)
    w.flush()
    with pytest.raises(OSError):
        os.fstat(fd)  # the segment's file is closed, left unsealed
    _steps(w, 4, 2)
    w.flush()
    w.close()
    assert len(failures) == 1 and "No space left" in str(failures[0])
    assert w.failed and not w.buffers["steps"]
    assert read_table(tmp_path, STEPS).column("step").to_pylist() == [0, 1]


def test_without_a_failure_callback_a_failure_is_one_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = TraceWriter(tmp_path)
    monkeypatch.setattr(
        "dtprof.record.writer._Segment.append_frames",
        lambda self, frame, rows: (_ for _ in ()).throw(OSError("disk gone")),
    )
    _steps(w, 0, 1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        w.flush()
        _steps(w, 1, 1)
        w.flush()
    assert [str(c.message) for c in caught if c.category is DtprofWarning] == [
        "dtprof: trace writing stopped: disk gone"
    ]


def test_frames_added_as_they_are_are_written_before_the_rows_in_one_write_and_sealed_alike(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What arrives as a frame (the native kernel's rows) goes ahead of the rows queued beside
    it, all of a table's in one write; the seal makes of both one Parquet of the table's
    types."""
    w = TraceWriter(tmp_path)
    _steps(w, 2, 2)
    steps = np.array([0, 1])
    w.add_frame(
        "steps", 2, live.frame([live.packed(c, "<i8") for c in (steps, steps * 10, steps * 10 + 5)])
    )
    w.add_frame("steps", 0, b"")  # nothing: no frame
    writes: list[int] = []
    real_write = live.write_all
    monkeypatch.setattr(
        live, "write_all", lambda fd, data: writes.append(len(data)) or real_write(fd, data)
    )
    w.flush()
    assert w.batches_written == 2 and not w.frames["steps"]
    assert len(writes) == 2  # the segment's header, then both frames at once
    assert read_table(tmp_path, STEPS).column("step").to_pylist() == [0, 1, 2, 3]
    w.close()
    (part,) = (tmp_path / "steps").iterdir()
    sealed = pq.read_table(part)
    assert sealed.schema.equals(STEPS.schema)
    assert sealed.column("start_ns").to_pylist() == [0, 10, 2000, 3000]
