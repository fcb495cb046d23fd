"""Hang watchdog: a collective in flight longer than ``hang_timeout_s`` is recorded as a hang.

Runs on the writer thread, so it sees the training thread blocked inside a collective. For each
such operation it records one ``hang`` event with every thread's Python stack and asks for an
immediate flush. It never interrupts or kills the job.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import traceback
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dtprof.record.profiler import Profiler

now_ns = time.perf_counter_ns


def thread_stacks() -> list[dict[str, Any]]:
    """Every Python thread's name and stack, innermost frame last."""
    names = {t.ident: t.name for t in threading.enumerate()}
    stacks = []
    for ident, frame in sys._current_frames().items():
        frames = [
            {"file": f.filename, "line": f.lineno, "function": f.name, "code": f.line or ""}
            for f in traceback.extract_stack(frame)
        ]
        stacks.append({"thread": names.get(ident, str(ident)), "frames": frames})
    return stacks


class Watchdog:
    """Checks the in-flight table; ``timeout_s=None`` switches it off."""

    def __init__(self, prof: Profiler, timeout_s: float | None) -> None:
        self.prof = prof
        self.timeout_ns = None if timeout_s is None else int(timeout_s * 1e9)
        self._reported: set[int] = set()

    def check(self) -> None:
        if self.timeout_ns is None:
            return
        t = now_ns()
        inflight = self.prof.comms.inflight
        overdue = [
            (token, rec)
            for token, rec in list(inflight.items())
            if t - rec[7] > self.timeout_ns and token not in self._reported
        ]
        if not overdue:
            return
        stacks = thread_stacks()
        for token, rec in overdue:
            self._reported.add(token)
            step, group, seq, op, nbytes, dtype, peer, start, _async, label = rec
            waited_s = (t - start) / 1e9
            where = f" with rank {peer}" if peer is not None else ""
            message = (
                f"{op} (group {group}, seq {seq}{where}) in flight for {waited_s:.1f} s "
                f"at step {step}"
            )
            detail = {
                "group": group,
                "seq": seq,
                "op": op,
                "bytes": nbytes,
                "dtype": dtype,
                "peer": peer,
                "start_ns": start,
                "waited_s": waited_s,
                "label": label,
                "stacks": stacks,
            }
            self.prof.events.append((step, t, "hang", message, json.dumps(detail)))
        self.prof.writer.wake()
