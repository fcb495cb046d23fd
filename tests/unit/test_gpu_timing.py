"""CUDA-event timing's logic, with stand-in events: this machine has no GPU.

A stand-in event recorded on the current stream "runs" LAG_NS after the host recorded it (the
launch queue); one recorded on the timer's own stream (an anchor) runs at once. The timer must
turn each pair into the GPU's times on the host's clock, only once both have completed.
"""

from __future__ import annotations

from collections import deque
from functools import partial
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from dtprof.record import gpu_timing, nccl_timing

LAG_NS = 3_000_000


class _Event:
    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing
        self.gpu_ns: int | None = None
        self.done = False

    def record(self, stream: Any = None) -> None:
        now = gpu_timing.now_ns()
        self.gpu_ns = now if stream is not None else now + LAG_NS
        self.done = stream is not None  # the GPU reaches the others when the test says so

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.done = True

    def elapsed_time(self, end: _Event) -> float:
        assert self.done and end.done and self.gpu_ns is not None and end.gpu_ns is not None
        return (end.gpu_ns - self.gpu_ns) / 1e6


@pytest.fixture
def timer(monkeypatch: pytest.MonkeyPatch) -> gpu_timing.GpuTimer:
    monkeypatch.setattr("torch.cuda.Event", _Event)
    monkeypatch.setattr("torch.cuda.Stream", lambda: object())
    monkeypatch.setattr("torch.cuda.is_current_stream_capturing", lambda: False)
    failed: list[str] = []
    prof = SimpleNamespace(
        gpu_spans=deque(),
        note_meta=lambda **kw: None,
        hook_failed=lambda name, exc: failed.append(f"{name}: {exc}"),
        failed=failed,
    )
    return gpu_timing.GpuTimer(prof)  # type: ignore[arg-type]


def _interval(timer: gpu_timing.GpuTimer, name: str) -> tuple[_Event, _Event, int]:
    host_start = gpu_timing.now_ns()
    start = timer.mark()
    timer.pair(start, (4, name, "phase", None, None), host_start, gpu_timing.now_ns())
    return start, timer._pending[-1][1], host_start  # type: ignore[return-value]


def test_a_pair_is_written_once_the_gpu_has_passed_both_events(timer) -> None:
    start, end, host_start = _interval(timer, "forward")
    timer.drain()
    assert not timer.out  # the GPU has not got there: nothing yet, and nothing lost
    start.done = end.done = True
    timer.drain()
    (row,) = timer.out
    step, name, kind, group, seq, h_start, h_end, g_start, g_end = row
    assert (step, name, kind, group, seq, h_start) == (
        4,
        "forward",
        "phase",
        None,
        None,
        host_start,
    )
    # the GPU's times are the host's plus the launch queue, to within the anchor's bound
    slack = timer.anchor_error_ns + 50_000
    assert abs(g_start - (host_start + LAG_NS)) <= slack
    assert abs(g_end - (h_end + LAG_NS)) <= slack
    assert timer.status().timed == 1 and not timer._pending


def test_pairs_complete_out_of_order_and_none_is_lost(timer) -> None:
    first = _interval(timer, "a")
    second = _interval(timer, "b")
    second[0].done = second[1].done = True  # a later stream finished first
    timer.drain()
    assert [r[1] for r in timer.out] == ["b"]
    first[0].done = first[1].done = True
    timer.drain()
    assert [r[1] for r in timer.out] == ["b", "a"]


def test_too_many_waiting_pairs_are_dropped_and_counted(timer, monkeypatch) -> None:
    monkeypatch.setattr(gpu_timing, "MAX_PENDING", 2)
    for name in ("a", "b", "c"):
        _interval(timer, name)
    assert len(timer._pending) == 2  # the third's end could not be had: not timed
    assert timer.mark() is None
    assert timer.status().dropped == 2


def test_each_pair_is_measured_from_the_last_anchor_before_it(timer, monkeypatch) -> None:
    monkeypatch.setattr(gpu_timing, "ANCHOR_EVERY_S", 0.0)  # a new anchor at every drain
    start, end, host_start = _interval(timer, "a")
    timer.drain()
    timer.drain()
    assert len(timer._anchor_host) == 3
    start.done = end.done = True
    timer.drain()
    (row,) = timer.out
    assert abs(row[7] - (host_start + LAG_NS)) <= timer.anchor_error_ns + 50_000


def test_a_cuda_error_switches_timing_off_not_training(timer, monkeypatch) -> None:
    def broken(self: _Event, stream: Any = None) -> None:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(_Event, "record", broken)
    timer._free.clear()
    assert timer.mark() is None
    assert timer.prof.failed == [  # type: ignore[attr-defined]
        "gpu-timing: CUDA error: an illegal memory access was encountered"
    ]


