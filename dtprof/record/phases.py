"""Phase hooks: forward, backward, optimizer and the data wait between steps.

forward: the root module's forward, timed by a wrapper set as the model's own ``forward``
(TimedForward, below). backward: from the moment
the gradient reaches the model's output (a hook on the autograd node that made it) to the end
of the autograd pass (a callback queued on the autograd engine), before DDP waits for its last
bucket. Where the native kernel is loaded, that hook and callback are its C++ ones
(dtprof/record/native/backward.cpp): no Python runs in the pass, and the finished passes are
read from the kernel's memory by dtprof's writer thread, at each tick and at the end (their
rows reach the trace up to a flush later than the step's others).
optimizer: its step pre- and post-hooks, or from where the step's closure returned (Lightning,
LBFGS: the closure runs forward and backward inside the step). data: from the end of a step to
the next forward.

On a CUDA job the same moments also record CUDA events (dtprof.record.gpu_timing): forward,
backward and optimizer get their GPU execution times too. Data has none: it is the host's wait.
"""

from __future__ import annotations

import copy
import ctypes
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._pytree import tree_leaves

from dtprof.record import ddp_hook
from dtprof.record.native import int64s
from dtprof.record.throughput import StepWork

if TYPE_CHECKING:
    from dtprof.record.gpu_timing import GpuTimer
    from dtprof.record.native import Native
    from dtprof.record.profiler import Profiler

now_ns = time.perf_counter_ns


def model_kind(model: torch.nn.Module | None) -> str:
    """ddp, fsdp2, module or none: tells the analyzer which ranks should hold equal params."""
    if model is None:
        return "none"
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return "ddp"
    if any(type(m).__name__.startswith("FSDP") for m in model.modules()):
        return "fsdp2"
    return "module"


