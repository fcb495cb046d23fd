"""Phase hooks: forward, backward, optimizer and the data wait between steps.

forward: the root module's forward, timed by a wrapper set as the model's own ``forward``
(TimedForward, below). backward: from the moment the gradient reaches the model's output (a
hook on the autograd node that made it) to the end of the autograd pass (a callback queued on
the autograd engine), before DDP waits for its last bucket. optimizer: its step pre- and
post-hooks, or from where the step's closure returned (Lightning, LBFGS: the closure runs
forward and backward inside the step). data: from the end of a step to the next forward.

Where the native kernel is loaded, the wrapper, the hooks and the callback are its C++ ones
(dtprof/record/native/phases.cpp, NativePhases below): no Python runs on the step's path in the
common case, and the spans are read from the kernel's memory by dtprof's writer thread, at each
tick and at the end (their rows reach the trace up to a flush later than the step's others).
What the kernel does not do itself it hands to the Python methods here: the work of a pass
whose input is not a plain tensor, or while FLOPs are counted (StepWork), an output that is
not a plain tensor (watch_output), a step given a closure (closure_given).

On a CUDA job the same moments also record CUDA events (dtprof.record.gpu_timing): forward,
backward and optimizer get their GPU execution times too; those hooks are the Python ones. Data
has none: it is the host's wait.
"""

from __future__ import annotations

import copy
import ctypes
import threading
import time
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils._pytree import tree_leaves

