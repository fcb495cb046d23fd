"""Buffered, crash-safe trace writer: hot-path appends, a background thread does the I/O.

Rows are appended to per-table deques (thread-safe, ~50 ns); what arrives already as a frame
(the native kernel's rows, made into frames at the writer's tick) is queued as it is. Every
``flush_interval_s`` the writer thread drains them: a table's queued frames and a frame of its
rows go to its open segment (``_live-N.msgpack``, dtprof.trace.live) in one write; the bytes
reach the operating system at once, so they survive a SIGKILL of the process. A segment is
sealed into ``part-N.parquet`` (written aside, then renamed into place) when it grows past
``seal_rows`` or ``seal_interval_s``, and at close.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

from dtprof.trace import live
from dtprof.trace.schema import SEALED_PREFIX, TABLES, Table


class DtprofWarning(RuntimeWarning):
    """A problem inside recording; training goes on."""


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write JSON beside ``path`` and rename it into place, so readers never see half a file."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, default=str)
    os.replace(tmp, path)


class _Segment:
    """The open segment of one table: frames of columns being appended (dtprof.trace.live)."""

    def __init__(self, folder: Path, table: Table, number: int) -> None:
        self.folder = folder
        self.table = table
        self.number = number
        self.path = folder / live.segment_name(number)
        self.rows = 0
        self.opened_s = time.monotonic()
        # no user-space buffer: each frame is in the operating system when append returns
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        live.write_all(self._fd, live.header(table))

    def append_frames(self, frames: bytes, rows: int) -> None:
        """Frames of ``rows`` rows in all, in one write."""
        live.write_all(self._fd, frames)
        self.rows += rows

    def abandon(self) -> None:
        """Close the segment's file, unsealed (writing has failed)."""
        with contextlib.suppress(OSError):
            os.close(self._fd)

    def seal(self) -> None:
        """Close the segment, rewrite it as Parquet under its final name, remove it."""
        os.close(self._fd)
        data, _ = live.read(self.path, self.table)
        final = self.folder / f"{SEALED_PREFIX}{self.number:06d}.parquet"
        tmp = self.folder / f".{final.name}.tmp"
        self.table.write_parquet(data, tmp)
        os.replace(tmp, final)
        self.path.unlink()


class TraceWriter:
    """Owns one rank's folder: table buffers, the writer thread, segments and JSON files."""

    def __init__(
        self,
        folder: Path,
        flush_interval_s: float = 1.0,
        seal_rows: int = 250_000,
        seal_interval_s: float = 300.0,
        on_failure: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.folder = folder
        self.flush_interval_s = flush_interval_s
        self.seal_rows = seal_rows
        self.seal_interval_s = seal_interval_s
        self.buffers: dict[str, collections.deque[tuple[Any, ...]]] = {
            name: collections.deque() for name in TABLES
        }
        # table -> (rows, frame) queued by add_frame
        self.frames: dict[str, collections.deque[tuple[int, bytes]]] = {
            name: collections.deque() for name in TABLES
        }
        self._on_failure = on_failure
        self._segments: dict[str, _Segment] = {}
        self._next_segment: dict[str, int] = dict.fromkeys(TABLES, 0)
        self._tick_hooks: list[Callable[[], None]] = []
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()  # one flush at a time: thread, flush_now and close
        self._thread: threading.Thread | None = None
        self.failed = False
        self.batches_written = 0
        for name in TABLES:
            (folder / name).mkdir(parents=True, exist_ok=True)
        # pyarrow imports pandas on its first conversion, holding the GIL a while: pay that
        # now, before training, rather than when the writer thread first seals a segment
        pa.array([0], type=pa.int64())

    def add_tick_hook(self, hook: Callable[[], None]) -> None:
        """Run ``hook`` on the writer thread before each flush (watchdog, samplers)."""
        self._tick_hooks.append(hook)

    def add_frame(self, table: str, rows: int, frame: bytes) -> None:
        """Queue a frame of ``rows`` rows of ``table`` (dtprof.trace.live: ``live.frame`` of
        its columns, ``frame_of`` a plan); a frame of no rows is dropped."""
        if rows:
            self.frames[table].append((rows, frame))

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="dtprof-writer", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Ask the writer thread to flush now rather than at its next interval."""
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.flush_interval_s)
            self._wake.clear()
            if self._stop.is_set():
                break
            for hook in self._tick_hooks:
                hook()
            self.flush()

    def flush(self, seal: bool = False) -> None:
        """Drain every buffer into its segment; seal segments that are due (or all)."""
        if self.failed:
            self._drop_queued()
            return
        with self._lock:
            try:
                self._flush_locked(seal)
            except Exception as exc:  # disk full, permissions, a vanished folder...
                self.failed = True
                if self._on_failure is not None:
                    self._on_failure(exc)  # removing the hooks may queue their last rows
                else:
                    warnings.warn(
                        f"dtprof: trace writing stopped: {exc}", DtprofWarning, stacklevel=1
                    )
                self._drop_queued()
                for seg in self._segments.values():
                    seg.abandon()  # left as a killed rank's: readable, unsealed
                self._segments.clear()

    def _drop_queued(self) -> None:
        for queued in (*self.buffers.values(), *self.frames.values()):
            queued.clear()

    def _flush_locked(self, seal: bool) -> None:
        now = time.monotonic()
        for name, buf in self.buffers.items():
            frames, rows = [], 0
            queued = self.frames[name]
            while queued:  # first: a profile whose kernel failed goes on in Python after it
                n, frame = queued.popleft()
                frames.append(frame)
                rows += n
            n = len(buf)
            if n:
                frames.append(live.rows_frame([buf.popleft() for _ in range(n)], TABLES[name]))
                rows += n
            if frames:
                self._segment(name).append_frames(b"".join(frames), rows)
                self.batches_written += len(frames)
            seg = self._segments.get(name)
            if seg is not None and (
                seal or seg.rows >= self.seal_rows or now - seg.opened_s >= self.seal_interval_s
            ):
                seg.seal()
                del self._segments[name]

    def _segment(self, name: str) -> _Segment:
        seg = self._segments.get(name)
        if seg is None:
            number = self._next_segment[name]
            self._next_segment[name] = number + 1
            seg = self._segments[name] = _Segment(self.folder / name, TABLES[name], number)
        return seg

    def close(self) -> None:
        """Stop the thread, write what is left and seal every open segment."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.flush(seal=True)
