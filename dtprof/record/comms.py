"""Collective and point-to-point hooks: wrappers around torch.distributed's Python API.

Each call records op, group, per-group sequence number, bytes, dtype, peer, entry time and
completion time. Synchronous calls complete when they return; async ones when their future
completes (a ``then`` callback, no synchronization), or, for gloo p2p works that have no
future, when ``wait()`` returns. On CUDA tensors these are host times (for NCCL, the launch);
CUDA events at the call and at its completion give the GPU's (dtprof.record.gpu_timing).
DDP's gradient buckets are reduced by C++: ``ddp_buckets`` records them at torch's dispatcher,
or ``ddp_hook`` through a comm hook where it cannot.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import queue
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from dtprof.record import gpu_timing, nccl_timing
from dtprof.trace.meta import InflightOp

if TYPE_CHECKING:
    from dtprof.record.profiler import Profiler

now_ns = time.perf_counter_ns

# API name -> (recorded op name, parameter holding this rank's input, peer parameter)
OPS: dict[str, tuple[str, str | None, str | None]] = {
    "all_reduce": ("all_reduce", "tensor", None),
    "all_reduce_coalesced": ("all_reduce_coalesced", "tensors", None),
    "all_gather": ("all_gather", "tensor", None),
    "all_gather_coalesced": ("all_gather_coalesced", "input_tensor_list", None),
    "all_gather_single": ("all_gather_into_tensor", "input_tensor", None),
    "all_gather_into_tensor": ("all_gather_into_tensor", "input_tensor", None),
    "_all_gather_base": ("all_gather_into_tensor", "input_tensor", None),
    "reduce_scatter": ("reduce_scatter", "input_list", None),
    "reduce_scatter_single": ("reduce_scatter_tensor", "input", None),
    "reduce_scatter_tensor": ("reduce_scatter_tensor", "input", None),
    "_reduce_scatter_base": ("reduce_scatter_tensor", "input", None),
    "broadcast": ("broadcast", "tensor", None),
    "reduce": ("reduce", "tensor", None),
    "all_to_all": ("all_to_all", "input_tensor_list", None),
    "all_to_all_single": ("all_to_all_single", "input", None),
    "barrier": ("barrier", None, None),
    "monitored_barrier": ("monitored_barrier", None, None),
    "gather": ("gather", "tensor", None),
    "scatter": ("scatter", "tensor", None),
    "send": ("send", "tensor", "dst"),
    "isend": ("isend", "tensor", "dst"),
    "recv": ("recv", "tensor", "src"),
    "irecv": ("irecv", "tensor", "src"),
}
P2P_SEND = {"send", "isend"}


class _ThreadState(threading.local):
    """Per thread: inside a recorded call (nested API calls, and the process-group call a
    wrapper ends in, are not recorded twice)."""

    depth = 0


_tls = _ThreadState()


def _nbytes(obj: Any) -> tuple[int, str | None]:
    """Bytes of a tensor or (nested) list of tensors, and the first dtype seen."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size(), str(obj.dtype).removeprefix("torch.")
    if isinstance(obj, (list, tuple)):
        total, dtype = 0, None
        for item in obj:
            n, d = _nbytes(item)
            total += n
            dtype = dtype or d
        return total, dtype
    return 0, None


def _on_cuda(obj: Any) -> bool:
    """Whether a payload's first tensor (of a tensor or a nested list, as _nbytes walks them)
    is on a CUDA device."""
    if isinstance(obj, torch.Tensor):
        return obj.is_cuda
    if isinstance(obj, (list, tuple)):
        return bool(obj) and _on_cuda(obj[0])
    return False


class _Call:
    """Where one API function keeps the arguments dtprof reads."""

    __slots__ = (
        "async_idx",
        "group_idx",
        "group_peer",
        "group_peer_idx",
        "op",
        "payload",
        "payload_idx",
        "peer",
        "peer_idx",
    )

    def __init__(self, fn: Callable[..., Any], op: str, payload: str | None, peer: str | None):
        params = list(inspect.signature(fn).parameters)

        def index(name: str | None) -> int | None:
            return params.index(name) if name in params else None

        self.op = op
        self.payload, self.payload_idx = payload, index(payload)
        self.group_idx = index("group")
        self.async_idx = index("async_op")
        self.peer, self.peer_idx = peer, index(peer)
        self.group_peer = f"group_{peer}" if peer else None
        self.group_peer_idx = index(self.group_peer)