from dtprof.record import ddp_hook
from dtprof.record.memory import RSS_METRIC
from dtprof.record.native import (
    DATA_FROM,
    OPTIMIZER_FROM,
    PHASE_FIELDS,
    STEP,
    int64s,
)
from dtprof.record.throughput import StepWork
from dtprof.trace import live

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
    add_optimizer); uninstall() removes them. Natively (``native``, where the kernel loads and
    the job has no CUDA-event timing) or in Python, chosen when made."""

    def __init__(self, prof: Profiler) -> None:
        self.prof = prof
        self.spans = prof.spans
        self.data_from_ns: int | None = None  # in Python; natively, the kernel's DATA_FROM
        self._fwd_start = 0
        self._bwd_start: int | None = None
        self._opt_start = 0
        self._fwd_event: Any = None  # the CUDA events where the open phases began
        self._bwd_event: Any = None
        self._opt_event: Any = None
        self._handles: list[Any] = []
        self._timed_forwards: list[Any] = []  # TimedForward, or the kernel's ForwardTimer
        self.ddp_buckets = False
        self.native = self._native_phases()  # the phases timed in C++, or None
        self.work = StepWork(prof, self.native)
        # step_ends(step, data_from): the profiler's call at each step's end, after which
        # ``step + 1`` is in progress, its data phase from data_from (-1: none): the kernel's
        # builtin where it times the phases (no Python frame), else Python's
        self.step_ends = self.native.step_ends if self.native is not None else self._step_ends

    def _native_phases(self) -> NativePhases | None:
        """The native kernel's phases where it loads (not on CUDA, where the Python hooks also
        record CUDA events); says which way in meta.json."""
        if self.prof.gpu_timer is not None:
            self.prof.note_meta(phase_timing="python (on CUDA: with CUDA events)")
            return None
        from dtprof.record import native as native_kernel

        native, why_not = native_kernel.load()
        phases = None
        if native is not None:
            try:
                phases = NativePhases(native, self.prof.step_index)
            except Exception as exc:
                why_not = f"unavailable: {exc}".splitlines()[0]
        self.prof.note_meta(phase_timing=f"python ({why_not})" if why_not else "native")
        return phases

    def add_model(self, model: torch.nn.Module) -> None:
        if not any(timed.module is model for timed in self._timed_forwards):
            self._timed_forwards.append(time_forward(self, model))
        if isinstance(model, torch.nn.parallel.DistributedDataParallel) and self.prof.ddp_buckets:
            self._register_ddp_hook(model)

    def add_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        native = self.native
        if native is not None:
            pre, post = native.optimizer_hooks(self.closure_given)
        else:
            pre, post = self._optimizer_pre, self._optimizer_post
        self._handles.append(optimizer.register_step_pre_hook(pre))
        self._handles.append(optimizer.register_step_post_hook(post))

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
            release_forward(timed)
        self._timed_forwards.clear()
        self.work.close()
        self.take_ended()
        native = self.native
        if native is not None and native.lost:
            self.prof.note_meta(
                phase_timing=f"native ({native.lost} rows lost: more than "
                f"{native.RING - 1} spans or steps between two of the writer's ticks)"
            )

    def take_ended(self) -> None:
        """What the steps that ended since the last take left for the trace: the native
        kernel's spans and steps, and the steps' counts (StepWork logs them). On the writer
        thread at each tick, and at the end."""
        native = self.native
        try:
            if native is not None:
                self.work.steps_counted(native.take(self.prof))
            else:
                self.work.log_ended()
        except Exception as exc:
            self.prof.hook_failed("phases", exc)

    def _step_ends(self, step: int, data_from_ns: int) -> None:
        """step_ends in Python: the step's work logged (StepWork), the next one's data phase."""
        try:
            self.work.step_ends(step)
        except Exception as exc:
            self.prof.hook_failed("phases", exc)
        self.data_from_ns = data_from_ns

    def data_phase_from(self, start_ns: int | None) -> None:
        """The data phase of the step in progress began at ``start_ns`` (None: it has none:
        its first forward comes before anything is timed)."""
        if self.native is not None:
            self.native.state[DATA_FROM] = -1 if start_ns is None else start_ns
        else:
            self.data_from_ns = start_ns

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
                self.watch_output(output, self.prof.step_index)
        except Exception as exc:
            self.prof.hook_failed("phases", exc)

    def watch_output(self, output: Any, step: int) -> None:
        """Time the backward pass from where the gradient reaches ``output``: a hook on the
        autograd node that made each of its tensors (natively where the kernel can), called as
        its gradient arrives."""
        if self._bwd_start is not None and not _in_backward():
            self._forget_open_backward()
        native = self.native
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

    def native_failed(self, exc: BaseException) -> None:
        """The native forward's hand-off to Python raised: the phases are switched off."""
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
            if len(args) > 1 or kwargs:  # given more than the optimizer: perhaps a closure
                return self._time_closure(args, kwargs)
        except Exception as exc:
            self.prof.hook_failed("phases", exc)
        return None

    def closure_given(self, args: Any, kwargs: Any) -> Any:
        """The native optimizer pre-hook's hand-off of a step given more than the optimizer
        (perhaps a closure): what _time_closure returns."""
        try:
            return self._time_closure(args, kwargs)
        except Exception as exc:
            self.prof.hook_failed("phases", exc)
        return None

    def _time_closure(self, args: Any, kwargs: Any) -> Any:
        """Where the step is given a closure (Lightning, LBFGS), which runs forward and backward
        inside it, the optimizer's own phase starts when the closure returned: the closure is
        handed on timed (None: the step's arguments unchanged). ``args`` are the step's, the
        optimizer first, as torch hands them to its step hooks."""
        by_name = "closure" in kwargs
        closure = kwargs["closure"] if by_name else (args[1] if len(args) > 1 else None)
        if not callable(closure):
            return None
        native = self.native

        def timed_closure() -> Any:
            try:
                return closure()
            finally:
                if native is not None:
                    native.state[OPTIMIZER_FROM] = now_ns()
                else:
                    self._opt_start = now_ns()
                    timer = self.prof.gpu_timer
                    if timer is not None:
                        self._mark_optimizer(timer)

        if by_name:
            return args, {**kwargs, "closure": timed_closure}
        return (args[0], timed_closure, *args[2:]), kwargs

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


def time_forward(hooks: PhaseHooks, module: torch.nn.Module) -> Any:
    """Time ``module``'s forward: its wrapper (the kernel's ForwardTimer where the phases are
    native, else a TimedForward) set as its own ``forward``, which release_forward() takes
    back."""
    had_own = "forward" in vars(module)  # a forward of the instance's (Accelerate's)
    kind = TimedForward if hooks.native is None else hooks.native.ForwardTimer
    timed = kind(hooks, module, module.forward)
    timed.had_own = had_own
    vars(module)["forward"] = timed
    return timed


def release_forward(timed: Any) -> None:
    """Give the module back the forward it had before time_forward() (where something has
    wrapped the timed one since, it stays, untimed)."""
    timed.hooks = None
    module = timed.module
    if vars(module).get("forward") is timed:
        if timed.had_own:
            vars(module)["forward"] = timed.__wrapped__
        else:
            del vars(module)["forward"]


