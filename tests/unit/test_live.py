"""Live segments (dtprof.trace.live): frames of columns, read whole, torn tails left, bad
files named."""

from __future__ import annotations

import math
import os
import struct
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest

from dtprof.errors import DtprofError
from dtprof.trace import live
from dtprof.trace.schema import COLLECTIVES, SCALARS, STEPS

ROWS = [
    (0, "0", 1, "all_reduce", 4096, "float32", None, 10, 20, True, "ddp.bucket0"),
    (0, "0", 2, "send", 8, "int64", 3, 30, 45, False, None),
    (1, "0", 3, "all_reduce", 4096, "float32", None, 50, 70, True, "ddp.bucket0"),
]


def _segment(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / live.segment_name(0)
    path.write_bytes(data)
    return path


def test_rows_come_back_as_written_with_their_types_and_nulls(tmp_path: Path) -> None:
    data = (
        live.header(COLLECTIVES)
        + live.rows_frame(ROWS[:2], COLLECTIVES)
        + live.rows_frame(ROWS[2:], COLLECTIVES)
    )
    rows, offset = live.read(_segment(tmp_path, data), COLLECTIVES)
    assert rows.schema.equals(COLLECTIVES.schema)
    assert [tuple(r.values()) for r in rows.to_pylist()] == ROWS
    assert offset == len(data)


def test_reading_on_from_an_offset_takes_only_later_frames(tmp_path: Path) -> None:
    first = live.header(STEPS) + live.rows_frame([(0, 1, 2)], STEPS)
    path = _segment(tmp_path, first + live.rows_frame([(1, 2, 3), (2, 3, 4)], STEPS))
    rows, offset = live.read(path, STEPS, len(first))
    assert rows.column("step").to_pylist() == [1, 2]
    assert live.read(path, STEPS, offset)[0].num_rows == 0


def test_columns_are_taken_by_name_from_the_header(tmp_path: Path) -> None:
    header = live.frame({"columns": ["end_ns", "extra", "step", "start_ns"]})
    body = live.frame([[20, 40], ["x", "y"], [0, 1], [10, 30]])
    rows, _ = live.read(_segment(tmp_path, header + body), STEPS)
    assert rows.to_pylist() == [
        {"step": 0, "start_ns": 10, "end_ns": 20},
        {"step": 1, "start_ns": 30, "end_ns": 40},
    ]


@pytest.mark.parametrize("cut", [1, 3, 4, 7])
def test_a_torn_last_frame_is_left_and_a_torn_header_reads_empty(tmp_path: Path, cut: int) -> None:
    whole = live.header(STEPS) + live.rows_frame([(0, 1, 2)], STEPS)
    last = live.rows_frame([(1, 2, 3)], STEPS)
    rows, offset = live.read(_segment(tmp_path, whole + last[:cut]), STEPS)
    assert rows.column("step").to_pylist() == [0] and offset == len(whole)
    header = live.header(STEPS)
    rows, offset = live.read(_segment(tmp_path, header[: len(header) - cut]), STEPS)
    assert rows.num_rows == 0 and offset == 0


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (live.frame([1, 2]), "not a dtprof live segment"),
        (live.frame({"columns": ["step", "start_ns"]}), "lacks column(s) end_ns"),
        (live.header(STEPS) + b"\x03\x00\x00\x00\xc1\xc1\xc1", "a frame is not MessagePack"),
        (live.header(STEPS) + live.frame([[0], [1]]), "not a set of equally long columns"),
        (live.header(STEPS) + live.frame([[0, 1], [1], [2]]), "not a set of equally long columns"),
        (live.header(STEPS) + live.frame({"step": 0}), "not a set of equally long columns"),
        (live.header(STEPS) + live.frame([["a"], [1], [2]]), "values do not match table steps"),
        (live.header(STEPS) + live.frame([[2**63], [1], [2]]), "values do not match table steps"),
        (live.header(STEPS) + live.frame([b"\0" * 7, [1], [2]]), "not a set of equally long"),
        (live.header(STEPS) + live.frame([b"\0" * 16, [1], [2]]), "not a set of equally long"),
        (live.header(STEPS) + live.frame([None, None, None]), "not a set of equally long"),
        (live.header(STEPS) + live.frame([[0], {"a": 1}, [2]]), "not a set of equally long"),
    ],
)
def test_a_bad_segment_is_named_in_one_line(tmp_path: Path, data: bytes, message: str) -> None:
    path = _segment(tmp_path, data)
    with pytest.raises(DtprofError) as err:
        live.read(path, STEPS)
    assert str(err.value).startswith(f"{path}: ") and message in str(err.value)
    assert "\n" not in str(err.value)