def test_close_waits_a_bounded_time_for_what_never_completes(timer) -> None:
    _interval(timer, "hung")
    t0 = gpu_timing.now_ns()
    timer.close(timeout_s=0.05)
    assert (gpu_timing.now_ns() - t0) / 1e9 < 1.0 and not timer.out


def test_nothing_is_recorded_into_a_cuda_graph_being_captured(timer, monkeypatch) -> None:
    monkeypatch.setattr("torch.cuda.is_current_stream_capturing", lambda: True)
    host = gpu_timing.now_ns()
    timer.pair(timer.mark(), (0, "forward", "phase", None, None), host, host)
    assert not timer._pending and timer.status().captured == 1  # its start: no pair to close
    assert timer.prof.failed == []  # type: ignore[attr-defined]


def test_done_is_called_once_the_gpu_has_passed_and_on_abandon_for_the_rest(timer) -> None:
    called: list[str] = []
    host = gpu_timing.now_ns()
    for name in ("passed", "waiting"):
        start = timer.mark()
        assert timer.pair(
            start, (0, name, "collective", "0", 0), host, host, partial(called.append, name)
        )
    first = timer._pending[0]
    first[0].done = first[1].done = True
    timer.drain()
    assert called == ["passed"]
    timer.abandon()  # timing failed: the rest leave flight, untimed
    assert called == ["passed", "waiting"] and not timer._pending and len(timer.out) == 1


def _recorder(timer: gpu_timing.GpuTimer, step: int) -> Any:
    """A collectives recorder on the timer's stand-in profile at ``step``, one group, "0"."""
    from dtprof.record import comms

    prof = timer.prof
    prof.rank, prof.collectives, prof.step_index, prof.gpu_timer = 0, deque(), step, timer
    recorder = comms.CommRecorder(prof)  # type: ignore[arg-type]
    recorder.group_name = lambda group: "0"  # type: ignore[method-assign]
    return recorder


def test_a_cuda_collective_stays_in_flight_until_the_gpu_has_passed_it(timer, monkeypatch) -> None:
    """On NCCL the host is done with a collective at once; a hang is on the GPU."""
    from dtprof.record import comms

    monkeypatch.setattr(comms, "_on_cuda", lambda payload: True)
    recorder = _recorder(timer, 3)
    prof = timer.prof
    call = comms._Call(
        lambda tensor, group=None, async_op=False: None, "all_reduce", "tensor", None
    )
    token = recorder._enter(call, (torch.ones(4),), {})
    recorder._complete(token)  # the call returned: done on the host
    assert len(prof.collectives) == 1 and [op.seq for op in recorder.inflight_snapshot()] == [0]
    start, end = timer._pending[0][:2]
    start.done = end.done = True
    timer.drain()  # the GPU has passed it
    assert recorder.inflight_snapshot() == []
    (row,) = timer.out
    assert row[:5] == (3, "all_reduce", "collective", "0", 0)


def test_events_are_read_in_the_relaxed_capture_mode_and_the_threads_mode_comes_back(
    monkeypatch,
) -> None:
    modes = [0]  # this thread's capture mode, as the driver keeps it: global to begin with
    calls: list[int] = []

    def exchange(pointer: Any) -> int:
        mode = pointer._obj
        calls.append(mode.value)
        modes[-1], mode.value = mode.value, modes[-1]
        return 0

    monkeypatch.setattr(gpu_timing, "_exchange_capture_mode", lambda: exchange)
    monkeypatch.setattr("torch.cuda.is_initialized", lambda: True)
    with gpu_timing.relaxed_capture_mode():
        assert modes == [gpu_timing.CAPTURE_MODE_RELAXED]
    assert modes == [0] and calls == [gpu_timing.CAPTURE_MODE_RELAXED, 0]

    monkeypatch.setattr("torch.cuda.is_initialized", lambda: False)  # a CPU job: CUDA untouched
    calls.clear()
    with gpu_timing.relaxed_capture_mode():
        pass
    assert calls == []


class _Work:
    """A stand-in NCCL Work with NCCL's own timing on: complete when the test says so."""

    def __init__(self, duration_ms: float | None) -> None:
        self.duration_ms = duration_ms
        self.done = False

    def is_completed(self) -> bool:
        return self.done

    def _get_duration(self) -> float:
        if self.duration_ms is None:
            raise RuntimeError("the operation failed")
        return self.duration_ms