def _arg(args: tuple[Any, ...], kwargs: dict[str, Any], name: str | None, idx: int | None) -> Any:
    if name is None:
        return None
    if name in kwargs:
        return kwargs[name]
    if idx is not None and idx < len(args):
        return args[idx]
    return None


class CommRecorder:
    """Wraps the API while installed; keeps group names, sequence counters and in-flight ops."""

    def __init__(self, prof: Profiler) -> None:
        self.prof = prof
        self.rank = prof.rank
        self.out = prof.collectives
        self.enabled = True
        self.inflight: dict[int, tuple[Any, ...]] = {}
        self._ids = itertools.count()
        self._group_names: dict[Any, str] = {}
        self._seq: dict[Any, int] = {}
        self._no_future: set[str] = set()
        self._originals: list[tuple[Any, str, Any]] = []
        self._all_reduce: tuple[Callable[..., Any], _Call] | None = None
        self._default_group: Any = None
        self._bucket_watch: Any = None
        self._waiter: _Waiter | None = None
        self._native: Any = None  # ddp_buckets.NativeBuckets, where the native kernel records
        # the step in progress, which the profiler writes at each step's end: where the native
        # kernel records, its shared memory, whose first number it stamps its records with
        self.step_cell: Any = [0]
        self._native_slots: dict[str, int] = {}  # group name -> its counter in native memory
        self._gpu_events: dict[int, Any] = {}  # token -> the CUDA event where the call began
        self._nccl_groups: dict[Any, bool] = {}  # group -> whether NCCL times its operations
        # token -> the Work of an operation NCCL times (None until the call has returned it)
        self._nccl_works: dict[int, Any] = {}

    # -- installation

    def install(self) -> None:
        if dist.is_initialized():
            self._default_group = c10d._get_default_group()
        for api_name, (op, payload, peer) in OPS.items():
            original = getattr(c10d, api_name, None)
            if original is None or not callable(original):
                continue
            call = _Call(original, op, payload, peer)
            if api_name == "all_reduce":
                self._all_reduce = (original, call)
            wrapper = self._wrap(original, call)
            for module in (c10d, dist):
                if getattr(module, api_name, None) is original:
                    self._originals.append((module, api_name, original))
                    setattr(module, api_name, wrapper)

    def watch_ddp(self, model: torch.nn.parallel.DistributedDataParallel, native: Any) -> str:
        """Record ``model``'s gradient buckets at the dispatcher (raises where it cannot): with
        the ``native`` kernel where given and it can, else with the Python one. Which: the
        kernel's name, and why not the native one where it was given and not used."""
        from dtprof.record import ddp_buckets

        if self._native is not None or (native is not None and self._bucket_watch is None):
            if self._native is None:
                self._native = ddp_buckets.NativeBuckets(self, native)
            try:
                self._native.watch(model)
                self.step_cell = self._native.native.shared
                self.step_cell[0] = self.prof.step_index
                return "native"
            except Exception as exc:
                if not self._native.names:  # nothing watched: leave it to the Python kernel
                    self._native.uninstall()
                    self._native = None
                    self.step_cell = [0]
                    self._native_slots.clear()
                    why = f"unavailable: {exc}".splitlines()[0]
                    self.prof.note_meta(ddp_buckets_native=why)
                else:
                    raise
        if self._bucket_watch is None:
            self._bucket_watch = ddp_buckets.BucketWatch(self)
        self._bucket_watch.watch(model)
        return "python"

    def take_native_seq(self, name: str, slot: int) -> int:
        """Hand group ``name``'s sequence counter to native memory (slot ``slot``): from now on
        both sides number that group's operations from there. Returns the next number."""
        self._native_slots[name] = slot
        return self._seq.pop(name, 0)

    def sync_native(self) -> None:
        """The native kernel's records into the trace (the writer's tick)."""
        if self._native is not None:
            self._native.sync()

    def _api_depth(self, depth: int) -> None:
        """Inside (1) or out of (0) a recorded API call on this thread: the process-group call
        the call ends in is not recorded again, by either kernel."""
        _tls.depth = depth
        if self._native is not None:
            self._native.native.depth_flag().value = depth

    def uninstall(self) -> None:
        self.enabled = False
        watch, self._bucket_watch = self._bucket_watch, None
        if watch is not None:
            watch.uninstall()
        native, self._native = self._native, None
        self._native_slots = {}
        self.step_cell = [0]
        if native is not None:
            with contextlib.suppress(Exception):
                native.uninstall(timeout_s=1.0)  # what completes in time reaches the trace
        waiter, self._waiter = self._waiter, None
        if waiter is not None:
            waiter.stop(timeout_s=1.0)  # the completions it has seen reach the trace
        for module, name, original in reversed(self._originals):
            setattr(module, name, original)
        self._originals.clear()
        global _active
        if _active is self:
            _active = None

    def _wrap(self, original: Callable[..., Any], call: _Call) -> Callable[..., Any]:
        recorder = self

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not recorder.enabled or _tls.depth:
                return original(*args, **kwargs)
            try:
                token = recorder._enter(call, args, kwargs)
            except Exception as exc:
                recorder.prof.hook_failed("collectives", exc)
                return original(*args, **kwargs)
            recorder._api_depth(1)
            try:
                result = original(*args, **kwargs)
            except BaseException:
                recorder._api_depth(0)
                recorder._complete(token, error=True)
                raise
            recorder._api_depth(0)
            try:
                return recorder._exit(token, call, result)
            except Exception as exc:
                recorder.prof.hook_failed("collectives", exc)
                return result

        wrapper.__wrapped__ = original  # type: ignore[attr-defined]
        wrapper.__name__ = getattr(original, "__name__", call.op)
        wrapper.__doc__ = original.__doc__
        return wrapper

    # -- per call

    def group_name(self, group: Any) -> str:
        if group is None:
            group = self._default_group or c10d._get_default_group()
        name = self._group_names.get(group)
        if name is None:
            name = str(group.group_name)
            self._group_names[group] = name
            ranks = [int(r) for r in dist.get_process_group_ranks(group)]
            backend = str(dist.get_backend(group))
            self.prof.groups.append((name, backend, ranks))
        return name

    def _enter(
        self,
        call: _Call,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        label: str | None = None,
    ) -> int:
        start = now_ns()
        group = _arg(args, kwargs, "group", call.group_idx)
        gname = self.group_name(group)
        payload = _arg(args, kwargs, call.payload, call.payload_idx)
        nbytes, dtype = _nbytes(payload)
        async_op = call.op in ("isend", "irecv") or bool(
            _arg(args, kwargs, "async_op", call.async_idx)
        )
        peer = None
        if call.peer is not None:
            peer = _arg(args, kwargs, call.peer, call.peer_idx)
            if peer is None:
                group_peer = _arg(args, kwargs, call.group_peer, call.group_peer_idx)
                if group_peer is not None:
                    peer = dist.get_global_rank(group or c10d._get_default_group(), group_peer)
        if peer is None and call.peer is not None:
            seq = -1  # receive from any source: the pair is known only afterwards
        else:
            key: Any = gname
            if peer is not None:
                src, dst = (self.rank, peer) if call.op in P2P_SEND else (peer, self.rank)
                key = (gname, src, dst)
            slot = self._native_slots.get(key) if self._native_slots else None
            if slot is None:
                seq = self._seq.get(key, 0)
                self._seq[key] = seq + 1
            else:  # a group the native kernel records on: one counter for both
                shared = self._native.native.shared
                seq = shared[1 + slot]
                shared[1 + slot] = seq + 1
        token = next(self._ids)
        self.inflight[token] = (
            self.prof.step_index,
            gname,
            seq,
            call.op,
            nbytes,
            dtype,
            peer,
            start,
            async_op,
            label,
        )
        timer = self.prof.gpu_timer
        if timer is not None and _on_cuda(payload):
            timer.settle()
            self._gpu_events[token] = timer.mark()
            if async_op and call.peer is None and self.nccl_times(group):
                self._nccl_works[token] = None  # its end: NCCL's own timing, from its Work
        return token

    def nccl_times(self, group: Any) -> bool:
        """Whether NCCL's own timing ends ``group``'s operations on CUDA tensors, turned on at
        the group's first sight where its CUDA backend is NCCL (nccl_timing.use_nccl_timing).
        Only collectives: a point-to-point operation runs on a stream of its own per peer."""
        if group is None:
            group = self._default_group or c10d._get_default_group()
        on = self._nccl_groups.get(group)
        if on is None:
            on = self._nccl_groups[group] = nccl_timing.use_nccl_timing(group)
        return on

    def _exit(self, token: int, call: _Call, result: Any) -> Any:
        record = self.inflight.get(token)
        if record is None:
            return result
        if call.op == "recv" and record[6] is None and isinstance(result, int):
            self.inflight[token] = (*record[:6], result, *record[7:])
        if not record[8] or result is None or gpu_timing.capturing():
            self._complete(token)  # (a launch into a CUDA graph's capture completes at once)
            return result
        if call.op not in self._no_future:
            try:
                future = result.get_future()
            except RuntimeError:
                self._no_future.add(call.op)
            else:
                if token in self._nccl_works:
                    self._nccl_works[token] = result
                future.then(partial(self._on_future, token))
                return result
        return _timed_work_class()(result, partial(self._complete, token))

    def _on_future(self, token: int, future: Any) -> None:
        try:
            future.value()  # completed already: raises only if the operation failed
        except Exception:
            self._complete(token, error=True)
        else:
            self._complete(token)

    def _complete(self, token: int, error: bool = False) -> None:
        end = now_ns()
        record = self.inflight.pop(token, None)
        if record is None:
            return
        label = record[9]
        if error:
            label = f"{label};error" if label else "error"
        self.out.append((*record[:7], record[7], end, record[8], label))
        if self._gpu_events:
            self._gpu_end(token, record, end, error)

    def _gpu_end(self, token: int, record: tuple[Any, ...], end: int, error: bool) -> None:
        """The GPU end of a CUDA operation: an event on the current stream, which waits for the
        operation (a synchronous call has returned, or its future's callback runs), or for an
        asynchronous collective that NCCL times, NCCL's own end (nccl_timing.NcclEnd). Until the
        GPU has passed it, the operation stays in flight: on NCCL the host is done at once,
        and a collective that hangs hangs on the GPU, where the hang watchdog and inflight.json
        must see it."""
        event = self._gpu_events.pop(token, None)
        work = self._nccl_works.pop(token, None)
        timer = self.prof.gpu_timer
        if event is None or timer is None:
            return
        if error:
            timer.release(event)
            return
        step, gname, seq, op = record[:4]
        head = (step, op, "collective", gname, seq)
        self.inflight[token] = record
        done = partial(self.inflight.pop, token, None)
        if not timer.pair(event, head, record[7], end, done, work=work):
            self.inflight.pop(token, None)

    def launched(
        self, group: Any, tensors: list[torch.Tensor], start: int, label: str, work: Any
    ) -> None:
        """An all-reduce C++ launched (DDP's reducer), seen at the dispatcher: recorded from
        ``start`` to the completion of its future. What ``_enter`` does, without the argument
        parsing: this runs for every bucket of every step."""
        gname = self.group_name(group)
        seq = self._seq.get(gname, 0)
        self._seq[gname] = seq + 1
        nbytes, dtype = _nbytes(tensors)
        token = next(self._ids)
        self.inflight[token] = (
            self.prof.step_index, gname, seq, "all_reduce", nbytes, dtype, None, start, True, label
        )  # fmt: skip
        if tensors[0].is_cuda:
            if gpu_timing.capturing():  # runs only on the graph's replays
                self._complete(token)
                return
            timer = self.prof.gpu_timer
            if timer is not None:  # the current stream, just after the launch made the
                # communication wait for it: where the bucket's gradients are ready
                self._gpu_events[token] = timer.mark()
                if self._nccl_groups.get(group):
                    self._nccl_works[token] = work
        else:
            waiter = self._waiter
            if waiter is None:
                waiter = self._waiter = _Waiter(self)
            waiter.put(token, work)
            return
        try:
            future = work.get_future()
        except RuntimeError:  # a backend without futures: the end is unknown, not the start
            self._complete(token)
        else:
            future.add_done_callback(partial(self._on_future, token))

    def bucket_all_reduce(
        self, group: Any, tensor: torch.Tensor, index: int
    ) -> torch.futures.Future[torch.Tensor]:
        """All-reduce a DDP bucket already scaled as DDP scales it, recorded as ddp.bucketN
        (the comm-hook way, where the dispatcher's cannot be used)."""
        assert self._all_reduce is not None
        call = self._all_reduce[1]
        token = None
        try:
            token = self._enter(
                call, (tensor,), {"group": group, "async_op": True}, label=f"ddp.bucket{index}"
            )
        except Exception as exc:
            self.prof.hook_failed("collectives", exc)
        # the process group's own allreduce: what dist.all_reduce ends in, minus its checks
        self._api_depth(1)
        try:
            work = group.allreduce([tensor])
        finally:
            self._api_depth(0)
        if token in self._nccl_works:
            self._nccl_works[token] = work
        return work.get_future().then(partial(self._bucket_done, token))

    def _bucket_done(self, token: int | None, future: Any) -> torch.Tensor:
        try:
            value = future.value()[0]
        except Exception:
            if token is not None:
                self._complete(token, error=True)
            raise
        if token is not None:
            self._complete(token)
        return value

    def inflight_snapshot(self) -> list[InflightOp]:
        """Operations entered and not completed, oldest first, for inflight.json (each record
        holds InflightOp's fields in order)."""
        return [InflightOp(*rec) for rec in list(self.inflight.values())]


