"""A table's open segment, ``_live-N.msgpack``: frames of columns, appended while a job records.

Each frame is a 4-byte little-endian length and that many bytes of MessagePack. The first
frame is the header, ``{"columns": [name, ...]}``; each later one is one flush of rows, as one
list of values per column in the header's order. The writer puts a frame in the file with one
write, so a reader sees whole frames and, after a kill in the middle of a write, a torn last
one, which it leaves (and, on a file still growing, reads whole at its next look).

Columns, not rows, and MessagePack, not Arrow: at every flush the writer transposes a few dozen
tuples and encodes them in microseconds, where an Arrow record batch and its IPC write took
about 100 µs per table; a reader turns each column into one Arrow array.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any

import msgspec
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


def rows_frame(rows: list[tuple[Any, ...]]) -> bytes:
    """One flush's rows (tuples in column order) as a frame of columns."""
    return frame([list(column) for column in zip(*rows, strict=True)])


def frame(payload: Any) -> bytes:
    data = _encode(payload)
    return _LENGTH.pack(len(data)) + data


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
    columns: list[list[Any]] = [[] for _ in table.columns]
    pos = 0
    while (found := _next_frame(path, data, pos)) is not None:
        payload, end = found
        _extend(path, begin + pos, payload, order, columns)
        pos = end
    if not columns[0]:
        return table.empty, begin + pos
    try:
        arrays = [pa.array(v, type=c.type) for v, c in zip(columns, table.columns, strict=True)]
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


def _extend(path: Path, at: int, payload: Any, order: list[int], columns: list[list[Any]]) -> None:
    """Append one frame's columns (``order`` picks the table's) to ``columns``."""
    ok = isinstance(payload, list) and all(isinstance(c, list) for c in payload)
    if ok and payload and len(payload) > max(order):
        lengths = {len(c) for c in payload}
        if len(lengths) == 1:
            for values, i in zip(columns, order, strict=True):
                values.extend(payload[i])
            return
    raise DtprofError(f"{path}: the frame at byte {at} is not a set of equally long columns")
