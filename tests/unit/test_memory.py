"""Memory read at steps' ends: at most every EVERY_NS."""

from __future__ import annotations

from collections import deque

from dtprof.record import memory
from dtprof.record.memory import EVERY_NS, StepMemory

MS = 1_000_000


def test_reads_at_a_steps_end_once_the_interval_has_passed() -> None:
    samples: deque[tuple[int, int, str, float]] = deque()
    reader = StepMemory(samples)
    ends = [0, 20 * MS, 40 * MS, 60 * MS, 80 * MS, 130 * MS, 131 * MS]
    for step, end in enumerate(ends):
        reader.step_ends(step, 10**12 + end)
    assert EVERY_NS == 50 * MS
    # step 0 is read; 1 and 2 come within 50 ms of it; 3 is 60 ms on; 4 within 50 ms of 3
    assert [s[0] for s in samples] == [0, 3, 5]
    assert {s[2] for s in samples} == {"rss_bytes"}
    assert all(s[3] > 1e6 for s in samples)


def test_every_step_of_a_slow_job_is_read() -> None:
    samples: deque[tuple[int, int, str, float]] = deque()
    reader = StepMemory(samples)
    for step in range(5):
        reader.step_ends(step, 10**12 + step * EVERY_NS)
    assert [s[0] for s in samples] == [0, 1, 2, 3, 4]


def test_rss_is_this_process_resident_size() -> None:
    with open("/proc/self/status") as status:
        kib = next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
    assert abs(memory.rss_bytes() - kib * 1024) < 64 * 2**20