class _Waiter:
    """A thread that waits for CPU operations launched from C++ and records their completion.

    A future callback would run on the backend's own thread (gloo's), which then waits for the
    GIL before it can go on to the next operation, and DDP's next bucket waits with it: in a
    one-process training step that costs several times the callback itself. ``Work.wait()``
    releases the GIL, so this thread holds it only to note the time. Operations are waited for
    in launch order; one that completes before an earlier one is noted when the earlier one is.
    (CUDA tensors keep the future callback: on a CUDA work, ``wait()`` would make this thread's
    stream wait.)
    """

    def __init__(self, recorder: CommRecorder) -> None:
        self._recorder = recorder
        self._queue: queue.SimpleQueue[tuple[int, Any] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="dtprof-waiter", daemon=True)
        self._thread.start()

    def put(self, token: int, work: Any) -> None:
        self._queue.put((token, work))

    def stop(self, timeout_s: float) -> None:
        """Finish what is queued (up to ``timeout_s``: a hung operation keeps the thread)."""
        self._queue.put(None)
        self._thread.join(timeout_s)

    def _run(self) -> None:
        recorder = self._recorder
        while (item := self._queue.get()) is not None:
            token, work = item
            try:
                work.wait()
            except Exception:
                recorder._complete(token, error=True)
            else:
                recorder._complete(token)


