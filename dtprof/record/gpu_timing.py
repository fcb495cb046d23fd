"""GPU execution times of phases, user regions and collectives, from CUDA events.

On a GPU, the host's clock around a phase measures its launch: the work runs later, on the
device. So where a job runs on CUDA, each timed interval also records a CUDA event on the
current stream where it starts and another where it ends. The training thread never waits for
them: the writer thread reads each pair back once both have completed (``query()``) and writes
a ``gpu_spans`` row with the host's and the GPU's times, whose gap is the launch queue.

CUDA gives only the time between two events, so GPU times are placed on the rank's monotonic
clock through an anchor: an event the writer thread records on a stream of its own, which has
nothing queued and so reaches it at once, and waits for there; its host time is known to within
half that wait (the largest such bound goes into meta.json). cudaEventElapsedTime is a float32
of milliseconds, about 1 µs precise over a few seconds, so the anchor is renewed every
``ANCHOR_EVERY_S`` and each pair is measured from the last anchor before it.

Bounded: at most ``MAX_PENDING`` pairs wait for the GPU; beyond that (the GPU has fallen far
behind the host) new intervals are not timed on the GPU, and meta.json counts them. Events are
kept in a pool and recorded again once read. Nothing is recorded while the current stream is
being captured into a CUDA graph (the hooks then run once, at capture; replays run no Python).

The writer thread reads events back in CUDA's relaxed capture mode (``relaxed_capture_mode``):
under the default ("global") mode of ``torch.cuda.graph``, an event query from any other thread
while the training thread captures a graph would invalidate the user's capture.

Collectives: the start event is recorded where the call is made (the communication stream
waits for the current stream there): the operation's arrival on the GPU. The end event is
recorded where the call returns for a synchronous one (the current stream then waits for the
communication), or in the callback of its future (run on a stream made to wait for the
operation's own end events): the GPU's transfer, not its launch. Asynchronous collectives on
NCCL (DDP's buckets, ``async_op=True`` calls; not point-to-point ones) are the exception: their
end comes from NCCL's own timing (dtprof.record.nccl_timing).
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import ctypes
import functools
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch

from dtprof.record.gpu import why_no_cuda
from dtprof.record.nccl_timing import NcclChain, NcclEnd
from dtprof.trace.meta import GpuTiming

if TYPE_CHECKING:
    from dtprof.record.profiler import Profiler

now_ns = time.perf_counter_ns

MAX_PENDING = 20_000  # pairs waiting for the GPU: ~2 s of a step with 10,000 launches
ANCHOR_EVERY_S = 5.0
KEEP_ANCHORS = 120  # ten minutes of anchors: a pair older than that uses the oldest


CAPTURE_MODE_RELAXED = 2  # CUstreamCaptureMode: this thread's calls are never refused for a capture


@functools.cache
def _exchange_capture_mode() -> Any:
    """The CUDA driver's cuThreadExchangeStreamCaptureMode (the mode lives in the driver, per
    thread, for the runtime's calls too), or None where it cannot be had."""
    try:
        exchange = ctypes.CDLL("libcuda.so.1").cuThreadExchangeStreamCaptureMode
    except (OSError, AttributeError):
        return None
    exchange.argtypes = [ctypes.POINTER(ctypes.c_int)]
    exchange.restype = ctypes.c_int
    return exchange


@contextlib.contextmanager
def relaxed_capture_mode() -> Iterator[None]:
    """This thread's CUDA calls in the relaxed capture mode, and back to its own mode after.

    A graph captured in the "global" mode (``torch.cuda.graph``'s default) is invalidated by an
    event query or synchronization made on any thread while it is captured; the writer thread
    reads events back at any time, so it does so in this mode, as PyTorch's NCCL watchdog does.
    Nothing is asked of CUDA where this process has not initialized it."""
    exchange = _exchange_capture_mode() if torch.cuda.is_initialized() else None
    mode = ctypes.c_int(CAPTURE_MODE_RELAXED)
    if exchange is None or exchange(ctypes.byref(mode)) != 0:
        yield
        return
    try:
        yield
    finally:
        exchange(ctypes.byref(mode))


def capturing() -> bool:
    """Whether this thread's current CUDA stream is being captured into a CUDA graph (a flag
    read where this process has not initialized CUDA). Work launched there runs only on the
    graph's replays: it gets no events and no callback on its future, whose streams would join
    the capture and never leave it, which invalidates the graph."""
    return torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing()


def wanted(prof: Profiler, model: Any) -> str | None:
    """Why GPU timing is off for this profile, or None where it is on: where the job uses CUDA
    (dtprof.record.gpu.why_no_cuda)."""
    if not prof.gpu_timing:
        return "off (gpu_timing=False)"
    return why_no_cuda(model)