def test_a_frame_is_one_length_and_messagepack_with_numbers_packed(tmp_path: Path) -> None:
    """Numbers without nulls are packed little-endian at their column's width, strings coded
    by their distinct values (nulls too), a column of nulls of another type is nil, anything
    else a list."""
    frame = live.rows_frame(ROWS[:2], COLLECTIVES)
    assert int.from_bytes(frame[:4], "little") == len(frame) - 4
    step, group, seq, _, _, _, peer, start, _, async_op, label = msgspec.msgpack.decode(frame[4:])
    assert step == struct.pack("<2q", 0, 0) and seq == struct.pack("<2q", 1, 2)
    assert start == struct.pack("<2q", 10, 30)
    assert group == {"codes": struct.pack("<2i", 0, 0), "values": ["0"]}
    assert label == {"codes": struct.pack("<2i", 0, 1), "values": ["ddp.bucket0", None]}
    assert async_op == [True, False]
    assert peer == [None, 3]  # a null among numbers: a list
    nulls = live.rows_frame([(*r[:6], None, *r[7:-1], None) for r in ROWS], COLLECTIVES)
    columns = msgspec.msgpack.decode(nulls[4:])
    assert columns[6] is None and columns[10] == {"codes": bytes(12), "values": [None]}


def test_a_column_in_different_forms_from_frame_to_frame_reads_as_one(tmp_path: Path) -> None:
    """Packed, nil and listed frames of the same column, in any order; numbers at the edges
    of their types; floats with NaN."""
    rows = [
        (0, "0", 2**63 - 1, "x", 1, "f", None, 1, 2, False, None),  # peer: nil
        (1, "0", -(2**63), "x", 1, "f", 2**31 - 1, 1, 2, False, None),  # peer: packed
        (2, "0", 5, "x", 1, "f", None, 1, 2, False, "l"),
        (3, "0", 6, "x", 1, "f", -(2**31), 1, 2, False, None),  # with the one above: listed
    ]
    frames = [rows[:1], rows[1:2], rows[2:4], rows[:1], rows[1:2]]
    data = live.header(COLLECTIVES) + b"".join(live.rows_frame(f, COLLECTIVES) for f in frames)
    read, _ = live.read(_segment(tmp_path, data), COLLECTIVES)
    assert [tuple(r.values()) for r in read.to_pylist()] == [r for f in frames for r in f]

    values = [(0, "loss", float("nan")), (1, "loss", -1e308), (2, "loss", 3)]
    data = live.header(SCALARS) + live.rows_frame(values, SCALARS)
    got = live.read(_segment(tmp_path, data), SCALARS)[0].column("value").to_pylist()
    assert math.isnan(got[0]) and got[1:] == [-1e308, 3.0]


def test_numpy_scalars_are_written_as_the_numbers_they_hold(tmp_path: Path) -> None:
    import numpy as np

    data = live.header(STEPS) + live.rows_frame([(np.int64(3), np.int32(4), 5)], STEPS)
    assert live.read(_segment(tmp_path, data), STEPS)[0].to_pylist() == [
        {"step": 3, "start_ns": 4, "end_ns": 5}
    ]


def test_an_unreadable_segment_is_named_and_a_vanished_one_is_not_an_error(tmp_path: Path) -> None:
    folder = tmp_path / live.segment_name(0)
    folder.mkdir()  # a directory where the segment should be: open() fails, not with ENOENT
    with pytest.raises(DtprofError, match=f"^{folder}: not readable"):
        live.read(folder, STEPS)
    with pytest.raises(FileNotFoundError):
        live.read(tmp_path / live.segment_name(1), STEPS)


