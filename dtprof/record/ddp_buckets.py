"""DDP's gradient buckets, seen where DDP's reducer hands them to the process group.

DDP reduces its buckets from C++, out of reach of the wrapped Python API. Every process-group
call passes through torch's dispatcher as an operator, DDP's bucket all-reduces as
``c10d::allreduce_``, so while a profile records, dtprof registers a Python kernel for that
operator under the autograd keys (CPU and CUDA). The kernel notes the time, passes the call
down unchanged to the backend's own kernel, and records the completion in a callback on the
operation's future. Nothing of DDP changes: no comm hook, DDP's own fused scaling and its C++
reduction, a comm hook of the user's own still works, and the kernel is gone when the profile
exits.

Calls made through the wrapped Python API are recorded there and pass through here untouched.
Of the others, only those on the process group of a DDP model given to ``profile()`` are
recorded: floating-point ones as ``ddp.bucketN``, N counting them within one backward pass
(DDP launches its buckets in index order), and the integer map of used parameters that DDP
reduces under ``find_unused_parameters`` as ``ddp.used_parameters``.

Where it is built (``dtprof build-native``), the same kernel in C++ (:class:`NativeBuckets`,
``native/buckets.cpp``) does this with no Python on a bucket's path: the Python kernel costs
a few hundred µs per step of a small DDP model (benchmarks/overhead.py), the native one about
nothing measurable. On a CUDA job each bucket is also timed on the GPU (dtprof.record.
gpu_timing) by whichever kernel records it, the native one with c10 events of its own that
sync() reads back; on NCCL, a bucket's end comes from NCCL's own timing. Where neither kernel
can be registered (a torch without these operators, or a kernel of someone else's there) or
would not see the buckets (parameters on a device other than CPU and CUDA), ``ddp_hook``
records them through a comm hook instead.
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from dtprof.record import comms
from dtprof.record.gpu_timing import ANCHOR_EVERY_S
from dtprof.record.native import FIELDS
from dtprof.trace import live

if TYPE_CHECKING:
    from dtprof.record.comms import CommRecorder
    from dtprof.record.native import Native

KEYS = ("AutogradCPU", "AutogradCUDA")


class BucketWatch:
    """The dispatcher kernel for ``c10d::allreduce_`` and the DDP groups it records."""

    def __init__(self, recorder: CommRecorder) -> None:
        self.recorder = recorder
        self.enabled = True
        # watched group -> [backward pass (graph task id) of the last bucket, next bucket index]
        self._groups: dict[Any, list[int]] = {}
        self._lib: Any = None
        op = torch.ops.c10d.allreduce_.default
        handle = getattr(op, "_handle", None)  # one Python frame less per call where it exists
        self._redispatch = handle.redispatch_boxed if handle is not None else op.redispatch
        self._below_autograd = torch._C._after_autograd_keyset
        self._unbox_group = dist.ProcessGroup.unbox
        self._unbox_work = dist.Work.unbox
        self._graph_task = torch._C._current_graph_task_id

    def watch(self, model: torch.nn.parallel.DistributedDataParallel) -> None:
        """Record the buckets of ``model``'s group; raises where the kernel cannot be registered
        or would not see them (parameters on a device other than CPU and CUDA)."""
        group = ddp_group(model)
        if self._lib is None:
            lib = torch.library.Library("c10d", "IMPL")
            try:
                for key in KEYS:
                    lib.impl("allreduce_", self._kernel, key, with_keyset=True)
            except BaseException:
                lib._destroy()
                raise
            self._lib = lib
        self._groups.setdefault(group, [-2, 0])
        if self.recorder.prof.gpu_timer is not None and on_cuda(model):
            self.recorder.nccl_times(group)  # before its first bucket

    def uninstall(self) -> None:
        self.enabled = False
        lib, self._lib = self._lib, None
        if lib is not None:
            lib._destroy()
        self._groups.clear()

    def _kernel(self, keyset: Any, tensors: list[torch.Tensor], group: Any, *rest: Any) -> Any:
        start = comms.now_ns()
        out = self._redispatch(keyset & self._below_autograd, tensors, group, *rest)
        if self.enabled and not comms._tls.depth:
            try:
                self._seen(start, tensors, group, out[1])
            except Exception as exc:
                self.enabled = False  # the registration stays until exit: passing through
                self.recorder.prof.hook_failed("ddp buckets", exc)
        return out

    def _seen(self, start: int, tensors: list[torch.Tensor], boxed_group: Any, work: Any) -> None:
        group = self._unbox_group(boxed_group)
        watched = self._groups.get(group)
        if watched is None or not tensors:
            return
        first = tensors[0]
        floating = first.is_floating_point() or first.is_complex()
        label = bucket_label(watched, floating, self._graph_task() if floating else -1)
        self.recorder.launched(group, tensors, start, label, self._unbox_work(work))


def bucket_label(count: list[int], floating: bool, task: int) -> str:
    """The label of a call DDP launched on a watched group, in launch order: floating-point
    ones are ``ddp.bucketN``, N counting from 0 within each backward pass (autograd graph task
    ``task``; ``count`` is the group's [graph task of the last bucket, next index], updated),
    the integer map of used parameters ``ddp.used_parameters``."""
    if not floating:
        return bucket_name(-1)
    if task != count[0]:
        count[0], count[1] = task, 0
    count[1] += 1
    return bucket_name(count[1] - 1)


def bucket_name(bucket: int) -> str:
    """A call's label from its bucket's index (-1: DDP's map of used parameters)."""
    return f"ddp.bucket{bucket}" if bucket >= 0 else "ddp.used_parameters"


def on_cuda(model: torch.nn.Module) -> bool:
    return any(p.is_cuda for p in model.parameters())


def ddp_group(model: torch.nn.parallel.DistributedDataParallel) -> Any:
    """The process group of ``model``'s buckets; raises where a kernel under the CPU and CUDA
    autograd keys would not see them."""
    devices = {p.device.type for p in model.parameters()}
    if not devices <= {"cpu", "cuda"}:
        on = ", ".join(sorted(devices))
        raise RuntimeError(f"parameters on {on}: the kernel is for cpu, cuda")
    group = model.process_group
    return c10d._get_default_group() if group is None else group


class NativeBuckets:
    """The C++ kernel (``native/buckets.cpp``): what BucketWatch records, with no Python on a
    bucket's path. Its records reach the trace when :meth:`sync` drains them, on the writer's
    tick and at the end; operations still in flight then are in the recorder's in-flight
    table (inflight.json, the hang watchdog) until they complete."""

    def __init__(self, recorder: CommRecorder, native: Native) -> None:
        self.recorder = recorder
        self.native = native
        self.ops = native.ops
        self.take = native.take_buckets
        self.enabled = True
        self.in_flight = 0  # records in flight at the last sync
        self.names: dict[int, str] = {}  # slot -> group name
        self._in_flight_keys: list[int] = []  # the recorder's in-flight keys of the last sync
        self._installed = False
        self._gpu: int | None = None  # the CUDA device whose buckets are timed on the GPU
        self._next_anchor_ns = 0

    def watch(self, model: torch.nn.parallel.DistributedDataParallel) -> None:
        group = ddp_group(model)
        if not self._installed:
            self.ops.install()
            self._installed = True
        slot = int(self.ops.watch(group.boxed()))
        if self.recorder.prof.gpu_timer is not None and on_cuda(model):
            if self._gpu is None:
                device = next(p.device for p in model.parameters() if p.is_cuda)
                self._gpu = int(device.index or 0)
                self._anchor()
                self.ops.set_gpu_timing(True)
            self.ops.use_nccl_timing(slot)
        name = self.recorder.group_name(group)
        if slot not in self.names:
            # the group's sequence numbers go on from where Python's count is
            self.native.shared[1 + slot] = self.recorder.take_native_seq(name, slot)
            self.names[slot] = name

    def uninstall(self, timeout_s: float = 1.0) -> None:
        """Deregister the kernel, wait up to ``timeout_s`` for what is in flight, drain."""
        if not self._installed:
            return
        self._installed = False
        self.ops.set_gpu_timing(False)
        self.ops.uninstall()
        deadline = comms.now_ns() + int(timeout_s * 1e9)
        self.sync()
        while self.enabled and self.in_flight and comms.now_ns() < deadline:
            time.sleep(0.005)
            self.sync()  # a bucket timed on the GPU is done once drained
        if self._gpu is not None:
            self.ops.release_gpu()  # what the GPU never passed: done, without its times
            self.sync()

    def sync(self) -> None:
        """Completed records into the trace; those in flight into the in-flight table."""
        if not self.enabled:
            return
        try:
            if self._gpu is not None and comms.now_ns() > self._next_anchor_ns:
                self._anchor()
            failure, done_bytes, pending = self.take()
            if failure:
                raise RuntimeError(failure)
            done = np.frombuffer(done_bytes, np.int64).reshape(-1, FIELDS)
            self.in_flight = len(pending)
            rec = self.recorder
            for key in self._in_flight_keys:
                rec.inflight.pop(key, None)
            self._in_flight_keys = [-1 - row[0] for row in pending]
            for key, row in zip(self._in_flight_keys, pending, strict=True):
                rec.inflight[key] = self._in_flight(row)
            rec.prof.writer.add_frame("collectives", len(done), self._frame(done))
            if self._gpu is not None:
                self._gpu_rows(done)
        except Exception as exc:
            self.enabled = False
            with contextlib.suppress(Exception):
                self.ops.uninstall()  # training goes on without the kernel
            self.recorder.prof.hook_failed("ddp buckets", exc)

    def _anchor(self) -> None:
        """A new anchor for the GPU times (every gpu_timing.ANCHOR_EVERY_S)."""
        error = int(self.ops.anchor(self._gpu))
        self._next_anchor_ns = comms.now_ns() + int(ANCHOR_EVERY_S * 1e9)
        timer = self.recorder.prof.gpu_timer
        if timer is not None:
            timer.anchor_error_ns = max(timer.anchor_error_ns, error)

    def _gpu_rows(self, done: np.ndarray) -> None:
        """The GPU's times of the drained buckets that have them, into gpu_spans."""
        prof = self.recorder.prof
        timed = done[done[:, GPU_START] >= 0].tolist()
        for row in timed:
            _rid, slot, seq, step, start, end = row[:6]
            gpu_start, gpu_end = row[GPU_START], row[GPU_END]
            name = self.names[slot]
            prof.gpu_spans.append(
                (step, "all_reduce", "collective", name, seq, start, end, gpu_start, gpu_end)
            )
        timer = prof.gpu_timer
        if timer is not None:
            timer.timed += len(timed)
            timer.dropped_native = int(self.ops.gpu_dropped())

    def _frame(self, done: np.ndarray) -> bytes:
        """Completed records (rows of FIELDS numbers) as a frame of the collectives table."""
        groups = [self.names.get(slot) for slot in range(int(done[:, SLOT].max(initial=0)) + 1)]
        dtypes = done[:, DTYPE]  # torch's numbers of dtypes: the codes, with a name for each seen
        dtype_names: list[str | None] = [None] * (int(dtypes.max(initial=-1)) + 1)
        for dtype in np.flatnonzero(np.bincount(dtypes)):
            dtype_names[dtype] = self.native.dtype_name(int(dtype))
        plan = live.plan(
            live.from_rows(STEP, "<i8"),
            live.coded_from_rows(SLOT, groups),
            live.from_rows(SEQ, "<i8"),
            live.constant("all_reduce"),
            live.from_rows(NBYTES, "<i8"),
            live.coded_from_rows(DTYPE, dtype_names),
            live.encoded(None),  # peer
            live.from_rows(START, "<i8"),
            live.from_rows(END, "<i8"),
            live.constant(True),  # async_op
            live.encoded(_labels(done[:, BUCKET], done[:, ERROR])),
        )
        return self.native.frame_of(done, plan)

    def _in_flight(self, row: tuple[int, ...]) -> tuple[Any, ...]:
        """A record in flight as the recorder's in-flight table holds one (no end)."""
        step, start, nbytes = row[STEP], row[START], row[NBYTES]
        label = bucket_name(row[BUCKET])
        name, dtype_name = self.names[row[SLOT]], self.native.dtype_name(row[DTYPE])
        return (step, name, row[SEQ], "all_reduce", nbytes, dtype_name, None, start, True, label)


# a record's fields (buckets.cpp's Record), by column
ID, SLOT, SEQ, STEP, START, END, NBYTES, DTYPE, FLOATING, BUCKET, ERROR, GPU_START, GPU_END = range(
    FIELDS
)


def _labels(buckets: np.ndarray, errors: np.ndarray) -> dict[str, Any]:
    """The label column of records with these bucket indices (-1: the map of used
    parameters) and errors: ``ddp.bucketN`` or ``ddp.used_parameters``, ``;error`` after an
    operation that failed."""
    plain = [bucket_name(b) for b in range(-1, int(buckets.max(initial=-1)) + 1)]
    codes = buckets + 1 + np.where(errors != 0, len(plain), 0)
    return live.coded(codes, plain + [f"{name};error" for name in plain])
