"""Follow a trace that a running job is writing: each poll reads only rows not read before.

Per rank and table a cursor remembers the first segment not yet read to its end, how many of
its rows were read, and, while it is a live Arrow IPC stream, the byte offset just after its
last complete record batch. A poll reads on from there: new whole batches of the growing
stream (a batch still being written is left for the next poll), then any later segments.
When the job seals the stream (``_live-N.arrows`` renamed into ``part-N.parquet``, which holds
exactly the stream's rows), the part is read once and the rows already taken are skipped.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from dtprof.errors import DtprofError
from dtprof.trace.reader import (
    _conform,
    clock_params,
    find_rank_dirs,
    read_inflight,
    read_rank_meta,
    table_frame,
)
from dtprof.trace.schema import INFLIGHT_FILE, LIVE_PREFIX, META_FILE, SEALED_PREFIX, TABLES, Table


@dataclass
class Cursor:
    """Where reading one table of one rank stopped."""

    segment: int = 0  # first segment not read to its end
    rows: int = 0  # rows of that segment already read
    offset: int = 0  # byte offset after its last complete batch (live streams), 0: not opened
    schema: pa.Schema | None = None  # the live stream's schema, read with its first message


@dataclass
class RankState:
    """One rank's folder: its metadata and a cursor per table."""

    folder: Path
    meta: dict[str, Any]
    meta_mtime_ns: int
    inflight_mtime_ns: int = -1
    inflight: list[dict[str, Any]] = field(default_factory=list)
    cursors: dict[str, Cursor] = field(default_factory=lambda: {n: Cursor() for n in TABLES})


@dataclass(frozen=True)
class Delta:
    """What one poll found: per rank, the new rows of each table (as on disk: monotonic times),
    and the ranks whose meta.json or inflight.json changed."""

    tables: dict[int, dict[str, pa.Table]]  # only tables with new rows
    meta: dict[int, dict[str, Any]]
    inflight: dict[int, list[dict[str, Any]]]

    @property
    def rows(self) -> int:
        return sum(t.num_rows for by_name in self.tables.values() for t in by_name.values())

    @property
    def empty(self) -> bool:
        return self.rows == 0 and not self.meta and not self.inflight

    def frame(self, name: str, meta: dict[int, dict[str, Any]]) -> pd.DataFrame:
        """The new rows of one table, every rank, times aligned to rank 0 as load_trace does."""
        params = {rank: clock_params(m) for rank, m in meta.items()}
        by_rank = [(r, t[name]) for r, t in sorted(self.tables.items()) if name in t]
        return table_frame(TABLES[name], by_rank, params)


