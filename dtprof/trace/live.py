"""A table's open segment, ``_live-N.msgpack``: frames of columns, appended while a job records.

Each frame is a 4-byte little-endian length and that many bytes of MessagePack. The first
frame is the header, ``{"columns": [name, ...]}``; each later one is one flush of rows, as one
entry per column in the header's order, in one of four forms:

- a MessagePack binary: the column's values packed little-endian at its type's width (int64,
  int32, int16, float64 columns without nulls: most of a trace's numbers);
- nil: every value of the column is null;
- a list of values (bools, numbers with some nulls, and whatever does not pack);
- a map ``{"codes": binary, "values": list}``: the column's values coded, value i being
  ``values[codes[i]]``, the codes packed as little-endian int32. The columns the native
  kernel's rows fill are written so (a phase's name, a constant kind), straight from its
  numbers: no Python object per value at the flush or when the segment is read; and the
  string columns of rows, coded by their distinct values, so that a column whose frames come
  from both reads back in one form (the reader converts a column run of frames by run of
  frames of one form: frames of the kernel's and of rows in turn, as the scalars table's
  steps' samples and logged losses are, read three times slower as a list and a map each).

The writer puts a table's frames in the file with one write, so a reader sees whole frames and,
after a kill in the middle of a write, a torn last one, which it leaves (and, on a file still
growing, reads whole at its next look).

Columns, not rows, and MessagePack, not Arrow: at every flush the writer transposes a few dozen
tuples and encodes them in microseconds, where an Arrow record batch and its IPC write took
about 100 µs per table. Packed numbers cost the flush no more than a list of them does, and the
reader takes them as they are, where a list's values each become a Python object and then an
Arrow value: a segment, which the seal reads whole, reads in 30-45% less time.
"""

from __future__ import annotations

import itertools
import os
import struct
import sys
from array import array
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa

from dtprof.errors import DtprofError
from dtprof.trace.schema import LIVE_PREFIX, Table

SUFFIX = ".msgpack"
LEGACY_SUFFIX = ".arrows"  # schema version 1's live segments: Arrow IPC streams
_LENGTH = struct.Struct("<I")
_decode = msgspec.msgpack.Decoder().decode


def _plain(value: Any) -> Any:
    """A numpy scalar or one-element tensor as the Python number it holds."""
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"a trace row holds a {type(value).__name__}")


_encode = msgspec.msgpack.Encoder(enc_hook=_plain).encode


# Arrow converts a list of values holding the GIL for the whole call, and the writer thread
# reads a whole segment back when it seals it (up to 250,000 rows): in one call per column,
# that stalled the training thread for the longest call (21-26 ms in a seal of 30,000 spans,
# a step 15 times its median). A list is converted VALUES_PER_CALL values at a time, so that
# between calls Python can hand the GIL over (the same seal: at most 10-12 ms).
VALUES_PER_CALL = 4096

# Arrow type -> (the array module's code that packs it, the numpy dtype that reads it back)
_PACKED = {
    pa.int64(): ("q", "<i8"),
    pa.int32(): ("i", "<i4"),
    pa.int16(): ("h", "<i2"),
    pa.float64(): ("d", "<f8"),
}
_BIG_ENDIAN = sys.byteorder == "big"
CODED = "coded"  # a string column's form in a frame of rows: codes into its distinct values
_forms: dict[str, tuple[str | None, ...]] = {}  # table name -> each column's form in rows_frame


def _row_forms(table: Table) -> tuple[str | None, ...]:
    """How rows_frame writes each column of ``table``: the array module's code that packs it,
    CODED (strings), or None (a list)."""
    forms = _forms.get(table.name)
    if forms is None:
        found = [(c.type, *_PACKED.get(c.type, (None, None))) for c in table.columns]
        # a code whose C type is not the column's width on this platform is not used
        forms = tuple(
            code
            if code and array(code).itemsize == np.dtype(dtype).itemsize
            else (CODED if pa.types.is_string(kind) else None)
            for kind, code, dtype in found
        )
        _forms[table.name] = forms
    return forms