def test_a_long_list_is_converted_in_pieces_and_read_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lists longer than one conversion call (VALUES_PER_CALL) come back whole and in order."""
    monkeypatch.setattr(live, "VALUES_PER_CALL", 2)
    frames = [ROWS, ROWS[:1], ROWS]
    data = live.header(COLLECTIVES) + b"".join(live.rows_frame(f, COLLECTIVES) for f in frames)
    rows, _ = live.read(_segment(tmp_path, data), COLLECTIVES)
    assert [tuple(r.values()) for r in rows.to_pylist()] == [r for f in frames for r in f]


def test_coded_columns_come_back_as_their_values_from_frame_to_frame(tmp_path: Path) -> None:
    """Columns given as codes into values (the native kernel's), each frame with values of
    its own, beside listed frames of the same column; a null among the values, a bool."""
    codes = np.array([1, 0, 1, 2], np.int32)
    coded = [
        live.packed(np.arange(4), "<i8"),  # step
        live.coded(np.zeros(4, np.int32), ["0"]),  # group
        live.packed(np.arange(4), "<i8"),  # seq
        live.coded(codes, ["send", "all_reduce", "recv"]),  # op
        live.packed(np.full(4, 64), "<i8"),  # bytes
        live.coded(codes, ["int64", "float32", None]),  # dtype
        None,  # peer
        live.packed(np.arange(4) * 10, "<i8"),  # start_ns
        live.packed(np.arange(4) * 10 + 5, "<i8"),  # end_ns
        live.coded(np.array([0, 0, 1, 0], np.int32), [True, False]),  # async_op
        live.coded(codes, ["ddp.bucket0", "ddp.bucket1", None]),  # label
    ]
    again = list(coded)
    again[3] = live.coded(np.zeros(4, np.int32), ["broadcast"])
    data = (
        live.header(COLLECTIVES)
        + live.frame(coded)
        + live.rows_frame(ROWS, COLLECTIVES)
        + live.frame(again)
    )
    read, _ = live.read(_segment(tmp_path, data), COLLECTIVES)
    assert read.schema.equals(COLLECTIVES.schema)
    first = [
        (0, "0", 0, "all_reduce", 64, "float32", None, 0, 5, True, "ddp.bucket1"),
        (1, "0", 1, "send", 64, "int64", None, 10, 15, True, "ddp.bucket0"),
        (2, "0", 2, "all_reduce", 64, "float32", None, 20, 25, False, "ddp.bucket1"),
        (3, "0", 3, "recv", 64, None, None, 30, 35, True, None),
    ]
    last = [(*row[:3], "broadcast", *row[4:]) for row in first]
    assert [tuple(r.values()) for r in read.to_pylist()] == first + ROWS + last


@pytest.mark.parametrize(
    ("column", "message"),
    [
        ({"codes": struct.pack("<i", 2), "values": ["a", "b"]}, "values do not match"),
        ({"codes": struct.pack("<i", -1), "values": ["a"]}, "values do not match"),
        ({"codes": b"\0" * 3, "values": ["a"]}, "not a set of equally long columns"),
        ({"codes": struct.pack("<2i", 0, 0), "values": ["a"]}, "not a set of equally long"),
        ({"codes": [0], "values": ["a"]}, "not a set of equally long columns"),
        ({"codes": struct.pack("<i", 0), "values": "a"}, "not a set of equally long columns"),
        ({"codes": struct.pack("<i", 0)}, "not a set of equally long columns"),
    ],
)
def test_a_bad_coded_column_is_named_in_one_line(
    tmp_path: Path, column: dict[str, object], message: str
) -> None:
    data = live.header(SCALARS) + live.frame([[0], column, [1.0]])
    path = _segment(tmp_path, data)
    with pytest.raises(DtprofError, match=f"^{path}: .*{message}"):
        live.read(path, SCALARS)


def _frame_makers() -> list[Any]:
    """live.frame_of, and the native kernel's where it is built (its absence fails in CI)."""
    from dtprof.record import native

    makers: list[Any] = [live.frame_of]
    kernel, why_not = native.load()
    if kernel is not None:
        makers.append(kernel.frame_of)
    elif os.environ.get("CI"):
        pytest.fail(f"the native kernel is needed in CI: {why_not}")
    return makers


def test_a_plan_makes_a_frame_of_int64_rows_in_numpy_and_natively_alike(tmp_path: Path) -> None:
    """Each form of a plan's column: packed at every width, codes into values, a constant,
    zeros, a column given whole; no rows too."""
    plan = live.plan(
        live.from_rows(2, "<i8"),  # step
        live.coded_from_rows(0, ["0", None, "2"]),  # group
        live.from_rows(1, "<i8"),  # seq
        live.constant("all_reduce"),  # op
        live.from_rows(1, "<i8"),  # bytes
        live.coded_from_rows(0, ["int8", "bfloat16", None]),  # dtype
        live.encoded(None),  # peer
        live.from_rows(3, "<i8"),  # start_ns
        live.from_rows(3, "<i8"),  # end_ns
        live.constant(True),  # async_op
        live.encoded(live.coded(np.array([1, 0, 1], np.int32), ["a", "b"])),  # label
    )
    rows = np.array([[0, 2**40 + 5, 7, -3], [1, 6, 7, 2**62], [2, -7, 8, 0]], np.int64)
    frames = [make(rows, plan) for make in _frame_makers()]
    assert all(frame == frames[0] for frame in frames)
    data = live.header(COLLECTIVES) + frames[0]
    read, offset = live.read(_segment(tmp_path, data), COLLECTIVES)
    assert offset == len(data)
    assert [tuple(r.values()) for r in read.to_pylist()] == [
        (7, "0", 2**40 + 5, "all_reduce", 2**40 + 5, "int8", None, -3, -3, True, "b"),
        (7, None, 6, "all_reduce", 6, "bfloat16", None, 2**62, 2**62, True, "a"),
        (8, "2", -7, "all_reduce", -7, None, None, 0, 0, True, "b"),
    ]
    # narrowed as C casts; an integer as a float
    widths = live.plan(
        live.from_rows(0, "<i2"),
        live.from_rows(0, "<f8"),
        live.zeros("<i2"),
        live.from_rows(0, "<i4"),
    )
    small = np.array([[70000], [-1]], np.int64)
    made = [msgspec.msgpack.decode(make(small, widths)[4:]) for make in _frame_makers()]
    for columns in made:
        assert np.frombuffer(columns[0], "<i2").tolist() == [70000 - 2**16, -1]
        assert np.frombuffer(columns[1], "<f8").tolist() == [70000.0, -1.0]
        assert columns[2] == b"\0" * 4
        assert np.frombuffer(columns[3], "<i4").tolist() == [70000, -1]
    steps = live.plan(*(live.from_rows(i, "<i8") for i in range(3)))
    for make in _frame_makers():  # no rows: a frame of empty columns
        assert msgspec.msgpack.decode(make(rows[:0, :3], steps)[4:]) == [b"", b"", b""]


@pytest.mark.parametrize(
    ("rows", "plan", "message"),
    [
        (np.zeros((2, 3), np.int64), ((3, 8),), "no column 3"),
        (np.zeros((2, 3), np.int64), ((0, 3),), "no column 0 of width 3"),
        (np.zeros((2, 3), np.int64), ([0, 8],), "bytes or \\(column, width\\)"),
        (np.zeros((2, 3), np.int32), ((0, 8),), "2-D buffer of int64"),
        (np.zeros(3, np.int64), ((0, 8),), "2-D buffer of int64"),
    ],
)
def test_the_native_frame_maker_refuses_what_is_not_rows_and_a_plan(
    rows: np.ndarray, plan: tuple[Any, ...], message: str
) -> None:
    makers = _frame_makers()[1:]
    if not makers:
        pytest.skip("the native kernel is not built")
    with pytest.raises((TypeError, ValueError), match=message):
        makers[0](rows, plan)
