"""The end of a collective on NCCL from NCCL's own timing, in place of an end event.

On a GPU, an end event recorded in a collective's future callback (on a stream made to wait
for the operation) held a GPU-bound DDP step up by about 1% (docs/gpu.md); NCCL's own timing
events, which it records around each operation on its own stream once timing is turned on for
the group (``TORCH_NCCL_ENABLE_TIMING``'s switch), cost nothing measurable. So an asynchronous
collective on NCCL keeps its start event (its arrival on the GPU, gpu_timing) and takes its
end from the operation's Work: NCCL's duration, placed after its arrival or after the group's
previous collective, whichever is later, since NCCL runs a group's collectives one after
another on one stream. native/buckets.cpp does the same in C++ for DDP's buckets.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch


def use_nccl_timing(group: Any) -> bool:
    """Turn NCCL's own timing on for ``group`` where its backend for CUDA tensors is NCCL (for
    good: torch has no way to turn it off; it costs nothing measurable); whether it is on. On a
    group with a backend for CPU tensors too, that backend's timing is turned on with it."""
    try:
        if group._get_backend(torch.device("cuda"))._get_backend_name() != "nccl":
            return False
        group._enable_collectives_timing()
    except Exception:  # no CUDA backend, an older torch: the end events, as elsewhere
        return False
    return True


class NcclChain:
    """One group's collectives that NCCL times, in launch order: the order NCCL runs them in,
    one after another on the group's stream."""

    def __init__(self) -> None:
        self.numbers = itertools.count()  # given at launch (next() is atomic)
        self.next = 0  # the number of the next one to be written (by the writer thread)
        self.last_end = 0  # the GPU end of the last one written, on the host's clock


class NcclEnd:
    """The GPU end of a collective that NCCL times (``use_nccl_timing``), in place of an end
    event: NCCL records timing events around the operation on its own stream, and its Work
    gives their interval once complete. A group's collectives run one after another on that
    stream, so each starts at its arrival (the start event) or at the end of the group's
    previous one (``chain``), whichever is later; the writer reads them in launch order.

    The Work holds the operation's tensors, so it is let go as soon as the operation is seen
    complete (``settle``): by the writer, or by the training thread at its next collective on
    CUDA (``gpu_timing.GpuTimer.settle``)."""

    def __init__(self, work: Any, chain: NcclChain) -> None:
        self.work: Any = work
        self.chain = chain
        self.number = next(chain.numbers)
        self.duration_ns: int | None = None  # NCCL's, once settled (None: it cannot say)

    def settle(self) -> bool:
        """Whether the operation is complete; the first time it is, NCCL's duration is read
        and the Work let go. (Two threads may both read it: the same value.)"""
        work = self.work
        if work is None:
            return True
        try:
            if not work.is_completed():
                return False
            self.duration_ns = round(work._get_duration() * 1e6)
        except Exception:  # the operation failed, or NCCL cannot say: no GPU times for it
            self.duration_ns = None
        self.work = None
        return True

    def query(self) -> bool:
        return self.settle()

    def end_ns(self, gpu_start: int) -> int | None:
        """The GPU end on the host's clock, given the GPU arrival (once settled, and once the
        chain's earlier ones are written); None where NCCL cannot say (the operation failed).
        The chain moves on to the next one."""
        chain = self.chain
        chain.next = self.number + 1
        if self.duration_ns is None:
            return None
        chain.last_end = max(gpu_start, chain.last_end) + self.duration_ns
        return chain.last_end