def segment_name(number: int) -> str:
    return f"{LIVE_PREFIX}{number:06d}{SUFFIX}"


def refuse_legacy(folder: Path, names: list[str]) -> None:
    """Fail, naming it, on a live segment of schema version 1 among a table folder's
    ``names``: its rows were never sealed, and only a dtprof of that version reads them."""
    for name in names:
        if name.startswith(LIVE_PREFIX) and name.endswith(LEGACY_SUFFIX):
            raise DtprofError(
                f"{folder / name}: an unsealed segment of trace schema version 1 (an Arrow IPC"
                " stream), which this dtprof does not read; a dtprof of schema version 1 does"
            )


def header(table: Table) -> bytes:
    """The frame that begins a segment of ``table``."""
    return frame({"columns": table.column_names})


def rows_frame(rows: list[tuple[Any, ...]], table: Table) -> bytes:
    """One flush's rows of ``table`` (tuples in column order) as a frame of columns."""
    columns = zip(*rows, strict=True)
    return frame([_column(c, form) for c, form in zip(columns, _row_forms(table), strict=True)])


def _column(values: tuple[Any, ...], form: str | None) -> Any:
    """A column of a frame: packed where its type and values allow, strings coded (the
    native kernel's frames write theirs so, and a column read back whole in one form is
    converted at once, where a mix of forms is converted run by run), nil where all are
    null, else its values (a MessagePack array)."""
    if form == CODED:
        distinct: dict[Any, int] = {}
        try:
            codes = array("i", [distinct.setdefault(value, len(distinct)) for value in values])
        except TypeError:  # a value that is no string (unhashable): listed, the reader says so
            return values
        return coded(codes, list(distinct))
    if form is not None:
        try:
            packed = array(form, values)
        except (TypeError, OverflowError):  # a null, a value of another type, out of range
            pass
        else:
            if _BIG_ENDIAN:
                packed.byteswap()
            return memoryview(packed)
    if values[0] is None and values.count(None) == len(values):
        return None
    return values


def packed(values: np.ndarray | array[int], dtype: str) -> memoryview:
    """A column of a frame from an array (numpy's or the array module's): its values packed
    as ``dtype`` (a little-endian numpy dtype of a packed column's width, e.g. "<i8")."""
    return memoryview(np.ascontiguousarray(values, dtype=dtype).data)


def coded(codes: np.ndarray | array[int], values: list[Any]) -> dict[str, Any]:
    """A column of a frame given as ``codes`` into ``values`` (value i is values[codes[i]])."""
    return {"codes": packed(codes, "<i4"), "values": values}


def frame(payload: Any) -> bytes:
    data = _encode(payload)
    return _LENGTH.pack(len(data)) + data


# A frame made from rows of 64-bit integers (the native kernel's rings and records) follows a
# plan: a tuple of MessagePack pieces in order, each bytes (encoded once, here) or (column,
# width), the rows' column packed at that width (-8: as float64; column -1: zeros). The native
# kernel's frame_of(rows, plan) makes it in one call (dtprof/record/native/frames.cpp);
# frame_of() below, the same in numpy, where the kernel is not loaded.
_WIDTHS = {"<i8": 8, "<i4": 4, "<i2": 2, "<f8": -8}
_DTYPES = {width: dtype for dtype, width in _WIDTHS.items()}
_CODES_KEY = b"\x82" + _encode("codes")  # a map of two: "codes", then "values"
_VALUES_KEY = _encode("values")


def from_rows(column: int, dtype: str) -> tuple[Any, ...]:
    """A plan's column: the rows' ``column`` packed as ``dtype`` ("<i8", "<i4", "<i2", "<f8")."""
    return ((column, _WIDTHS[dtype]),)


def coded_from_rows(column: int, values: list[Any]) -> tuple[Any, ...]:
    """A plan's column: the rows' ``column`` as codes into ``values`` (``coded()``'s form)."""
    return (_CODES_KEY, (column, 4), _VALUES_KEY + _encode(values))


def constant(value: Any) -> tuple[Any, ...]:
    """A plan's column whose values are all ``value``."""
    return (_CODES_KEY, (-1, 4), _VALUES_KEY + _encode([value]))


