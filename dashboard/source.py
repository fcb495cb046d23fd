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
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa

from dashboard.growing_rank import GrowingRank, extend, fresh, moved_clock, rebase
from dashboard.measures import precompute
from dashboard.rows import RowCache, Rows
from dashboard.rundata import RunData, empty, samples_frame, steps_only
from dtprof.analysis.causes import link
from dtprof.analysis.checks import CHECKS
from dtprof.analysis.report import Finding
from dtprof.analysis.summarize import (
    RunSummary,
    combine,
    ranks_without_trace,
    release_memory,
)
from dtprof.errors import DtprofError
from dtprof.parallel import PROCESSES_FROM, map_items
from dtprof.trace.follow import Delta, TraceFollower
from dtprof.trace.meta import InflightOp, RankMeta
from dtprof.trace.reader import clock_params, rank_table
from dtprof.trace.schema import TABLES

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
    return link(findings), failed


def empty_snapshot(mode: str, status: str) -> Snapshot:
    data = empty()
    return Snapshot(version=0, data=data, findings=[], mode=mode, status=status, complete=False)


class LiveSource:
    """A trace that may still grow: polled every ``poll_s`` seconds by a daemon thread.

    It keeps each rank's summary and samples (dashboard.growing_rank), not its rows: the first full
    read summarizes every rank as ``dtprof analyze`` does (beside this process, in a process
    pool from 32 ranks; here alone when the folders hold little), later polls summarize each
    rank's new rows alone and append them.
    """

    mode = "live"

    def __init__(self, path: str | os.PathLike[str], poll_s: float = 1.5) -> None:
        self.follower = TraceFollower(path)
        self.poll_s = poll_s
        self.meta: dict[int, RankMeta] = {}
        self.inflight: dict[int, list[InflightOp]] = {}
        self.growing: dict[int, GrowingRank] = {}
        self.cache = RowCache()  # spans windows read for the Timeline, across snapshots
        self.loaded = False  # every table read at least once
        self._snapshot = empty_snapshot(self.mode, "reading the trace...")
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def snapshot(self) -> Snapshot:
        return self._snapshot

    def refresh(self) -> bool:
        """Poll once; True when a new snapshot was made."""
        started = time.monotonic()
        findings: list[Finding] = []
        failed: list[str] = []
        if not self._snapshot.version:
            delta = self.follower.poll(FIRST_TABLES)
            self._merge_meta(delta)
            data = steps_only(_steps(delta, self.meta), dict(self.meta))
        else:
            if self.loaded:
                delta = self.follower.poll()
                if delta.empty:
                    return False
                self._extend(delta)
            else:
                self._merge_meta(self.follower.poll(()))  # meta and inflight, no rows
                self._load(sorted(self.meta))
                self.loaded = True
            run = combine([h.summary for _, h in sorted(self.growing.items())])
            run = replace(run, without_trace=ranks_without_trace(run))
            self.growing = rebase(self.growing, run)  # each rank's rows once: views of the run's
            release_memory()
            data = RunData(run=run, samples=self._samples(), rows=self._rows())
            findings, failed = run_checks(run)
            precompute(data)
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

    def _merge_meta(self, delta: Delta) -> dict[int, RankMeta]:
        """Take the new meta.json and inflight.json of a poll; the metas they replace."""
        before = {r: self.meta[r] for r in delta.meta if r in self.meta}
        self.meta.update(delta.meta)
        self.inflight.update(delta.inflight)
        return before

    def _load(self, ranks: list[int]) -> None:
        """Summarize these ranks from the start of their folders (the follower's cursors moved
        to the end of what was read, so nothing is read twice after)."""
        jobs = [
            (r, str(self.follower.ranks[r].folder), self.meta[r], self.inflight.get(r, []))
            for r in ranks
        ]
        # named by the rank's folder; a few here, many in processes, as dtprof analyze reads them
        processes = len(jobs) >= PROCESSES_FROM
        read = map_items(fresh, jobs, processes=processes, name=lambda job: job[1])
        for (rank, *_), (growing, cursors, nbytes) in zip(jobs, read, strict=True):
            self.follower.adopt(rank, cursors, nbytes)
            old = self.growing.get(rank)
            self.growing[rank] = replace(growing, version=old.version + 1) if old else growing

    def _extend(self, delta: Delta) -> None:
        before = self._merge_meta(delta)
        again = [
            r
            for r in self.meta
            if r not in self.growing
            or (r in before and moved_clock(before[r], self.meta[r]))
            or (self.growing[r].kernels and r in delta.tables)
        ]
        moved = (set(delta.tables) | set(delta.inflight) | set(delta.meta)) - set(again)

        def one(rank: int) -> GrowingRank:
            return extend(
                self.growing[rank],
                self.meta[rank],
                delta.tables.get(rank, {}),
                delta.inflight.get(rank),
            )

        todo = sorted(moved)
        with ThreadPoolExecutor(max_workers=min(8, (os.cpu_count() or 2) * 2)) as pool:
            self.growing.update(zip(todo, pool.map(one, todo), strict=True))
        if again:
            self._load(sorted(again))

    def _samples(self) -> Any:
        return samples_frame({r: h.samples for r, h in self.growing.items()}, self.meta)

    def _rows(self) -> Rows:
        return Rows(
            folders={r: s.folder for r, s in self.follower.ranks.items() if r in self.growing},
            meta=dict(self.meta),
            versions={r: h.version for r, h in self.growing.items()},
            cache=self.cache,
        )

    def _status(self, data: RunData, took: float, complete: bool, failed: list[str]) -> str:
        statuses = {m.status for m in self.meta.values()}
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


def _steps(delta: Delta, meta: dict[int, RankMeta]) -> pa.Table:
    """A poll's new steps rows of every rank, times on rank 0's clock."""
    params = {rank: clock_params(m) for rank, m in meta.items()}
    by_rank = [(r, t["steps"]) for r, t in sorted(delta.tables.items()) if "steps" in t]
    return rank_table(TABLES["steps"], by_rank, params)


def _with_status(snap: Snapshot, status: str) -> Snapshot:
    return Snapshot(
        version=snap.version + 1,
        data=snap.data,
        findings=snap.findings,
        mode=snap.mode,
        status=status,
        complete=snap.complete,
    )