class TimedForward:
    """The recorded model's forward, timed: set as the model's own ``forward`` (an attribute
    of the instance, by time_forward), which ``nn.Module.__call__`` calls in place of its
    class's. The kernel's ForwardTimer (dtprof/record/native/phases.cpp) is its native form.

    Forward hooks would see the same moments, but a module with hooks takes the slow path of
    ``nn.Module.__call__``: about 17 µs a call on this machine whatever the hooks do, against
    about 4 for this wrapper (benchmarks/hook_time.py). The module's own hooks (FSDP's, the
    script's) run outside it, as they run outside the module's forward.

    ``__wrapped__`` is the forward it times, so that ``inspect.signature(model.forward)`` gives
    the model's own (Hugging Face's Trainer keeps the dataset columns it names). A copy of the
    model (``copy.deepcopy``: an EMA model) and the model pickled (``torch.save(model)``) get
    that forward, untimed: a copy's passes are not the model's phases."""

    __slots__ = ("__wrapped__", "had_own", "hooks", "module")

    def __init__(self, hooks: PhaseHooks, module: torch.nn.Module, wrapped: Any) -> None:
        self.hooks: PhaseHooks | None = hooks
        self.module = module
        self.had_own = False  # whether the module had a forward of its own (time_forward)
        self.__wrapped__ = wrapped

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


def _in_backward() -> bool:
    """Whether this thread is inside a backward pass (a forward recomputed for activation
    checkpointing): False where torch cannot say."""
    task_id = getattr(torch._C, "_current_graph_task_id", None)
    return task_id is not None and task_id() != -1


PHASES = ["data", "forward", "backward", "optimizer"]  # the kernel's phase codes (Phase)

# the frames the kernel's rings make, by table (dtprof.trace.live's plans): a step's row
# (step, start, end), an RSS reading (step, time, bytes), a phase's span (step, phase, start,
# end), as the tables hold them
RING_PLANS = {
    "steps": live.plan(*(live.from_rows(i, "<i8") for i in range(3))),
    "samples": live.plan(
        live.from_rows(0, "<i8"),
        live.from_rows(1, "<i8"),
        live.constant(RSS_METRIC),
        live.from_rows(2, "<f8"),
    ),
    "spans": live.plan(
        live.from_rows(0, "<i8"),  # step
        live.coded_from_rows(1, PHASES),  # name
        live.constant("phase"),  # kind
        live.from_rows(2, "<i8"),  # start_ns
        live.from_rows(3, "<i8"),  # end_ns
        live.zeros("<i2"),  # depth
        live.encoded(None),  # stage
        live.encoded(None),  # microbatch
    ),
}