def zeros(dtype: str) -> tuple[Any, ...]:
    """A plan's column of zeros, packed as ``dtype``."""
    return ((-1, _WIDTHS[dtype]),)


def encoded(column: Any) -> tuple[Any, ...]:
    """A plan's column given whole, in a form a frame holds (``packed()``, ``coded()``, None
    for nulls, a list of values): encoded now."""
    return (_encode(column),)


def plan(*columns: tuple[Any, ...]) -> tuple[Any, ...]:
    """A frame's plan from its columns, in the table's order (from_rows(), coded_from_rows(),
    constant(), zeros(), encoded()): MessagePack pieces next to each other joined."""
    n = len(columns)
    header = bytes([0x90 | n]) if n < 16 else b"\xdc" + n.to_bytes(2, "big")
    items: list[Any] = [header]
    for piece in (p for column in columns for p in column):
        if isinstance(piece, bytes) and isinstance(items[-1], bytes):
            items[-1] += piece
        else:
            items.append(piece)
    return tuple(items)


def frame_of(rows: np.ndarray, plan: tuple[Any, ...]) -> bytes:
    """The frame of ``rows`` (int64, shape (n, width)) that ``plan`` makes: what the native
    kernel's frame_of makes, in numpy."""
    parts = []
    for item in plan:
        if isinstance(item, bytes):
            parts.append(item)
            continue
        column, width = item
        dtype = _DTYPES[width]
        values = np.zeros(len(rows), dtype) if column < 0 else rows[:, column].astype(dtype)
        data = values.tobytes()
        parts.append(b"\xc6" + len(data).to_bytes(4, "big") + data)
    payload = b"".join(parts)
    return _LENGTH.pack(len(payload)) + payload