_active: CommRecorder | None = None


def is_recording() -> bool:
    """Whether a profile() in this process has the API wrapped now."""
    return _active is not None


def install(prof: Profiler) -> CommRecorder:
    """Wrap torch.distributed's API for this profiler (one at a time per process)."""
    global _active
    if _active is not None:
        raise RuntimeError("another dtprof.profile() is already recording in this process")
    recorder = CommRecorder(prof)
    recorder.install()
    _active = recorder
    return recorder


_TIMED_WORK: type | None = None


def _timed_work_class() -> type:
    """A Work that forwards to the real one and records completion when wait() returns."""
    global _TIMED_WORK
    if _TIMED_WORK is not None:
        return _TIMED_WORK

    class TimedWork(dist.Work):  # type: ignore[misc]
        def __init__(self, inner: Any, on_done: Callable[[], None]) -> None:
            super().__init__()
            self._inner = inner
            self._on_done: Callable[[], None] | None = on_done

        def wait(self, timeout: Any = None) -> bool:
            result = self._inner.wait() if timeout is None else self._inner.wait(timeout)
            if self._on_done is not None:
                self._on_done()
                self._on_done = None
            return bool(result)

        def is_completed(self) -> bool:
            return bool(self._inner.is_completed())

        def is_success(self) -> bool:
            return bool(self._inner.is_success())

        def exception(self) -> Any:
            return self._inner.exception()

        def source_rank(self) -> int:
            return int(self._inner.source_rank())

        def result(self) -> Any:
            return self._inner.result()

        def synchronize(self) -> Any:
            return self._inner.synchronize()

        def get_future(self) -> Any:
            return self._inner.get_future()

    _TIMED_WORK = TimedWork
    return TimedWork