def _bucket(timer: gpu_timing.GpuTimer, seq: int, work: _Work, called: list[int]) -> _Event:
    start = timer.mark()
    host = gpu_timing.now_ns()
    head = (1, "all_reduce", "collective", "0", seq)
    assert timer.pair(start, head, host, host, partial(called.append, seq), work=work)
    return start  # type: ignore[return-value]


def test_a_bucket_nccl_times_starts_at_its_arrival_or_after_the_one_before_it(timer) -> None:
    """NCCL runs a group's operations one after another: the second bucket arrived while the
    first was still reducing, so it began where the first ended."""
    called: list[int] = []
    first_work, second_work = _Work(5.0), _Work(2.0)
    first = _bucket(timer, 0, first_work, called)
    second = _bucket(timer, 1, second_work, called)
    assert second.gpu_ns is not None and first.gpu_ns is not None
    assert second.gpu_ns - first.gpu_ns < 5_000_000  # arrived before the first could end
    first.done = second.done = True
    timer.drain()
    assert not timer.out and called == []  # NCCL has not finished either: in flight
    first_work.done = second_work.done = True
    timer.drain()
    (a, b) = sorted(timer.out, key=lambda row: row[4])
    assert a[7] == pytest.approx(first.gpu_ns, abs=timer.anchor_error_ns + 50_000)
    assert a[8] - a[7] == 5_000_000
    assert b[7] == pytest.approx(second.gpu_ns, abs=timer.anchor_error_ns + 50_000)
    assert b[8] == a[8] + 2_000_000  # waited for the first, then its own 2 ms
    assert called == [0, 1] and not timer._pending and timer.status().timed == 2


def test_a_later_bucket_is_not_read_before_an_earlier_one_of_its_group(timer) -> None:
    """Read in launch order, even where the GPU passes both between two queries."""
    called: list[int] = []
    first_work, second_work = _Work(1.0), _Work(1.0)
    first = _bucket(timer, 0, first_work, called)
    second = _bucket(timer, 1, second_work, called)
    first.done = second.done = second_work.done = True  # (as if read just before the first)
    timer.drain()
    assert called == [] and len(timer._pending) == 2
    first_work.done = True
    timer.drain()
    assert called == [0, 1]


def test_a_group_is_read_in_launch_order_even_where_its_queue_is_not(timer) -> None:
    """The writer puts back what is not ready while the training thread appends: the queue's
    order can differ from the launch order, the chain's may not."""
    called: list[int] = []
    works = [_Work(4.0), _Work(1.0)]
    starts = [_bucket(timer, seq, work, called) for seq, work in enumerate(works)]
    timer._pending.reverse()  # the later one first
    for start, work in zip(starts, works, strict=True):
        start.done = work.done = True
    timer.drain()
    assert called == [0]  # the later one waited for the earlier one to be written
    timer.drain()
    assert called == [0, 1]
    (a, b) = sorted(timer.out, key=lambda row: row[4])
    assert b[8] == max(b[7], a[8]) + 1_000_000


def test_a_bucket_whose_operation_failed_leaves_flight_untimed(timer) -> None:
    called: list[int] = []
    work = _Work(None)
    start = _bucket(timer, 0, work, called)
    start.done = work.done = True
    timer.drain()
    assert called == [0] and not timer.out and not timer.prof.failed


def test_nccl_timing_is_turned_on_only_for_a_group_whose_cuda_backend_is_nccl() -> None:
    turned_on: list[str] = []

    def group(name: str) -> Any:
        backend = SimpleNamespace(_get_backend_name=lambda: name)
        return SimpleNamespace(
            _get_backend=lambda device: backend,
            _enable_collectives_timing=lambda: turned_on.append(name),
        )

    def no_cuda_backend(device: torch.device) -> Any:
        raise RuntimeError("No backend type associated with device type cuda")

    assert nccl_timing.use_nccl_timing(group("nccl"))
    assert not nccl_timing.use_nccl_timing(group("gloo"))
    assert not nccl_timing.use_nccl_timing(SimpleNamespace(_get_backend=no_cuda_backend))
    assert turned_on == ["nccl"]


class _OnCuda(torch.Tensor):
    @property
    def is_cuda(self) -> bool:  # type: ignore[override]
        return True