class GpuTimer:
    """CUDA-event pairs from the training threads, read back by the writer thread."""

    def __init__(self, prof: Profiler) -> None:
        self.prof = prof
        self.out = prof.gpu_spans
        self._free: list[torch.cuda.Event] = []
        self._pending: collections.deque[tuple[Any, ...]] = collections.deque()
        self._nccl_chains: dict[Any, NcclChain] = {}  # group name -> its NCCL-timed collectives
        self._unsettled: collections.deque[NcclEnd] = collections.deque()  # launch order
        self._anchor_host: list[int] = []  # host ns of each anchor, ascending
        self._anchor_event: list[torch.cuda.Event] = []
        self._side = torch.cuda.Stream()
        self.timed = 0
        self.dropped = 0
        self.dropped_native = 0  # DDP buckets the native kernel did not time (ddp_buckets)
        self.captured = 0  # intervals inside a CUDA graph's capture, not timed
        self.anchor_error_ns = 0
        self._anchor()

    def status(self) -> GpuTiming:
        return GpuTiming(
            available=True,
            timed=self.timed,
            dropped=self.dropped + self.dropped_native,
            captured=self.captured,
            anchor_error_ns=self.anchor_error_ns,
        )

    # -- on the training threads

    def mark(self) -> torch.cuda.Event | None:
        """An event recorded now on the current stream; None where too many pairs wait, or
        where the stream is being captured into a CUDA graph (an event recorded there would
        belong to the graph, and a failed call would break the user's capture)."""
        if len(self._pending) >= MAX_PENDING:
            self.dropped += 1
            return None
        try:
            if torch.cuda.is_current_stream_capturing():
                self.captured += 1
                return None
            try:
                event = self._free.pop()  # atomic: another thread may take the last one
            except IndexError:
                event = torch.cuda.Event(enable_timing=True)
            event.record()
        except Exception as exc:  # a CUDA error: timing goes off, training goes on
            self.abandon()
            self.prof.hook_failed("gpu-timing", exc)
            return None
        return event

    def pair(
        self,
        start: torch.cuda.Event | None,
        head: tuple[Any, ...],
        host_start: int,
        host_end: int,
        done: Callable[[], object] | None = None,
        work: Any = None,
    ) -> bool:
        """Close the interval that ``start`` opened with an event recorded now, or where
        ``work`` is given, with the end NCCL times (:class:`NcclEnd`); ``head`` is the row's
        (step, name, kind, group, seq). ``done`` is called on the writer thread once the GPU
        has passed it. False where it is not timed (then ``done`` is never called)."""
        if start is None:
            return False
        end: torch.cuda.Event | NcclEnd | None
        if work is not None:
            chain = self._nccl_chains.get(head[3])
            if chain is None:
                chain = self._nccl_chains.setdefault(head[3], NcclChain())
            end = NcclEnd(work, chain)
            self._unsettled.append(end)
        else:
            end = self.mark()
        if end is None:
            self._free.append(start)
            return False
        self._pending.append((start, end, head, host_start, host_end, done))
        return True

    def settle(self) -> None:
        """Let go of the Works of the NCCL-timed operations that are complete, oldest first
        (called at each collective on CUDA, so none is held much past its end)."""
        unsettled = self._unsettled
        try:
            while unsettled and unsettled[0].settle():
                unsettled.popleft()
        except IndexError:  # another thread took the last one
            pass

    def release(self, start: torch.cuda.Event | None) -> None:
        """An interval that will not be closed (its operation failed)."""
        if start is not None:
            self._free.append(start)

    # -- on the writer thread

    def drain(self) -> None:
        """The pairs the GPU has passed into gpu_spans; renews the anchor when due."""
        if now_ns() - self._anchor_host[-1] > ANCHOR_EVERY_S * 1e9:
            self._anchor()
        pending = self._pending
        for _ in range(len(pending)):  # those appended meanwhile wait for the next drain
            try:
                item = pending.popleft()
            except IndexError:  # the writer's tick and close() at exit both drained it
                break
            start, end = item[0], item[1]
            later = isinstance(end, NcclEnd) and end.number != end.chain.next
            if later or not (end.query() and start.query()):
                pending.append(item)  # (a group's NCCL-timed ones are read in launch order)
                continue
            self._write(*item)
        self.prof.note_meta(gpu_timing=self.status())

    def abandon(self) -> None:
        """Timing has failed: what waits for the GPU is let go untimed, and the operations among
        it leave flight (the host saw them complete; nothing will say when the GPU did)."""
        self._unsettled.clear()  # the Works NCCL times, and the tensors they hold
        while True:
            try:
                item = self._pending.popleft()
            except IndexError:
                return
            if item[5] is not None:
                item[5]()

    def close(self, timeout_s: float = 2.0) -> None:
        """Drain, waiting up to ``timeout_s`` for what is still queued on the GPU (no longer: a
        collective that never completes keeps its pair, stays in flight for inflight.json, and
        exit goes on)."""
        deadline = now_ns() + int(timeout_s * 1e9)
        self.drain()
        while self._pending and now_ns() < deadline:
            time.sleep(0.005)
            self.drain()

    def _write(
        self,
        start: torch.cuda.Event,
        end: torch.cuda.Event | NcclEnd,
        head: tuple[Any, ...],
        host_start: int,
        host_end: int,
        done: Callable[[], object] | None,
    ) -> None:
        at = max(0, bisect.bisect_right(self._anchor_host, host_start) - 1)
        anchor, base = self._anchor_event[at], self._anchor_host[at]
        gpu_start = base + round(anchor.elapsed_time(start) * 1e6)
        gpu_end: int | None
        if isinstance(end, NcclEnd):
            gpu_end = end.end_ns(gpu_start)
        else:
            gpu_end = base + round(anchor.elapsed_time(end) * 1e6)
            self._free.append(end)
        self._free.append(start)
        if gpu_end is not None:
            self.out.append((*head, host_start, host_end, gpu_start, max(gpu_start, gpu_end)))
            self.timed += 1
        if done is not None:
            done()

    def _anchor(self) -> None:
        event = torch.cuda.Event(enable_timing=True)
        before = now_ns()
        event.record(self._side)
        event.synchronize()
        after = now_ns()
        self._anchor_host.append((before + after) // 2)
        self._anchor_event.append(event)
        self.anchor_error_ns = max(self.anchor_error_ns, (after - before + 1) // 2)
        if len(self._anchor_host) > KEEP_ANCHORS:
            del self._anchor_host[0], self._anchor_event[0]
