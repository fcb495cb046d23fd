"""Replay: a finished trace played as if live, each finding at the step it would first be raised.

The step at which an online check would first have raised a finding is found by running that
check on prefixes of the run (the steps up to s), bisecting over s: a finding, once raised on a
prefix, is taken to stay raised on longer ones. Only the in-memory summary is cut; no file is
read again.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from dashboard.rundata import RunData, prefix
from dashboard.source import LiveSource, Snapshot, empty_snapshot
from dtprof.analysis.causes import link
from dtprof.analysis.checks import CHECKS, Check
from dtprof.analysis.report import Finding
from dtprof.analysis.summarize import RunSummary


def _same(a: Finding, b: Finding) -> bool:
    return a.code == b.code and (bool(set(a.ranks) & set(b.ranks)) or a.ranks == b.ranks)


def _raised(check: Check, run: RunSummary, final: Finding) -> Finding | None:
    try:
        found = check(run)
    except Exception:  # some checks fail on a handful of steps: not raised there, as live
        return None
    return next((f for f in found if _same(f, final)), None)


def raise_steps(
    data: RunData, checks: Sequence[Check] = tuple(CHECKS)
) -> list[tuple[int, Finding]]:
    """(step, finding as raised then) for each finding of the whole run, by raise step."""
    steps = sorted(int(s) for s in data.steps["step"].unique())
    out: list[tuple[int, Finding]] = []
    cuts: dict[int, RunSummary] = {}

    def cut(i: int) -> RunSummary:
        if i not in cuts:
            cuts[i] = prefix(data, steps[i]).run
        return cuts[i]

    for check in checks:
        for final in check(data.run):
            lo, hi = 0, len(steps) - 1
            first = _raised(check, cut(hi), final) if steps else None
            if first is None:  # raised only with the finished run's metadata: at its end
                out.append((steps[-1] if steps else 0, final))
                continue
            while lo < hi:
                mid = (lo + hi) // 2
                found = _raised(check, cut(mid), final)
                if found is not None:
                    hi, first = mid, found
                else:
                    lo = mid + 1
            out.append((steps[lo], first))
    return sorted(out, key=lambda pair: pair[0])


class ReplaySource:
    """Plays a finished trace: step s appears when ``speed`` x the recorded time has passed."""

    mode = "replay"

    def __init__(
        self,
        path: str | os.PathLike[str],
        speed: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        tick_s: float = 0.5,
    ) -> None:
        if speed <= 0:
            raise ValueError("speed must be positive")
        live = LiveSource(path)
        live.refresh()  # the steps
        live.refresh()  # everything else
        full = live.snapshot().data  # a replay cuts prefixes: its spans are kept, once
        self.full = replace(full, rows=replace(full.rows, spans_held=full.rows.all_spans()))
        self.raised = raise_steps(self.full)
        ends = self.full.steps.groupby("step")["end_ns"].max().sort_index()
        self.step_at_s = (ends - ends.iloc[0]) / 1e9 if len(ends) else ends
        self.speed, self.clock, self.tick_s = speed, clock, tick_s
        self.started = clock()
        self._snapshot = empty_snapshot(self.mode, "replay starting...")
        self._stop = threading.Event()

    def snapshot(self) -> Snapshot:
        return self._snapshot

    def current_step(self) -> int:
        elapsed = (self.clock() - self.started) * self.speed
        reached = self.step_at_s[self.step_at_s <= elapsed]
        return int(reached.index[-1]) if len(reached) else int(self.step_at_s.index[0])

    def refresh(self) -> bool:
        step = self.current_step()
        if self._snapshot.version and step == self._snapshot.data.last_step:
            return False
        last = int(self.step_at_s.index[-1])
        done = step >= last
        data = self.full if done else prefix(self.full, step)
        findings = link([f for s, f in self.raised if s <= step])
        status = f"replay x{self.speed:g} · step {step} of {last}" + (" · done" if done else "")
        self._snapshot = Snapshot(
            version=self._snapshot.version + 1,
            data=data,
            findings=findings,
            mode=self.mode,
            status=status,
        )
        return True

    def start(self) -> None:
        threading.Thread(target=self._run, name="dtprof-replay", daemon=True).start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.refresh()
            self._stop.wait(self.tick_s)

    def stop(self) -> None:
        self._stop.set()
