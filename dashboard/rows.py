"""Raw rows read on demand: the spans of the few ranks and steps a page asks for, from disk.

The dashboard keeps summaries, not rows (a 1024-rank trace's rows would not fit in a laptop's
memory); the Timeline needs the spans of a window (8 ranks x 3 steps by default), so each
rank's window is read from its files when asked for (``read_window``: Parquet row groups
outside the window are skipped) and kept in a least-recently-used cache bounded in rows.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from dtprof.trace.follow import read_window
from dtprof.trace.meta import RankMeta
from dtprof.trace.reader import clock_params, table_frame
from dtprof.trace.schema import TABLES

MAX_CACHED_ROWS = 2_000_000  # about 150 MB of spans


class RowCache:
    """Frames by key, least recently used dropped first once they hold more than max_rows."""

    def __init__(self, max_rows: int = MAX_CACHED_ROWS) -> None:
        self.max_rows = max_rows
        self.rows = 0
        self.reads = 0  # frames made (misses), for tests
        self._frames: OrderedDict[Any, pd.DataFrame] = OrderedDict()
        self._lock = threading.Lock()  # callbacks run in several server threads

    def get(self, key: Any, make: Callable[[], pd.DataFrame]) -> pd.DataFrame:
        with self._lock:
            if key in self._frames:
                self._frames.move_to_end(key)
                return self._frames[key]
        frame = make()
        with self._lock:
            self.reads += 1
            if key not in self._frames:
                self._frames[key] = frame
                self.rows += len(frame)
            while self.rows > self.max_rows and len(self._frames) > 1:
                _, dropped = self._frames.popitem(last=False)
                self.rows -= len(dropped)
        return frame

    def __len__(self) -> int:
        return len(self._frames)


@dataclass(frozen=True)
class Rows:
    """Where a snapshot's raw rows are: each rank's folder, meta and version (bumped when the
    rank got new rows, so a cached window of a growing rank is read again)."""

    folders: dict[int, Path] = field(default_factory=dict)
    meta: dict[int, RankMeta] = field(default_factory=dict)
    versions: dict[int, int] = field(default_factory=dict)
    cache: RowCache = field(default_factory=RowCache, compare=False)
    last_step: int | None = None  # a replay's prefix: no row after this step
    spans_held: pd.DataFrame | None = None  # spans already in memory (replay), else read

    def spans(self, ranks: list[int], steps: tuple[int | None, int | None]) -> pd.DataFrame:
        """rank, step, name, kind, start_ns, end_ns, ... of these ranks with first <= step < last,
        on rank 0's clock."""
        first, last = steps
        if self.last_step is not None:
            last = self.last_step + 1 if last is None else min(last, self.last_step + 1)
        if self.spans_held is not None:
            held = self.spans_held
            keep = held["rank"].isin(ranks)
            if first is not None:
                keep &= held["step"] >= first
            if last is not None:
                keep &= held["step"] < last
            return held[keep]
        parts = [self._rank(r, first, last) for r in ranks if r in self.folders]
        if not parts:
            return table_frame(TABLES["spans"], [], {0: clock_params(None)})
        return pd.concat(parts, ignore_index=True)

    def _rank(self, rank: int, first: int | None, last: int | None) -> pd.DataFrame:
        key = ("spans", rank, first, last, self.versions.get(rank, 0))
        meta = self.meta[rank]

        def read() -> pd.DataFrame:
            rows = read_window(self.folders[rank], TABLES["spans"], first, last)
            return table_frame(TABLES["spans"], [(rank, rows)], {rank: clock_params(meta)})

        return self.cache.get(key, read)

    def all_spans(self) -> pd.DataFrame:
        """Every rank's spans (a replay's prefixes need the last span of each rank)."""
        return self.spans(sorted(self.folders), (None, None))
