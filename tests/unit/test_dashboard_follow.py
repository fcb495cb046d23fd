"""TraceFollower: each poll reads only what is new, across growing segments and seals."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from dtprof.errors import DtprofError
from dtprof.record.writer import TraceWriter, write_json_atomic
from dtprof.trace import live
from dtprof.trace.follow import TraceFollower
from dtprof.trace.reader import load_trace
from dtprof.trace.schema import META_FILE, STEPS, rank_dir_name
from tests.tracebuild import rank_meta


def _writer(trace: Path, rank: int, world: int = 2) -> TraceWriter:
    folder = trace / rank_dir_name(rank)
    folder.mkdir(parents=True)
    write_json_atomic(folder / META_FILE, rank_meta(rank, world, base=1000 * rank))
    return TraceWriter(folder)


def _steps(writer: TraceWriter, first: int, count: int) -> None:
    writer.buffers["steps"].extend((s, s * 10, s * 10 + 10) for s in range(first, first + count))


def _new_steps(follower: TraceFollower) -> list[int]:
    delta = follower.poll()
    return [
        s for t in delta.tables.values() if "steps" in t for s in t["steps"]["step"].to_pylist()
    ]


def test_reads_only_new_rows_of_a_growing_segment(tmp_path: Path) -> None:
    w0, w1 = _writer(tmp_path, 0), _writer(tmp_path, 1)
    _steps(w0, 0, 3)
    _steps(w1, 0, 2)
    w0.flush()
    w1.flush()
    follower = TraceFollower(tmp_path)
    first = follower.poll()
    assert sorted(first.meta) == [0, 1]
    assert {r: t["steps"].num_rows for r, t in first.tables.items()} == {0: 3, 1: 2}

    read = follower.bytes_read
    nothing = follower.poll()
    assert nothing.empty and follower.bytes_read == read

    _steps(w0, 3, 2)
    w0.flush()
    second = follower.poll()
    assert list(second.tables) == [0]
    assert second.tables[0]["steps"]["step"].to_pylist() == [3, 4]
    assert follower.bytes_read - read < 1000  # one small frame, not the segment again


def test_seal_rename_and_next_segment(tmp_path: Path) -> None:
    w0 = _writer(tmp_path, 0, world=1)
    _steps(w0, 0, 4)
    w0.flush()
    follower = TraceFollower(tmp_path)
    assert follower.poll().tables[0]["steps"].num_rows == 4
    _steps(w0, 4, 2)
    w0.flush(seal=True)  # the segment gets two more rows, then becomes part-000000.parquet
    assert not list((tmp_path / "rank=00000" / "steps").glob("_live-*"))
    assert _new_steps(follower) == [4, 5]
    _steps(w0, 6, 1)
    w0.flush()  # opens _live-000001.msgpack
    assert _new_steps(follower) == [6]
    assert follower.poll().empty


@pytest.mark.parametrize("cut", [2, 9])  # inside the frame's length, inside its columns
def test_torn_frame_is_read_once_whole(tmp_path: Path, cut: int) -> None:
    w0 = _writer(tmp_path, 0, world=1)
    _steps(w0, 0, 1)
    w0.flush()
    follower = TraceFollower(tmp_path)
    assert _new_steps(follower) == [0]

    # the bytes of one more frame, appended in two pieces as a slow write would
    frame = live.rows_frame([(7, 70, 80)], STEPS)
    segment = tmp_path / "rank=00000" / "steps" / "_live-000000.msgpack"
    with open(segment, "ab") as f:
        f.write(frame[:cut])
    assert _new_steps(follower) == []
    with open(segment, "ab") as f:
        f.write(frame[cut:])
    assert _new_steps(follower) == [7]


def test_accumulated_rows_equal_load_trace(tmp_path: Path) -> None:
    writers = [_writer(tmp_path, r) for r in range(2)]
    follower = TraceFollower(tmp_path)
    got: list[pd.DataFrame] = []
    for round_ in range(3):
        for w in writers:
            _steps(w, round_ * 2, 2)
            w.buffers["scalars"].append((round_, "loss", float(round_)))
            w.flush(seal=round_ == 1)
        delta = follower.poll()
        got.append(delta.frame("steps", {r: s.meta for r, s in follower.ranks.items()}))
    steps = pd.concat(got).sort_values(["rank", "step"]).reset_index(drop=True)
    expected = load_trace(tmp_path).steps.sort_values(["rank", "step"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(steps, expected)
    assert expected.loc[expected["rank"] == 1, "start_ns"].min() == 1000  # rank 1 aligned


def test_rank_without_meta_yet_is_skipped_then_found(tmp_path: Path) -> None:
    _steps(w0 := _writer(tmp_path, 0), 0, 1)
    w0.flush()
    (tmp_path / "rank=00001" / "steps").mkdir(parents=True)
    follower = TraceFollower(tmp_path)
    assert sorted(follower.poll().meta) == [0]
    write_json_atomic(tmp_path / "rank=00001" / META_FILE, rank_meta(1, 2))
    assert sorted(follower.poll().meta) == [1]


def test_not_a_trace_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(DtprofError, match="no such directory"):
        TraceFollower(tmp_path / "missing")