class TraceFollower:
    """Incremental reader of one trace directory; ``poll()`` returns what is new since the last."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        find_rank_dirs(self.path)  # fails at once, naming the path, if it is not a trace
        self.ranks: dict[int, RankState] = {}
        self.bytes_read = 0  # every byte taken from a table file, for tests and the status line
        self._lock = threading.Lock()  # guards bytes_read, added to from reading threads

    def poll(self, tables: Iterable[str] | None = None) -> Delta:
        """Read what was appended, sealed or added since the last poll (to these tables only)."""
        metas: dict[int, dict[str, Any]] = {}
        for rank, folder in find_rank_dirs(self.path):
            state = self._refresh_meta(rank, folder)
            if state is not None:
                metas[rank] = state.meta
        names = list(TABLES) if tables is None else list(tables)
        ranks = sorted(self.ranks.items())

        def read_rank(state: RankState) -> dict[str, pa.Table]:
            new = {name: self._read_new(state, TABLES[name]) for name in names}
            return {name: t for name, t in new.items() if t.num_rows}

        with ThreadPoolExecutor(max_workers=min(8, (os.cpu_count() or 2) * 2)) as pool:
            got = list(pool.map(read_rank, [s for _, s in ranks]))
        new = {r: t for (r, _), t in zip(ranks, got, strict=True) if t}
        inflight = {r: s.inflight for r, s in ranks if self._refresh_inflight(s)}
        return Delta(tables=new, meta=metas, inflight=inflight)

    def _refresh_meta(self, rank: int, folder: Path) -> RankState | None:
        """Re-read meta.json when it changed; None when it did not (or is not written yet)."""
        try:
            mtime = (folder / META_FILE).stat().st_mtime_ns
        except FileNotFoundError:
            return None  # the rank is starting up: its folder is there, its meta.json not yet
        state = self.ranks.get(rank)
        if state is not None and state.meta_mtime_ns == mtime:
            return None
        meta = read_rank_meta(folder)
        if state is None:
            state = self.ranks[rank] = RankState(folder=folder, meta=meta, meta_mtime_ns=mtime)
        else:
            state.meta, state.meta_mtime_ns = meta, mtime
        return state

    def _refresh_inflight(self, state: RankState) -> bool:
        file = state.folder / INFLIGHT_FILE
        try:
            mtime = file.stat().st_mtime_ns
        except FileNotFoundError:
            mtime = -1
        if mtime == state.inflight_mtime_ns:
            return False
        state.inflight_mtime_ns = mtime
        state.inflight = read_inflight(state.folder) if mtime >= 0 else []
        return True

    def _read_new(self, state: RankState, table: Table) -> pa.Table:
        folder = state.folder / table.name
        cursor = state.cursors[table.name]
        try:
            names = os.listdir(folder)
        except FileNotFoundError:
            return table.schema.empty_table()
        sealed = _numbers(names, SEALED_PREFIX, ".parquet")
        live = _numbers(names, LIVE_PREFIX, ".arrows")
        pieces: list[pa.Table] = []
        while True:
            number = cursor.segment
            part = folder / f"{SEALED_PREFIX}{number:06d}.parquet"
            stream = folder / f"{LIVE_PREFIX}{number:06d}.arrows"
            if number in sealed or (number in live and not stream.exists() and part.exists()):
                data = _read_part(part, table)
                self._count(part.stat().st_size)
                pieces.append(data.slice(cursor.rows))
                state.cursors[table.name] = cursor = Cursor(segment=number + 1)
                continue
            if number not in live:
                break
            pieces.append(self._read_stream(stream, table, cursor))
            if not any(n > number for n in sealed | live):
                break  # the open segment: it may grow, read on from here next time
            state.cursors[table.name] = cursor = Cursor(segment=number + 1)
        pieces = [p for p in pieces if p.num_rows]
        return pa.concat_tables(pieces) if pieces else table.schema.empty_table()

    def _count(self, nbytes: int) -> None:
        with self._lock:
            self.bytes_read += nbytes

    def _read_stream(self, path: Path, table: Table, cursor: Cursor) -> pa.Table:
        """Whole record batches after ``cursor.offset``; advances the cursor past them."""
        batches = []
        try:
            with pa.OSFile(str(path), "rb") as source:
                if cursor.schema is None:
                    cursor.schema = pa.ipc.read_schema(pa.ipc.read_message(source))
                    cursor.offset = source.tell()
                source.seek(cursor.offset)
                while True:
                    message = pa.ipc.read_message(source)
                    batches.append(pa.ipc.read_record_batch(message, cursor.schema))
                    self._count(source.tell() - cursor.offset)
                    cursor.offset = source.tell()
        except (EOFError, OSError, pa.ArrowException):
            pass  # the end so far, a batch still being written, or a stream sealed meanwhile
        cursor.rows += sum(b.num_rows for b in batches)
        if not batches or cursor.schema is None:
            return table.schema.empty_table()
        return _conform(path, pa.Table.from_batches(batches, schema=cursor.schema), table)


def _read_part(path: Path, table: Table) -> pa.Table:
    """A sealed part (ParquetFile.read: a few times faster than read_table for one small file)."""
    try:
        data = pq.ParquetFile(path).read(use_threads=False)
    except (OSError, pa.ArrowException) as exc:
        raise DtprofError(f"{path}: not a readable Parquet file ({exc})") from None
    return _conform(path, data, table)


def _numbers(names: list[str], prefix: str, suffix: str) -> set[int]:
    """Segment numbers of the files named prefix + digits + suffix."""
    found = set()
    for name in names:
        digits = name[len(prefix) : -len(suffix)]
        if name.startswith(prefix) and name.endswith(suffix) and digits.isdigit():
            found.add(int(digits))
    return found