def test_a_bucket_of_a_group_nccl_times_is_closed_by_nccls_end_not_an_event(timer) -> None:
    """The Python kernel's path: the bucket's Work goes to the timer in place of an end event,
    and the bucket stays in flight until NCCL has finished it."""
    recorder = _recorder(timer, 2)
    group, work = object(), _Work(3.0)
    future = SimpleNamespace(add_done_callback=lambda callback: callback(future), value=lambda: 0)
    work.get_future = lambda: future  # type: ignore[attr-defined]
    recorder._nccl_groups[group] = True  # as BucketWatch.watch() turns it on
    tensor = torch.ones(4).as_subclass(_OnCuda)
    recorder.launched(group, [tensor], gpu_timing.now_ns(), "ddp.bucket0", work)
    start, end = timer._pending[0][:2]
    assert isinstance(end, nccl_timing.NcclEnd) and end.work is work
    assert [op.label for op in recorder.inflight_snapshot()] == ["ddp.bucket0"]
    start.done = work.done = True
    timer.drain()
    assert recorder.inflight_snapshot() == []
    (row,) = timer.out
    assert row[:5] == (2, "all_reduce", "collective", "0", 0) and row[8] - row[7] == 3_000_000


def _api_recorder(timer: gpu_timing.GpuTimer, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A recorder whose groups all have NCCL for CUDA tensors (each turned on once: ``on``)."""
    from dtprof.record import comms

    monkeypatch.setattr(comms, "_on_cuda", lambda payload: True)
    turned_on: list[Any] = []
    monkeypatch.setattr(nccl_timing, "use_nccl_timing", lambda group: turned_on.append(group) or 1)
    recorder = _recorder(timer, 5)
    recorder.turned_on = turned_on
    return recorder


def _async_call(recorder: Any, group: Any, work: _Work, op: str = "all_reduce") -> int:
    """An asynchronous call through the wrapped API that returns ``work``."""
    from dtprof.record import comms

    def api(tensor, group=None, async_op=False, dst=None):  # type: ignore[no-untyped-def]
        return None

    peer = "dst" if op == "isend" else None
    call = comms._Call(api, op, "tensor", peer)
    kwargs: dict[str, Any] = {"group": group, "async_op": True}
    if peer:
        kwargs["dst"] = 1
    token = recorder._enter(call, (torch.ones(4),), kwargs)
    future = SimpleNamespace(then=lambda callback: callback(future), value=lambda: None)
    work.get_future = lambda: future  # type: ignore[attr-defined]
    recorder._exit(token, call, work)
    return token


def test_an_asynchronous_collective_on_nccl_ends_by_nccls_timing_and_lets_its_work_go(
    timer, monkeypatch
) -> None:
    """Its Work holds its tensors: it is let go at the next collective once complete, before
    the writer has read the interval."""
    recorder = _api_recorder(timer, monkeypatch)
    group, first_work = object(), _Work(2.0)
    _async_call(recorder, group, first_work)
    start, end = timer._pending[0][:2]
    assert isinstance(end, nccl_timing.NcclEnd) and end.work is first_work
    first_work.done = True
    _async_call(recorder, group, _Work(1.0))  # the next collective on CUDA
    assert end.work is None and end.duration_ns == 2_000_000  # let go, duration kept
    start.done = True
    timer.drain()
    (row,) = [r for r in timer.out if r[4] == 0]
    assert row[8] - row[7] == 2_000_000
    assert recorder.turned_on == [group]  # turned on once per group
    timer.abandon()  # timing fails: the Works still waited for are let go with the rest
    assert not timer._unsettled and not timer._pending


def test_point_to_point_and_synchronous_calls_keep_their_end_events(timer, monkeypatch) -> None:
    """A peer's operations run on a stream of their own, so NCCL's timing would not chain;
    a synchronous call's end event is on the stream that waited for it anyway."""
    from dtprof.record import comms

    recorder = _api_recorder(timer, monkeypatch)
    _async_call(recorder, object(), _Work(1.0), op="isend")

    def all_reduce(tensor, group=None, async_op=False):  # type: ignore[no-untyped-def]
        return None

    call = comms._Call(all_reduce, "all_reduce", "tensor", None)
    token = recorder._enter(call, (torch.ones(4),), {"group": object()})
    recorder._exit(token, call, None)
    ends = [item[1] for item in timer._pending]
    assert len(ends) == 2 and not any(isinstance(e, nccl_timing.NcclEnd) for e in ends)
    assert recorder.turned_on == [] and not recorder._nccl_works


def test_a_work_that_cannot_say_whether_it_is_complete_is_let_go_untimed(timer) -> None:
    """Raised by NCCL on the training thread's settle(): training and recording go on."""
    called: list[int] = []
    work = _Work(1.0)

    def broken() -> bool:
        raise RuntimeError("NCCL communicator was aborted")

    work.is_completed = broken  # type: ignore[method-assign]
    start = _bucket(timer, 0, work, called)
    timer.settle()
    assert not timer._unsettled
    start.done = True
    timer.drain()
    assert called == [0] and not timer.out and not timer.prof.failed
