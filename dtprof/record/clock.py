"""Cross-rank clock offsets, estimated by ping-pong with rank 0 at start and at exit.

Events are stamped with the rank's monotonic clock (perf_counter_ns). ``wall = mono +
mono_to_wall_ns`` puts them on the host's wall clock; the offset of that wall clock to rank 0's
is measured with a few round trips per rank over a side gloo group, keeping the round with the
smallest round trip: offset = t_rank - (t0_send + t0_recv) / 2, error = round trip / 2. The
loader subtracts the offset, interpolated linearly between the start and exit estimates.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from dtprof.trace.meta import Clock, ClockEstimate, replace

ROUNDS = 8
START_TIMEOUT_S = 1800.0  # ranks may reach profile() minutes apart (data loading, compiles)
EXIT_TIMEOUT_S = 10.0  # a rank that never comes must not hold the others long at exit

# One side group per default process group, made on first use and kept: every profile() in the
# process reuses it, so repeated profiling windows neither pile up gloo groups nor depend on
# every rank agreeing to make a new one.
_group: Any = None
_parent: Any = None


def _side_group() -> Any:
    global _group, _parent
    default = dist.distributed_c10d._get_default_group()
    if _group is None or _parent is not default:
        _group, _parent = dist.new_group(backend="gloo"), default
    return _group


def _wall_ns(base: int) -> int:
    return time.perf_counter_ns() + base


def start(world_size: int) -> Clock:
    """Anchor the monotonic clock to the wall clock and measure the offset to rank 0."""
    base = time.time_ns() - time.perf_counter_ns()
    alone = Clock(base, ClockEstimate(time.perf_counter_ns(), 0, 0))
    if world_size <= 1:
        return alone
    try:
        at, offset, error = _measure(_side_group(), base, START_TIMEOUT_S)
    except Exception as exc:  # times stay on this host's wall clock
        why = str(exc).splitlines()[0] if str(exc) else repr(exc)
        return replace(alone, method=f"failed: {why}")
    return Clock(base, ClockEstimate(at, offset, error), method="ping-pong with rank 0 over gloo")


def finish(clock: Clock, world_size: int) -> Clock:
    """Measure the offset again at exit, for drift. A failure leaves the start estimate alone."""
    if world_size <= 1 or _group is None:
        return clock
    try:
        at, offset, error = _measure(_group, clock.mono_to_wall_ns, EXIT_TIMEOUT_S)
    except Exception as exc:  # a rank gone or late: keep the start estimate
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return replace(clock, end_error=why)
    return replace(clock, end=ClockEstimate(at, offset, error))


def _measure(group: Any, base: int, timeout_s: float) -> tuple[int, int, int]:
    """(local mono time of the round used, offset to rank 0 in ns, error bound in ns)."""
    timeout = timedelta(seconds=timeout_s)
    rank = dist.get_rank()
    world = dist.get_world_size()
    rounds = max(3, min(ROUNDS, 4000 // max(world, 1)))
    buf = torch.zeros(3, dtype=torch.int64)
    if rank == 0:
        for peer in range(1, world):
            best: tuple[int, int, int] | None = None  # (rtt, offset, round)
            for i in range(rounds):
                t0 = _wall_ns(base)
                group.send([buf], peer, 0).wait(timeout)
                group.recv([buf], peer, 0).wait(timeout)
                t1 = _wall_ns(base)
                rtt = t1 - t0
                offset = int(buf[0]) - (t0 + t1) // 2
                if best is None or rtt < best[0]:
                    best = (rtt, offset, i)
            assert best is not None
            buf[0], buf[1], buf[2] = best[1], best[0] // 2, best[2]
            group.send([buf], peer, 0).wait(timeout)
        return time.perf_counter_ns(), 0, 0
    stamps = []
    for _ in range(rounds):
        group.recv([buf], 0, 0).wait(timeout)
        stamps.append(time.perf_counter_ns())
        buf[0] = stamps[-1] + base
        group.send([buf], 0, 0).wait(timeout)
    group.recv([buf], 0, 0).wait(timeout)
    return stamps[int(buf[2])], int(buf[0]), int(buf[1])
