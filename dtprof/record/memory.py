"""Memory at steps' ends: process RSS always, the CUDA caching allocator's figures on GPU."""

from __future__ import annotations

import os
from collections import deque
from typing import Any

import torch

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class _Statm:
    """/proc/self/statm kept open: one pread per reading instead of an open and a close. It is
    opened again in a forked child (/proc/self was resolved at open: the parent's)."""

    fd: int | None = None

    @classmethod
    def resident_bytes(cls) -> float:
        if cls.fd is None:
            cls.fd = os.open("/proc/self/statm", os.O_RDONLY)
        # "size resident shared ...", in pages: the second field, parsed as a float (an int
        # parse of bytes costs more, and the samples table holds floats)
        return float(os.pread(cls.fd, 64, 0).split(b" ", 2)[1]) * _PAGE

    @classmethod
    def forget(cls) -> None:
        cls.fd = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_Statm.forget)


def rss_bytes() -> float:
    """Resident set size of this process (Linux /proc; resource's peak elsewhere)."""
    try:
        return _Statm.resident_bytes()
    except OSError:
        import resource

        return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)


EVERY_NS = 50_000_000  # memory is read at a step's end, at most every 50 ms
RSS_METRIC = "rss_bytes"  # the RSS's rows in the samples table (also the native step's)


class StepMemory:
    """Memory read at the end of a step, once at least EVERY_NS has passed since the last
    reading: every step of a job whose steps take 50 ms or more, every few steps of a faster
    one. Reading the RSS is a syscall, and right after a step's compute it runs cold: 15-30 µs
    on this project's 2-core virtual machine, a quarter of the rest of a 7 ms step's recording.
    Where the native kernel ends the step (phases.cpp's profiler_step), it reads the RSS itself
    on a job without CUDA, on the same schedule, and calls this otherwise."""

    def __init__(self, samples: deque[tuple[int, int, str, float]]) -> None:
        self.samples = samples
        self.due_ns = 0

    def step_ends(self, step: int, ts_ns: int) -> None:
        """Append this step's memory figures to the samples table, when a reading is due."""
        if ts_ns < self.due_ns:
            return
        self.due_ns = ts_ns + EVERY_NS
        out = self.samples
        out.append((step, ts_ns, RSS_METRIC, rss_bytes()))
        if torch.cuda.is_initialized():  # a flag read: CUDA figures once the job uses CUDA
            # one reading of the caching allocator's counters, as nested dicts (memory_stats(),
            # which memory_allocated() and the others each call, flattens them all first). The
            # peak is since start or the user's last reset: resetting it here would break the
            # user's own max_memory_allocated() readings.
            stats = torch.cuda.memory_stats_as_nested_dict()
            for metric, path in CUDA_STATS:
                value: Any = stats
                for key in path:
                    value = value.get(key, 0) if isinstance(value, dict) else 0
                out.append((step, ts_ns, metric, float(value)))


# samples metric -> where it is in the caching allocator's nested statistics
CUDA_STATS = (
    ("cuda_allocated_bytes", ("allocated_bytes", "all", "current")),
    ("cuda_reserved_bytes", ("reserved_bytes", "all", "current")),
    ("cuda_max_allocated_bytes", ("allocated_bytes", "all", "peak")),
    ("cuda_alloc_retries", ("num_alloc_retries",)),  # cudaMalloc failed, cache freed, retried
    ("cuda_ooms", ("num_ooms",)),  # out-of-memory errors the allocator raised
)