def write_all(fd: int, data: bytes) -> None:
    """``data`` to the file in as few writes as the operating system takes (one, but for a
    full disk or a signal)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def read(path: Path, table: Table, offset: int = 0) -> tuple[pa.Table, int]:
    """The rows of the whole frames after byte ``offset`` (0: from the first after the
    header) and the offset after the last of them. Raises FileNotFoundError when the segment
    is gone (sealed meanwhile), DtprofError naming it when it cannot be read."""
    try:
        return _read(path, table, offset)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise DtprofError(f"{path}: not readable ({exc})") from None


def _read(path: Path, table: Table, offset: int) -> tuple[pa.Table, int]:
    with open(path, "rb") as f:
        start = f.read(_LENGTH.size)
        if len(start) == _LENGTH.size:
            start += f.read(_LENGTH.unpack(start)[0])
        found = _next_frame(path, start, 0)
        if found is None:
            return table.empty, 0  # killed before its header was whole: no rows
        head, begin = found
        order = _column_order(path, head, table)
        begin = max(begin, offset)
        f.seek(begin)
        data = f.read()
    parts: list[list[Any]] = [[] for _ in table.columns]  # each column's, frame by frame
    frame_rows: list[int] = []
    widths = [_width(c.type) for c in table.columns]
    pos = 0
    while (found := _next_frame(path, data, pos)) is not None:
        payload, end = found
        _take(path, begin + pos, payload, order, widths, parts, frame_rows)
        pos = end
    if not sum(frame_rows):
        return table.empty, begin + pos
    try:
        arrays = [_array(p, frame_rows, c.type) for p, c in zip(parts, table.columns, strict=True)]
    except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
        raise DtprofError(f"{path}: values do not match table {table.name} ({exc})") from None
    return pa.Table.from_arrays(arrays, schema=table.schema), begin + pos


def _next_frame(path: Path, data: bytes, pos: int) -> tuple[Any, int] | None:
    """The frame at ``pos`` decoded and the position after it; None where no whole frame is."""
    if len(data) - pos < _LENGTH.size:
        return None
    (length,) = _LENGTH.unpack_from(data, pos)
    end = pos + _LENGTH.size + length
    if end > len(data):
        return None  # torn by a kill, or still being written
    try:
        return _decode(data[pos + _LENGTH.size : end]), end
    except msgspec.DecodeError as exc:
        raise DtprofError(f"{path}: a frame is not MessagePack ({exc})") from None


def _column_order(path: Path, head: Any, table: Table) -> list[int]:
    """Where each of ``table``'s columns is in the segment's frames."""
    names = head.get("columns") if isinstance(head, dict) else None
    if not isinstance(names, list):
        raise DtprofError(f"{path}: not a dtprof live segment (no column names at its start)")
    missing = [c for c in table.column_names if c not in names]
    if missing:
        raise DtprofError(f"{path}: table {table.name} lacks column(s) {', '.join(missing)}")
    return [names.index(c) for c in table.column_names]


def _take(
    path: Path,
    at: int,
    payload: Any,
    order: list[int],
    widths: list[int],
    parts: list[list[Any]],
    frame_rows: list[int],
) -> None:
    """Add one frame's columns (``order`` picks the table's) to ``parts``, and its rows to
    ``frame_rows``. This runs for every frame and column a reader reads: it stays lean."""
    rows = -1
    if payload.__class__ is list and len(payload) > max(order):
        for i, width, column in zip(order, widths, parts, strict=True):
            part = payload[i]
            form = part.__class__
            if form is list:
                n = len(part)
            elif form is bytes and width and len(part) % width == 0:
                n = len(part) // width
            elif part is None:  # nulls, as many as the frame's rows
                column.append(None)
                continue
            elif form is dict and _is_coded(part):
                n = len(part["codes"]) // 4
            else:
                rows = -1
                break
            if rows == -1:
                rows = n
            elif n != rows:
                rows = -1
                break
            column.append(part)
    if rows == -1:
        raise DtprofError(f"{path}: the frame at byte {at} is not a set of equally long columns")
    frame_rows.append(rows)


def _is_coded(part: dict[Any, Any]) -> bool:
    codes = part.get("codes")
    return (
        len(part) == 2
        and codes.__class__ is bytes
        and len(codes) % 4 == 0
        and part.get("values").__class__ is list
    )


def _width(dtype: pa.DataType) -> int:
    """The bytes of one packed value of a column of ``dtype`` (0: such columns are not packed)."""
    packed = _PACKED.get(dtype)
    return np.dtype(packed[1]).itemsize if packed else 0


def _array(parts: list[Any], frame_rows: list[int], dtype: pa.DataType) -> pa.Array:
    """One column's frames as one Arrow array: each run of frames in the same form at once."""
    arrays = []
    frames_of_column = zip(parts, frame_rows, strict=True)
    for form, run in itertools.groupby(frames_of_column, key=lambda f: f[0].__class__):
        frames = list(run)
        if form is list:
            values = list(itertools.chain.from_iterable(part for part, _ in frames))
            for at in range(0, len(values), VALUES_PER_CALL):
                arrays.append(pa.array(values[at : at + VALUES_PER_CALL], type=dtype))
        elif form is bytes:
            packed = np.frombuffer(b"".join(part for part, _ in frames), _PACKED[dtype][1])
            native = packed.astype(packed.dtype.newbyteorder("="), copy=False)  # no copy on LE
            arrays.append(pa.array(native, type=dtype))
        elif form is dict:  # the frames' values one after another, their codes moved on
            maps = [part for part, _ in frames]
            sizes = [len(part["values"]) for part in maps]
            rows = [rows for _, rows in frames]
            codes = np.concatenate([np.frombuffer(part["codes"], "<i4") for part in maps])
            if ((codes < 0) | (codes >= np.repeat(sizes, rows))).any():
                raise ValueError("a code out of its values' range")
            codes = codes + np.repeat(np.cumsum([0, *sizes[:-1]]), rows).astype(np.int32)
            values = list(itertools.chain.from_iterable(part["values"] for part in maps))
            arrays.append(pa.array(values, type=dtype).take(pa.array(codes)))
        else:
            arrays.append(pa.nulls(sum(rows for _, rows in frames), type=dtype))
    return arrays[0] if len(arrays) == 1 else pa.concat_arrays(arrays)
