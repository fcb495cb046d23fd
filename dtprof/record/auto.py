"""Recording a script that was written without dtprof: what a process that ``dtprof run``
started does once it imports torch (see ``startup/sitecustomize.py`` for how it gets here),
and what a framework's callback (``dtprof.integrations``) opens, starts and ends itself.

It wraps a few of torch's functions, and registers torch.optim's global step hooks:

- **Start.** The profile starts right after the process initializes torch.distributed (every
  rank at the same point of its script, as the clock exchange of ``profile()`` needs), or, in a
  process that trains alone (no WORLD_SIZE above 1), when it makes its first optimizer.
  Processes that do neither (the launcher, data-loader workers) record nothing.
- **Steps.** A step ends with each step of the optimizer that steps first (with gradient
  accumulation, its micro-batches are the forward and backward passes inside it). The first
  step starts at the first forward pass, not at the start of the profile.
- **Model.** The DistributedDataParallel wrapper where the script makes one; else the
  outermost module that ran forward before the first optimizer step and holds the most of the
  parameters that optimizer steps (its phases are recorded from the second step on). A
  torch.distributed.pipelining schedule is recorded from its first step, and then stands for
  the model.
- **Loss.** What the script calls ``.backward()`` on, where that is one number, summed over
  the step's micro-batches (``loss``); a GradScaler's scaling is undone.
- **End.** Before ``destroy_process_group()`` (with the clock exchange at exit), else at the
  process's exit, or with the uncaught exception that ends it, which is recorded as
  ``profile()`` records one.

Anything here that fails turns recording off for this process, with one line on stderr; the
script runs on as it would have.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import sys
import time
from collections.abc import Callable
from types import ModuleType, TracebackType
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.hooks import RemovableHandle

from dtprof.record.profiler import Profiler, profile

ENV = "DTPROF_RUN"  # JSON: {"trace": folder, "options": keyword arguments of profile()}

now_ns = time.perf_counter_ns


class Session:
    """This process's recording, from its start to its end: under ``dtprof run`` it starts
    itself (``starts_itself``); an integration's callback starts it."""

    def __init__(self, trace: str, options: dict[str, Any], *, starts_itself: bool) -> None:
        self.trace, self.options = trace, options
        self.starts_itself = starts_itself
        self.prof: Profiler | None = None
        self.over = False  # ended, never to start, or in a forked child: every hook does nothing
        self.optimizer: Any = None  # the one whose steps are the training steps
        self.model: torch.nn.Module | None = None  # a DDP wrapper, as soon as it is made
        self.schedule: Any = None
        self.roots: list[torch.nn.Module] = []  # outermost modules run before the first step
        self.depth = 0
        self.module_hooks: list[Any] = []
        self.first_forward = True
        self.loss: torch.Tensor | float | None = None  # this step's, summed over its backwards
        self.scaled: tuple[torch.Tensor, torch.Tensor] | None = None  # (output, its scale)

    @property
    def recording(self) -> bool:
        return self.prof is not None and not self.over

    # ------------------------------------------------------------------ start and end

    def start(self) -> None:
        if self.prof is not None or self.over:
            return
        prof = profile(self.trace, **self.options).__enter__()
        if not isinstance(prof, Profiler):  # it said why, or DTPROF_DISABLE
            self.over = True
            return
        self.prof = prof
        from torch.nn.modules import module

        self.module_hooks = [
            module.register_module_forward_pre_hook(self._module_pre),
            module.register_module_forward_hook(self._module_post, always_call=True),
        ]
        if self.model is not None:
            prof.attach(model=self.model)

    def end(self, exc: BaseException | None = None, *, exchange: bool = False) -> None:
        """End the profile: with the exit clock exchange only where every rank ends at the same
        point (destroy_process_group); with the exception that ends the process, if any."""
        if not self.recording:
            return
        self.over = True
        assert self.prof is not None
        self.drop_module_hooks()
        if not exchange:
            self.prof.clock_sync = False
        tb = exc.__traceback__ if exc is not None else None
        self.prof.__exit__(type(exc) if exc is not None else None, exc, tb)

    def drop_module_hooks(self) -> None:
        for handle in self.module_hooks:
            handle.remove()
        self.module_hooks.clear()

    # ------------------------------------------------------------------ what the script does

    def process_group_ready(self) -> None:
        if self.starts_itself:
            self.start()

    def optimizer_made(self) -> None:
        if self._may_start_alone():
            self.start()

    def _may_start_alone(self) -> bool:
        return (
            self.starts_itself
            and self.prof is None
            and (dist.is_initialized() or not _launched_as_many())
        )

    def ddp_made(self, model: torch.nn.Module) -> None:
        if self.model is None:
            self.use_model(model)

    def use_model(self, model: torch.nn.Module) -> None:
        """The model, where it is known (a DDP wrapper as it is made, or an integration's)."""
        if self.model is None:
            self.model = model
            if self.recording:
                self.prof.attach(model=model)  # type: ignore[union-attr]

    def schedule_steps(self, schedule: Any) -> None:
        if self.schedule is None and self.recording:
            self.schedule = schedule
            self.prof.attach(pipeline=schedule)  # type: ignore[union-attr]

    def _module_pre(self, module: torch.nn.Module, args: Any) -> None:
        # a global hook on every module's forward, until the first optimizer step: it must
        # never raise into the script's forward, nor remove itself while torch runs its hooks
        try:
            if self.depth == 0 and self.recording:
                self._outermost_forward(module)
        except Exception as exc:
            _stop(exc)
        self.depth += 1

    def _outermost_forward(self, module: torch.nn.Module) -> None:
        prof = self.prof
        assert prof is not None
        if self.first_forward:  # the first step starts here, not when the profile did
            self.first_forward = False
            if prof.step_index == 0:
                prof.step_start_ns = now_ns()
                if hasattr(prof, "phases"):
                    prof.phases.data_phase_from(None)
        if not any(module is root for root in self.roots):
            self.roots.append(module)

    def _module_post(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        self.depth = max(self.depth - 1, 0)

    def optimizer_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._may_start_alone():
            self.start()
        if self.optimizer is not None or not self.recording:
            return
        self.optimizer = optimizer
        self.drop_module_hooks()
        model = None
        if self.model is None and self.schedule is None:
            model = _holding_most(self.roots, optimizer)
        self.roots.clear()
        self.prof.attach(model=model, optimizer=optimizer)  # type: ignore[union-attr]

    def optimizer_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if optimizer is not self.optimizer or not self.recording:
            return
        prof = self.prof
        assert prof is not None
        if _first_steps is not None:
            unwatch_first_steps()
        if self.loss is not None:
            prof.log(loss=self.loss)
            self.loss = None
        prof.step()

    def end_before_destroy(self) -> None:
        self.end(exchange=True)

    def loss_scaled(self, scaled: torch.Tensor, scale: torch.Tensor) -> None:
        self.scaled = (scaled, scale)

    def backward(self, tensor: torch.Tensor) -> None:
        if not self.recording or tensor.numel() != 1:
            return
        # a plain CPU loss is read at once, as a float: no tensor operation (detach, add) to
        # pay for through torch's dispatcher right after the forward's kernels; any other (on
        # a device, a subclass) stays a tensor, detached, until the step's end logs it
        prof = self.prof
        assert prof is not None
        loss: torch.Tensor | float
        if tensor.is_cpu and type(tensor) is torch.Tensor:
            loss = prof.read_scalar(tensor)
        else:
            loss = tensor.detach()
        if self.scaled is not None and self.scaled[0] is tensor:
            loss = loss / self.scaled[1]
        self.scaled = None
        self.loss = loss if self.loss is None else self.loss + loss


def _holding_most(roots: list[torch.nn.Module], optimizer: Any) -> torch.nn.Module | None:
    """Of the modules, the one holding the most of the optimizer's parameters (None: none)."""
    stepped = {id(p) for group in optimizer.param_groups for p in group["params"]}
    best, most = None, 0
    for root in roots:
        held = sum(1 for p in root.parameters() if id(p) in stepped)
        if held > most:
            best, most = root, held
    return best


def _forked() -> None:
    """In a forked child (a data loader's worker, say), the parent's session records nothing."""
    if _session is not None:
        _session.over = True


def _launched_as_many() -> bool:
    """Whether a launcher started this process as one of several (torchrun sets WORLD_SIZE)."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1")) > 1
    except ValueError:
        return False


# ---------------------------------------------------------------------- wiring


_session: Session | None = None  # the session the wrapped functions report to
_watching = False
# torch.optim's global step pre-hook, while a session awaits its optimizer
_first_steps: RemovableHandle | None = None
_schedules_watched: set[type] = set()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


def torch_imported(module: ModuleType) -> None:
    """Called by ``dtprof run``'s start-up hook once torch is imported: a session that starts
    itself, from DTPROF_RUN."""
    config = json.loads(os.environ[ENV])
    open_session(str(config["trace"]), dict(config.get("options", {})), starts_itself=True)


def open_session(trace: str, options: dict[str, Any], *, starts_itself: bool) -> Session:
    """The session the wrapped functions of torch report to from now on (torch watched once
    per process); one that is recording already is kept, and a new one does nothing."""
    global _session
    session = Session(trace, options, starts_itself=starts_itself)
    if _session is not None and _session.recording:
        session.over = True
        return session
    _session = session
    _watch()
    _watch_first_steps()
    return session


def _watch_first_steps() -> None:
    """torch.optim's global step pre-hook, by which the session finds its optimizer (and one
    that trains alone starts) at the first step; unwatch_first_steps() removes it."""
    global _first_steps
    if _first_steps is None:
        import torch.optim.optimizer as optimizer_hooks

        hook = functools.partial(_on, "optimizer_pre")
        _first_steps = optimizer_hooks.register_optimizer_step_pre_hook(hook)


def unwatch_first_steps() -> None:
    """Remove the pre-hook once the session has its optimizer: after that it had nothing to
    do at each step but cost a few Python frames (never from inside the pre-hooks' own loop,
    which a removal would break)."""
    global _first_steps
    if _first_steps is not None:
        _first_steps.remove()
        _first_steps = None


def _on(event: str, *args: Any) -> None:
    """Tell the current session what the script did; never raises: a failure stops recording
    (guarded's way, written out: it runs a few times a step, right after torch's kernels, where
    each Python frame costs a microsecond or two, so nothing stands between it and the
    session's method)."""
    session = _session
    if session is not None and not session.over:
        try:
            getattr(session, event)(*args)
        except Exception as exc:
            _stop(exc)


def _watch() -> None:
    """Wrap torch's functions and register the optimizer hooks, once per process."""
    global _watching
    if _watching:
        return
    import torch.optim.optimizer as optimizer_hooks

    dist_c10d = sys.modules.get("torch.distributed.distributed_c10d")
    init = dist.init_process_group
    wrapped_init = _after(init, lambda *a, **k: _on("process_group_ready"))
    destroy = dist.destroy_process_group

    @functools.wraps(destroy)
    def destroy_process_group(group: Any = None, *args: Any, **kwargs: Any) -> Any:
        if group is None:
            _on("end_before_destroy")
        return destroy(group, *args, **kwargs)

    backward = torch.Tensor.backward

    @functools.wraps(backward)
    def tensor_backward(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        _on("backward", self)
        return backward(self, *args, **kwargs)

    scale = torch.amp.GradScaler.scale

    @functools.wraps(scale)
    def scale_loss(self: Any, outputs: Any) -> Any:
        scaled = scale(self, outputs)
        if isinstance(scaled, torch.Tensor) and getattr(self, "_scale", None) is not None:
            _on("loss_scaled", scaled, self._scale)
        return scaled

    previous_hook = sys.excepthook

    def excepthook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        _on("end", exc)
        previous_hook(kind, exc, tb)

    # every lookup above is done: from here on nothing fails half-way
    for owner in (dist, dist_c10d, sys.modules.get("torch.distributed.device_mesh")):
        if owner is not None and getattr(owner, "init_process_group", None) is init:
            owner.init_process_group = wrapped_init  # type: ignore[attr-defined]
    for owner in (dist, dist_c10d):
        if owner is not None and getattr(owner, "destroy_process_group", None) is destroy:
            owner.destroy_process_group = destroy_process_group  # type: ignore[attr-defined]
    optim = torch.optim.Optimizer
    optim.__init__ = _after(optim.__init__, lambda *a, **k: _on("optimizer_made"))  # type: ignore[method-assign]
    ddp = torch.nn.parallel.DistributedDataParallel
    ddp.__init__ = _after(ddp.__init__, lambda self, *a, **k: _on("ddp_made", self))  # type: ignore[method-assign]
    optimizer_hooks.register_optimizer_step_post_hook(functools.partial(_on, "optimizer_post"))
    torch.Tensor.backward = tensor_backward  # type: ignore[method-assign]
    torch.amp.GradScaler.scale = scale_loss  # type: ignore[method-assign]
    atexit.register(lambda: _on("end"))
    sys.excepthook = excepthook
    _watching = True
    schedules = sys.modules.get("torch.distributed.pipelining.schedules")
    if schedules is not None:  # imported before (an integration's session): else see below
        pipelining_imported(schedules)


def pipelining_imported(module: ModuleType) -> None:
    """Called by the start-up hook once torch.distributed.pipelining.schedules is imported
    (and by _watch where it was before): a schedule is seen at its first step."""
    for name in ("PipelineScheduleSingle", "PipelineScheduleMulti"):
        cls = getattr(module, name, None)
        if cls is not None and "step" in vars(cls) and cls not in _schedules_watched:
            cls.step = _before(cls.step, lambda self, *a, **k: _on("schedule_steps", self))
            _schedules_watched.add(cls)


def _after(function: Callable[..., Any], then: Callable[..., None]) -> Callable[..., Any]:
    """function, followed by then(same arguments) once it returned; then never raises."""

    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        result = function(*args, **kwargs)
        guarded(then, *args, **kwargs)
        return result

    return call


def _before(function: Callable[..., Any], first: Callable[..., None]) -> Callable[..., Any]:
    """first(same arguments), which never raises, then function."""

    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        guarded(first, *args, **kwargs)
        return function(*args, **kwargs)

    return call


def guarded(work: Callable[..., None], *args: Any, **kwargs: Any) -> None:
    """Run a piece of the recording, work(*args, **kwargs); where it raises, recording stops,
    the script goes on."""
    try:
        work(*args, **kwargs)
    except Exception as exc:
        _stop(exc)


def _stop(exc: Exception) -> None:
    """Stop recording in this process after a failure of its own: say so once, keep what was
    written."""
    session = _session
    if session is None or session.over:
        return
    session.over = True
    print(
        f"dtprof run: recording stopped in this process: {type(exc).__name__}: {exc}",
        file=sys.stderr,
    )
    with contextlib.suppress(Exception):
        session.drop_module_hooks()
    if session.prof is not None:
        try:
            session.prof.clock_sync = False
            session.prof.__exit__(None, None, None)
        except Exception:
            pass