class NativePhases:
    """The phases the native kernel times (dtprof/record/native/phases.cpp): its forward
    wrapper (``ForwardTimer``), optimizer hooks, backward hook (``watch``), end of a step
    (``step_ends``, and ``profiler_step``: Profiler.step's native form), the numbers it shares
    with Python (``state``) and the rings of spans, of steps, of their counts and of RSS
    readings it writes in its memory (``take``)."""

    RING = 16384  # kRing in phases.cpp: rows between two takes before any is lost

    def __init__(self, native: Native, step: int) -> None:
        lib = native.lib
        for name in (
            "dtprof_backward_watcher",
            "dtprof_forward_timer_type",
            "dtprof_optimizer_pre_hook",
            "dtprof_optimizer_post_hook",
            "dtprof_step_ender",
            "dtprof_profiler_stepper",
        ):
            getattr(lib, name).restype = ctypes.py_object
        lib.dtprof_optimizer_pre_hook.argtypes = [ctypes.py_object]
        lib.dtprof_profiler_stepper.argtypes = [ctypes.py_object]
        for name in (
            "dtprof_phases_state",
            "dtprof_phases_ring",
            "dtprof_phases_written",
            "dtprof_counts_ring",
            "dtprof_counts_written",
            "dtprof_steps_ring",
            "dtprof_steps_written",
            "dtprof_rss_ring",
            "dtprof_rss_written",
        ):
            getattr(lib, name).restype = ctypes.c_int64
        # watch(tensor._cdata, step) -> bool: time the pass that reaches the tensor's node as
        # step ``step``'s backward; False where the kernel cannot (a tensor no node made). The
        # kernel's builtin itself: a Python method around it would cost more than it does.
        self.watch = lib.dtprof_backward_watcher()
        self.ForwardTimer = lib.dtprof_forward_timer_type()  # (hooks, module, wrapped)
        # step_ends(step, data_from): the step's counts into their ring; the next step's
        # number, and its data phase from data_from (-1: none)
        self.step_ends = lib.dtprof_step_ender()
        self._lib = lib
        self.frame_of = native.frame_of  # frame_of(rows, plan): a frame of the trace
        self.state = int64s(lib.dtprof_phases_state(), PHASE_FIELDS)
        self.state[STEP] = step
        self.state[DATA_FROM] = -1
        self.spans = Ring(lib.dtprof_phases_ring(), lib.dtprof_phases_written, 4, self.RING)
        self.counts = Ring(lib.dtprof_counts_ring(), lib.dtprof_counts_written, 3, self.RING)
        self.steps = Ring(lib.dtprof_steps_ring(), lib.dtprof_steps_written, 3, self.RING)
        self.rss = Ring(lib.dtprof_rss_ring(), lib.dtprof_rss_written, 3, self.RING)
        self._lock = threading.Lock()  # the writer's tick and the profile's end both take

    def profiler_step(self, prof: Profiler, extras: Any) -> Any:
        """Profiler.step done natively for ``prof``, which sets it as its own ``step``: its
        ``active``, ``step_index`` and ``step_start_ns`` read and written in its __dict__, its
        rows into the steps' ring and the RSS, read at a step that ends at or after
        ``state[RSS_DUE]``, into the RSS ring (``take``); ``extras(step, t)`` (memory and
        fingerprints in Python, returning where the next step starts) called at a step that
        ends at or after ``state[EXTRAS_DUE]``, and instead of the RSS's reading on a job that
        uses CUDA. A failure goes to ``prof.native_step_failed(exc)``, and Profiler.step ends
        the step where it can."""
        python_step = type(prof).step.__get__(prof)
        context = (vars(prof), extras, prof.native_step_failed, python_step, vars(torch.cuda))
        return self._lib.dtprof_profiler_stepper(context)

    def optimizer_hooks(self, closure_given: Any) -> tuple[Any, Any]:
        """The optimizer's step pre- and post-hook; the pre-hook hands a step given arguments
        to ``closure_given(args, kwargs)``."""
        return self._lib.dtprof_optimizer_pre_hook(closure_given), (
            self._lib.dtprof_optimizer_post_hook()
        )

    def take(self, prof: Profiler) -> np.ndarray:
        """The spans, the steps and the RSS readings written since the last take, into
        ``prof``'s trace as frames, made by the kernel straight from the rings' numbers (a
        Python object a value cost the writer about 1 µs a row, and numpy an operation a
        column, a few µs each); the steps' counts written since, rows of (step, samples,
        tokens)."""
        add, frame_of = prof.writer.add_frame, self.frame_of
        with self._lock:
            for table, ring in (
                ("steps", self.steps),
                ("samples", self.rss),
                ("spans", self.spans),
            ):
                rows = ring.take()
                add(table, len(rows), frame_of(rows, RING_PLANS[table]))
            return self.counts.take()

    @property
    def lost(self) -> int:
        """Rows written over before they were read."""
        return self.spans.lost + self.counts.lost + self.steps.lost + self.rss.lost


class Ring:
    """One of the kernel's rings: the count of rows written so far, then ``size`` rows of
    ``width`` 64-bit integers, row i at i % size; read in slices."""

    def __init__(self, address: int, written: Any, width: int, size: int) -> None:
        memory = np.frombuffer(int64s(address, 1 + width * size), np.int64)
        self.rows = memory[1:].reshape(size, width)
        self.written = written  # the count, after which the rows below it are whole
        self.size = size
        self.read = written()  # the rows written before this profile are not its own
        self.lost = 0  # rows overwritten before they were read

    def take(self) -> np.ndarray:
        """The rows written since the last take (a copy, ``width`` columns; none: 0 rows)."""
        written, read = self.written(), self.read
        if written - read >= self.size:  # the oldest may be being written over
            self.lost += written - read - self.size + 1
            read = written - self.size + 1
        first = read % self.size
        last = first + written - read
        self.read = written
        if last <= self.size:
            return self.rows[first:last].copy()
        return np.concatenate((self.rows[first:], self.rows[: last - self.size]))
