"""Where the dashboard's data comes from: a followed (live) trace, as immutable snapshots.

A background thread polls the trace directory; each poll that finds new rows makes a new
``Snapshot`` (the RunData and the findings of every check on it) that callbacks read without
locks. The first poll reads the steps table alone, so the overview can be drawn while the rest
of a large trace is still being read.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from dashboard.rundata import RunData, assemble, empty, steps_only, summarize
from dtprof.analysis.checks import CHECKS
from dtprof.analysis.report import Finding
from dtprof.analysis.summarize import RankSummary, RunSummary
from dtprof.errors import DtprofError
from dtprof.trace.follow import Delta, TraceFollower

FIRST_TABLES = ("steps",)  # enough for the overview's headline and step-time charts


@dataclass(frozen=True)
class Snapshot:
    """One consistent state of the run: what every page draws from."""

    version: int
    data: RunData
    findings: list[Finding]
    mode: str  # live or replay
    status: str  # one line for the header
    complete: bool = True  # every table read (False while a large trace is still loading)
    cache: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def cached(self, key: str, make: Any) -> Any:
        """Per-snapshot memo for shaped frames that several callbacks share."""
        if key not in self.cache:
            self.cache[key] = make()
        return self.cache[key]


def run_checks(run: RunSummary) -> tuple[list[Finding], list[str]]:
    """Every check of the analysis on ``run``; a check that fails on a partial trace is named."""
    findings: list[Finding] = []
    failed: list[str] = []
    for check in CHECKS:
        try:
            findings += check(run)
        except Exception as exc:  # a live trace may be cut mid-step; say so, keep the others
            failed.append(f"{check.__module__.rsplit('.', 1)[-1]}: {type(exc).__name__}")
    return findings, failed


def empty_snapshot(mode: str, status: str) -> Snapshot:
    data = empty()
    return Snapshot(version=0, data=data, findings=[], mode=mode, status=status, complete=False)


class LiveSource:
    """A trace that may still grow: polled every ``poll_s`` seconds by a daemon thread."""

    mode = "live"

    def __init__(self, path: str | os.PathLike[str], poll_s: float = 1.5) -> None:
        self.follower = TraceFollower(path)
        self.poll_s = poll_s
        self.tables: dict[int, dict[str, pa.Table]] = {}  # every rank's rows, as read
        self.meta: dict[int, dict[str, Any]] = {}
        self.inflight: dict[int, list[dict[str, Any]]] = {}
        self.summaries: dict[int, RankSummary] = {}
        self.loaded = False  # every table read at least once
        self._snapshot = empty_snapshot(self.mode, "reading the trace...")
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def snapshot(self) -> Snapshot:
        return self._snapshot

    def refresh(self) -> bool:
        """Poll once; True when a new snapshot was made."""
        started = time.monotonic()
        first = not self._snapshot.version
        delta = self.follower.poll(FIRST_TABLES if first else None)
        if delta.empty and self.loaded:
            return False
        self._merge(delta)
        if first:
            data = steps_only(delta.frame("steps", self.meta), dict(self.meta))
            findings: list[Finding] = []
            failed: list[str] = []
        else:
            moved = set(delta.tables) | set(delta.meta) | set(delta.inflight)
            if not self.loaded:
                moved = set(self.meta)
            self._summarize(moved)
            self.loaded = True
            data = assemble(self.summaries, self.tables, self.meta)
            findings, failed = run_checks(data.run)
        took = time.monotonic() - started
        self._snapshot = Snapshot(
            version=self._snapshot.version + 1,
            data=data,
            findings=findings,
            mode=self.mode,
            status=self._status(data, took, self.loaded, failed),
            complete=self.loaded,
        )
        return True

    def _merge(self, delta: Delta) -> None:
        self.meta.update(delta.meta)
        self.inflight.update(delta.inflight)
        for rank, new in delta.tables.items():
            held = self.tables.setdefault(rank, {})
            for name, rows in new.items():
                held[name] = pa.concat_tables([held[name], rows]) if name in held else rows

    def _summarize(self, ranks: set[int]) -> None:
        def one(rank: int) -> RankSummary:
            tables = self.tables.get(rank, {})
            return summarize(rank, self.meta[rank], tables, self.inflight.get(rank, []))

        todo = sorted(r for r in ranks if r in self.meta)
        with ThreadPoolExecutor(max_workers=min(8, (os.cpu_count() or 2) * 2)) as pool:
            self.summaries.update(zip(todo, pool.map(one, todo), strict=True))

    def _status(self, data: RunData, took: float, complete: bool, failed: list[str]) -> str:
        statuses = {str(m.get("status")) for m in self.meta.values()}
        state = "running" if "running" in statuses else "finished"
        text = f"{state} · {len(data.ranks)} ranks · step {data.last_step}"
        if not complete:
            text += " · reading spans and collectives..."
        if failed:
            text += " · check failed: " + ", ".join(failed)
        return text + f" · read in {took:.1f} s"

    def start(self) -> None:
        """Poll in a daemon thread until stop(): at once, then every poll_s seconds."""
        self._thread = threading.Thread(target=self._run, name="dtprof-dashboard", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                changed = self.refresh()
            except DtprofError as exc:  # a file torn or replaced under us: say it, keep going
                self._snapshot = _with_status(self._snapshot, f"error: {exc}")
                changed = False
            if changed and not self._snapshot.complete:
                continue  # the rest of the first load follows at once
            # a large run takes a while to summarize: wait at least as long as that took
            self._stop.wait(max(self.poll_s, time.monotonic() - started))

    def stop(self) -> None:
        self._stop.set()


def _with_status(snap: Snapshot, status: str) -> Snapshot:
    return Snapshot(
        version=snap.version + 1,
        data=snap.data,
        findings=snap.findings,
        mode=snap.mode,
        status=status,
        complete=snap.complete,
    )
