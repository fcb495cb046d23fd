"""Follow a trace that a running job is writing: each poll reads only rows not read before.

Per rank and table a cursor remembers the first segment not yet read to its end, how many of
its rows were read, and, while it is live (dtprof.trace.live), the byte offset just after its
last whole frame. A poll reads on from there: new whole frames of the growing segment (a frame
still being written is left for the next poll), then any later segments. When the job seals
the segment (``_live-N.msgpack`` rewritten as ``part-N.parquet``, which holds exactly its
rows), the part is read once and the rows already taken are skipped.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from dtprof.errors import DtprofError
from dtprof.trace import live
from dtprof.trace.meta import InflightOp, RankMeta
from dtprof.trace.reader import (
    clock_params,
    conform_table,
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
    offset: int = 0  # byte offset after its last whole frame (live segments), 0: not opened


@dataclass
class RankState:
    """One rank's folder: its metadata and a cursor per table."""

    folder: Path
    meta: RankMeta
    meta_mtime_ns: int
    inflight_mtime_ns: int = -1
    inflight: list[InflightOp] = field(default_factory=list)
    cursors: dict[str, Cursor] = field(default_factory=lambda: {n: Cursor() for n in TABLES})


@dataclass(frozen=True)
class Delta:
    """What one poll found: per rank, the new rows of each table (as on disk: monotonic times),
    and the ranks whose meta.json or inflight.json changed."""

    tables: dict[int, dict[str, pa.Table]]  # only tables with new rows
    meta: dict[int, RankMeta]
    inflight: dict[int, list[InflightOp]]

    @property
    def rows(self) -> int:
        return sum(t.num_rows for by_name in self.tables.values() for t in by_name.values())

    @property
    def empty(self) -> bool:
        return self.rows == 0 and not self.meta and not self.inflight

    def frame(self, name: str, meta: dict[int, RankMeta]) -> pd.DataFrame:
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
        metas: dict[int, RankMeta] = {}
        for rank, folder in find_rank_dirs(self.path):
            state = self._refresh_meta(rank, folder)
            if state is not None:
                metas[rank] = state.meta
        names = list(TABLES) if tables is None else list(tables)
        ranks = sorted(self.ranks.items())

        def read_one(state: RankState) -> dict[str, pa.Table]:
            got, state.cursors, nbytes = read_rank(state.folder, names, state.cursors)
            self._count(nbytes)
            return got

        with ThreadPoolExecutor(max_workers=min(8, (os.cpu_count() or 2) * 2)) as pool:
            got = list(pool.map(read_one, [s for _, s in ranks]))
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

    def adopt(self, rank: int, cursors: dict[str, Cursor], nbytes: int = 0) -> None:
        """Take the cursors of a read made elsewhere (read_rank in a worker) for ``rank``."""
        self.ranks[rank].cursors = cursors
        self._count(nbytes)

    def _count(self, nbytes: int) -> None:
        with self._lock:
            self.bytes_read += nbytes


def read_rank(
    folder: Path, names: Iterable[str] | None = None, cursors: dict[str, Cursor] | None = None
) -> tuple[dict[str, pa.Table], dict[str, Cursor], int]:
    """One rank's rows after ``cursors`` (all rows when None): the non-empty tables, the
    cursors after them and the bytes read. A pure function, for threads and worker processes."""
    moved = {n: Cursor() for n in TABLES} if cursors is None else dict(cursors)
    tables, nbytes = {}, 0
    for name in TABLES if names is None else names:
        rows, moved[name], n = read_new(folder, TABLES[name], moved[name])
        nbytes += n
        if rows.num_rows:
            tables[name] = rows
    return tables, moved, nbytes