class PhaseHooks:
    """The phase hooks of a model and an optimizer, each added when known (add_model,
    add_optimizer); uninstall() removes them."""

    def __init__(self, prof: Profiler) -> None:
        self.prof = prof
        self.spans = prof.spans
        self.data_from_ns: int | None = None
        self._fwd_start = 0
        self._bwd_start: int | None = None
        self._opt_start = 0
        self._fwd_event: Any = None  # the CUDA events where the open phases began
        self._bwd_event: Any = None
        self._opt_event: Any = None
        self._handles: list[Any] = []
        self._timed_forwards: list[TimedForward] = []
        self.native_passes: NativePasses | None = None  # the backward timed in C++
        self.ddp_buckets = False
        self.work = StepWork(prof)  # the samples, tokens and FLOPs the forward passes see

    def add_model(self, model: torch.nn.Module) -> None:
        self._time_backward_natively()
        if not any(timed.module is model for timed in self._timed_forwards):
            self._timed_forwards.append(TimedForward(self, model))
        if isinstance(model, torch.nn.parallel.DistributedDataParallel) and self.prof.ddp_buckets:
            self._register_ddp_hook(model)

    def add_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        self._handles.append(optimizer.register_step_pre_hook(self._optimizer_pre))
        self._handles.append(optimizer.register_step_post_hook(self._optimizer_post))

    def _time_backward_natively(self) -> None:
        """Time the backward phase with the native kernel's hook where it loads (not on CUDA,
        where the Python hook also records CUDA events); say which way in meta.json."""
        if self.native_passes is not None:
            return
        if self.prof.gpu_timer is not None:
            self.prof.note_meta(backward_timing="python (on CUDA: with CUDA events)")
            return
        from dtprof.record import native as native_kernel

        native, why_not = native_kernel.load()
        if native is not None:
            try:
                self.native_passes = NativePasses(native)
            except Exception as exc:
                why_not = f"unavailable: {exc}".splitlines()[0]
        self.prof.note_meta(backward_timing=f"python ({why_not})" if why_not else "native")

    def _register_ddp_hook(self, model: torch.nn.parallel.DistributedDataParallel) -> None:
        if getattr(model, "_dtprof_comm_hook", False):  # an earlier profile's comm hook
            self.ddp_buckets = True
            self.prof.note_meta(ddp_buckets_via="comm_hook")
            return
        if self.prof.ddp_buckets != "comm_hook":
            from dtprof.record import native as native_kernel

            native, why_not = native_kernel.load()
            if why_not:
                self.prof.note_meta(ddp_buckets_native=why_not)
            try:
                kernel = self.prof.comms.watch_ddp(model, native)
            except Exception as exc:
                why = f"unavailable: {exc}".splitlines()[0]
                self.prof.note_meta(ddp_buckets_dispatcher=why)
            else:
                self.ddp_buckets = True
                self.prof.note_meta(ddp_buckets_via="dispatcher", ddp_buckets_kernel=kernel)
                return
        try:
            ddp_hook.install(model)
        except Exception as exc:
            # A comm hook of the user's own: keep it. Its collectives are still recorded
            # if it calls torch.distributed's Python API.
            self.prof.note_meta(ddp_buckets=f"not labelled: {exc}".splitlines()[0])
            return
        setattr(model, "_dtprof_comm_hook", True)  # noqa: B010 (nn.Module typing)
        self.ddp_buckets = True
        self.prof.note_meta(ddp_buckets_via="comm_hook")

    def uninstall(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        for timed in self._timed_forwards:
            timed.release()
        self._timed_forwards.clear()
        self.work.close()
        passes = self.native_passes
        if passes is not None:
            passes.take(self.spans)
            if passes.lost:
                self.prof.note_meta(
                    backward_timing=f"native ({passes.lost} passes lost: more than "
                    f"{passes.RING - 1} between two of the writer's ticks)"
                )

    def take_native_passes(self) -> None:
        """The backward passes the native kernel finished since the last take, into the trace
        (on the writer thread, at each tick)."""
        if self.native_passes is not None:
            self.native_passes.take(self.spans)

    def forward_begins(self, module: torch.nn.Module, args: Any, kwargs: Any) -> None:
        t = now_ns()
        try:
            if self.data_from_ns is not None:
                self.spans.append(
                    (self.prof.step_index, "data", "phase", self.data_from_ns, t, 0, None, None)
                )
                self.data_from_ns = None
            self._fwd_start = t
            timer = self.prof.gpu_timer
            if timer is not None:
                self._fwd_event = timer.mark()
            self.work.forward_begins(module, args, kwargs)
        except Exception as exc:
            self.prof.hook_failed("phases", exc)

    def forward_ends(self, output: Any) -> None:
        t = now_ns()
        try:
            if self.work.counter is not None:
                self.work.forward_ends()
            self._phase_ends("forward", self._fwd_start, t, self._fwd_event)
            self._fwd_event = None
            if torch.is_grad_enabled():
                if self._bwd_start is not None and not _in_backward():
                    self._forget_open_backward()
                # a hook on the node that makes each output: called as its gradient arrives
                native = self.native_passes if self.prof.gpu_timer is None else None
                step = self.prof.step_index
                leaves = (output,) if isinstance(output, torch.Tensor) else tree_leaves(output)
                for leaf in leaves:
                    if isinstance(leaf, torch.Tensor) and leaf.requires_grad:
                        if native is not None and native.watch(leaf._cdata, step):
                            continue
                        node = leaf.grad_fn
                        if node is not None:
                            node.register_prehook(self._backward_begins)
                        else:  # a leaf tensor: no node made it
                            leaf.register_hook(self._backward_begins)
        except Exception as exc:
            self.prof.hook_failed("phases", exc)

    def _backward_begins(self, grad: Any) -> None:
        try:
            if self._bwd_start is None:
                self._bwd_start = now_ns()
                timer = self.prof.gpu_timer
                self._bwd_event = timer.mark() if timer is not None else None
                torch.autograd.Variable._execution_engine.queue_callback(self._backward_ends)
        except Exception as exc:
            self.prof.hook_failed("phases", exc)

    def _forget_open_backward(self) -> None:
        """A backward pass that raised never reached its end: without this, no later pass would
        be timed (each waits for the open one to end)."""
        self._bwd_start = None
        timer = self.prof.gpu_timer
        if timer is not None:
            timer.release(self._bwd_event)
        self._bwd_event = None

    def _backward_ends(self) -> None:
        t = now_ns()
        try:
            start, self._bwd_start = self._bwd_start, None
            if start is not None:
                self._phase_ends("backward", start, t, self._bwd_event)
                self._bwd_event = None
        except Exception as exc:
            self.prof.hook_failed("phases", exc)

    def _optimizer_pre(self, optimizer: Any, args: Any, kwargs: Any) -> Any:
        self._opt_start = now_ns()
        try:
            timer = self.prof.gpu_timer
            if timer is not None:
                self._mark_optimizer(timer)
            if args or kwargs:  # perhaps a closure
                return self._time_closure(args, kwargs)
        except Exception as exc:
            self.prof.hook_failed("phases", exc)
        return None

    def _time_closure(self, args: Any, kwargs: Any) -> Any:
        """Where the step is given a closure (Lightning, LBFGS), which runs forward and backward
        inside it, the optimizer's own phase starts when the closure returned: the closure is
        handed on timed (None: the step's arguments unchanged)."""
        by_name = "closure" in kwargs
        closure = kwargs["closure"] if by_name else (args[0] if args else None)
        if not callable(closure):
            return None

        def timed_closure() -> Any:
            try:
                return closure()
            finally:
                self._opt_start = now_ns()
                timer = self.prof.gpu_timer
                if timer is not None:
                    self._mark_optimizer(timer)

        if by_name:
            return args, {**kwargs, "closure": timed_closure}
        return (timed_closure, *args[1:]), kwargs

    def _mark_optimizer(self, timer: GpuTimer) -> None:
        """Where the optimizer's phase begins on the GPU (a closure's start replaces the
        step's)."""
        timer.release(self._opt_event)
        self._opt_event = timer.mark()

    def _optimizer_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        t = now_ns()
        try:
            self._phase_ends("optimizer", self._opt_start, t, self._opt_event)
            self._opt_event = None
        except Exception as exc:
            self.prof.hook_failed("phases", exc)

    def _phase_ends(self, name: str, start: int, end: int, event: Any) -> None:
        """A phase's span, and on a CUDA job its GPU time (``event``: where it began there)."""
        step = self.prof.step_index
        self.spans.append((step, name, "phase", start, end, 0, None, None))
        timer = self.prof.gpu_timer
        if timer is not None:
            timer.pair(event, (step, name, "phase", None, None), start, end)


class TimedForward:
    """The recorded model's forward, timed: set as the model's own ``forward`` (an attribute
    of the instance), which ``nn.Module.__call__`` calls in place of its class's.

    Forward hooks would see the same moments, but a module with hooks takes the slow path of
    ``nn.Module.__call__``: about 17 µs a call on this machine whatever the hooks do, against
    about 4 for this wrapper (benchmarks/hook_time.py). The module's own hooks (FSDP's, the
    script's) run outside it, as they run outside the module's forward.

    ``__wrapped__`` is the forward it times, so that ``inspect.signature(model.forward)`` gives
    the model's own (Hugging Face's Trainer keeps the dataset columns it names). A copy of the
    model (``copy.deepcopy``: an EMA model) and the model pickled (``torch.save(model)``) get
    that forward, untimed: a copy's passes are not the model's phases."""

    __slots__ = ("__wrapped__", "had_own", "hooks", "module")

    def __init__(self, hooks: PhaseHooks, module: torch.nn.Module) -> None:
        self.hooks: PhaseHooks | None = hooks
        self.module = module
        self.had_own = "forward" in vars(module)  # a forward of the instance's (Accelerate's)
        self.__wrapped__ = module.forward
        vars(module)["forward"] = self

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        hooks = self.hooks
        if hooks is None:  # released, but something wrapped it since and still calls it
            return self.__wrapped__(*args, **kwargs)
        hooks.forward_begins(self.module, args, kwargs)
        output = self.__wrapped__(*args, **kwargs)
        if self.hooks is not None:  # not switched off by a failure in forward_begins
            hooks.forward_ends(output)
        return output

    def __reduce__(self) -> tuple[Any, tuple[Any]]:
        # copy.copy of the wrapped forward, so that loading a pickle needs no dtprof; a deep
        # copy copies its argument first: the copy's forward is bound to the copied module
        return copy.copy, (self.__wrapped__,)

    def release(self) -> None:
        """Give the module back the forward it had (where something has wrapped this one
        since, it stays, untimed)."""
        self.hooks = None
        if vars(self.module).get("forward") is self:
            if self.had_own:
                vars(self.module)["forward"] = self.__wrapped__
            else:
                del vars(self.module)["forward"]


def _in_backward() -> bool:
    """Whether this thread is inside a backward pass (a forward recomputed for activation
    checkpointing): False where torch cannot say."""
    task_id = getattr(torch._C, "_current_graph_task_id", None)
    return task_id is not None and task_id() != -1


class NativePasses:
    """The backward passes the native kernel times: its hook on an output's autograd node
    (``watch``), and the ring of finished passes it writes in its memory (``take``)."""

    RING = 16384  # kRing in backward.cpp: passes between two takes before any is lost

    def __init__(self, native: Native) -> None:
        lib = native.lib
        lib.dtprof_backward_watcher.restype = ctypes.py_object
        # watch(tensor._cdata, step) -> bool: time the pass that reaches the tensor's node as
        # step ``step``'s backward; False where the kernel cannot (a tensor no node made). The
        # kernel's builtin itself: a Python method around it would cost more than it does.
        self.watch = lib.dtprof_backward_watcher()
        lib.dtprof_backward_ring.restype = ctypes.c_int64
        self._ring = int64s(lib.dtprof_backward_ring(), 1 + 3 * self.RING)
        lib.dtprof_backward_written.restype = ctypes.c_int64
        self._written = lib.dtprof_backward_written  # the count, after which the rows are whole
        self._read = self._written()  # the passes written before this profile are not its own
        self.lost = 0  # passes overwritten before they were read
        self._lock = threading.Lock()  # the writer's tick and the profile's end both take

    def take(self, spans: deque[tuple[Any, ...]]) -> None:
        """The passes finished since the last take, as backward spans."""
        ring = self._ring
        with self._lock:
            written, read = self._written(), self._read
            if written == read:
                return
            if written - read >= self.RING:  # the oldest may be being written over
                self.lost += written - read - self.RING + 1
                read = written - self.RING + 1
            for i in range(read, written):
                at = 1 + 3 * (i % self.RING)
                row = (ring[at], "backward", "phase", ring[at + 1], ring[at + 2], 0, None, None)
                spans.append(row)
            self._read = written