def read_new(folder: Path, table: Table, cursor: Cursor) -> tuple[pa.Table, Cursor, int]:
    """One table's rows after ``cursor`` (a rank folder's): rows, the cursor after, bytes read."""
    tdir = folder / table.name
    try:
        names = os.listdir(tdir)
    except FileNotFoundError:
        return table.empty, cursor, 0
    live.refuse_legacy(tdir, names)
    sealed = _numbers(names, SEALED_PREFIX, ".parquet")
    unsealed = _numbers(names, LIVE_PREFIX, live.SUFFIX)
    pieces: list[pa.Table] = []
    nbytes = 0
    while True:
        number = cursor.segment
        part = tdir / f"{SEALED_PREFIX}{number:06d}.parquet"
        segment = tdir / live.segment_name(number)
        if number in sealed or (number in unsealed and not segment.exists() and part.exists()):
            pieces.append(_read_part(part, table).slice(cursor.rows))
            nbytes += part.stat().st_size
            cursor = Cursor(segment=number + 1)
            continue
        if number not in unsealed:
            break
        cursor = Cursor(cursor.segment, cursor.rows, cursor.offset)
        rows, n = _read_live(segment, table, cursor)
        pieces.append(rows)
        nbytes += n
        if not any(k > number for k in sealed | unsealed):
            break  # the open segment: it may grow, read on from here next time
        cursor = Cursor(segment=number + 1)
    pieces = [p for p in pieces if p.num_rows]
    return (pa.concat_tables(pieces) if pieces else table.empty), cursor, nbytes


def read_window(folder: Path, table: Table, first: int | None, last: int | None) -> pa.Table:
    """One table's rows with first <= step < last (either end open), as on disk.

    Row groups of sealed parts whose step statistics miss the window are not read; live
    segments are read whole and filtered."""
    tdir = folder / table.name
    try:
        names = os.listdir(tdir)
    except FileNotFoundError:
        return table.empty
    live.refuse_legacy(tdir, names)
    sealed = _numbers(names, SEALED_PREFIX, ".parquet")
    unsealed = _numbers(names, LIVE_PREFIX, live.SUFFIX)
    pieces = []
    for number in sorted(sealed | unsealed):
        part = tdir / f"{SEALED_PREFIX}{number:06d}.parquet"
        rows = None
        if number not in sealed:
            rows, _ = _read_live(tdir / live.segment_name(number), table, Cursor())
        if rows is None or (not rows.num_rows and part.exists()):  # sealed meanwhile
            rows = _read_groups(part, table, first, last) if part.exists() else None
        if rows is not None and rows.num_rows:
            pieces.append(rows)
    if not pieces:
        return table.empty
    data = pa.concat_tables(pieces)
    step = data.column("step")
    keep = pc.and_(
        pc.greater_equal(step, first if first is not None else np.iinfo(np.int64).min),
        pc.less(step, last if last is not None else np.iinfo(np.int64).max),
    )
    return data.filter(keep)


def _read_groups(path: Path, table: Table, first: int | None, last: int | None) -> pa.Table:
    """The row groups of a sealed part whose step range meets [first, last)."""
    try:
        file = pq.ParquetFile(path)
        index = file.schema_arrow.get_field_index("step")
        wanted = []
        for i in range(file.metadata.num_row_groups):
            stats = file.metadata.row_group(i).column(index).statistics if index >= 0 else None
            if stats is not None and stats.has_min_max:
                before = last is not None and stats.min >= last
                if before or (first is not None and stats.max < first):
                    continue  # no row of this group is in the window
            wanted.append(i)
        data = file.read_row_groups(wanted, use_threads=False)
    except (OSError, pa.ArrowException) as exc:
        raise DtprofError(f"{path}: not a readable Parquet file ({exc})") from None
    return conform_table(path, data, table)


def _read_live(path: Path, table: Table, cursor: Cursor) -> tuple[pa.Table, int]:
    """The whole frames of a live segment after ``cursor.offset`` and the bytes they took;
    advances the cursor past them. No rows when the segment was sealed meanwhile."""
    try:
        rows, offset = live.read(path, table, cursor.offset)
    except FileNotFoundError:
        return table.empty, 0
    nbytes = max(0, offset - cursor.offset)
    cursor.offset = offset
    cursor.rows += rows.num_rows
    return rows, nbytes


def _read_part(path: Path, table: Table) -> pa.Table:
    """A sealed part (ParquetFile.read: a few times faster than read_table for one small file)."""
    try:
        data = pq.ParquetFile(path).read(use_threads=False)
    except (OSError, pa.ArrowException) as exc:
        raise DtprofError(f"{path}: not a readable Parquet file ({exc})") from None
    return conform_table(path, data, table)


def _numbers(names: list[str], prefix: str, suffix: str) -> set[int]:
    """Segment numbers of the files named prefix + digits + suffix."""
    found = set()
    for name in names:
        digits = name[len(prefix) : -len(suffix)]
        if name.startswith(prefix) and name.endswith(suffix) and digits.isdigit():
            found.add(int(digits))
    return found
