"""profile(): the context manager that records one rank of a training job."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
import time
import traceback
import warnings
from collections import deque
from datetime import datetime, timezone
from pathlib import Path
from types import TracebackType
from typing import Any

import torch
import torch.distributed as dist

from dtprof.record import (
    clock,
    comms,
    fingerprint,
    gpu,
    gpu_timing,
    memory,
    native,
    phases,
    pipeline,
    watchdog,
)
from dtprof.record.gpu_timing import GpuTimer
from dtprof.record.writer import DtprofWarning, TraceWriter, write_json_atomic
from dtprof.trace.meta import Config, ExceptionDetail, GpuTiming, RankMeta, encode, replace
from dtprof.trace.schema import INFLIGHT_FILE, META_FILE, SCHEMA_VERSION, rank_dir_name

now_ns = time.perf_counter_ns
WORK_NAMES = ("samples", "tokens")  # scalars counted from the inputs, unless logged
NEVER_NS = 2**63 - 1  # a time no step reaches


def profile(
    trace_dir: str | os.PathLike[str],
    *,
    model: torch.nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    pipeline: Any = None,
    fingerprint_every: int = 0,
    hang_timeout_s: float | None = None,
    ddp_buckets: bool | str = True,
    enabled: bool = True,
    gpu_sample_interval_s: float = 1.0,
    gpu_timing: bool = True,
    flush_interval_s: float = 1.0,
    seal_interval_s: float = 300.0,
    clock_sync: bool = True,
) -> Profiler | NullProfiler:
    """Record this rank of a training job into ``trace_dir`` (one folder per rank).

    ``model`` and ``optimizer`` add forward / backward / optimizer / data phases (and DDP
    buckets); ``pipeline`` is a torch.distributed.pipelining schedule whose actions are
    recorded; ``fingerprint_every`` records parameter fingerprints every N steps (0: off);
    ``hang_timeout_s`` records a collective in flight longer than that, with every thread's
    stack. ``ddp_buckets`` records a DDP model's gradient buckets where DDP's reducer hands them
    to the process group (a kernel at torch's dispatcher, removed at exit; DDP is left as it is),
    or, where that cannot be registered or with ``ddp_buckets="comm_hook"``, through a comm hook
    that keeps DDP's arithmetic to the bit (it stays on the model, and on CPU/gloo it costs a pass
    over the gradients that DDP otherwise fuses into its copy); ``False`` records none.
    On a CUDA job, ``gpu_timing`` also times phases, regions and collectives on the GPU with CUDA
    events (read back by the writer thread, never with a synchronization); NVML is sampled every
    ``gpu_sample_interval_s`` (0: off).
    Buffers reach the disk every ``flush_interval_s``;
    the open segment of each table becomes a Parquet part every ``seal_interval_s`` and at exit.
    ``enabled=False`` or the environment variable ``DTPROF_DISABLE=1`` makes every call a no-op.
    """
    if ddp_buckets not in (True, False, "comm_hook"):
        raise ValueError(f"ddp_buckets must be True, False or 'comm_hook', not {ddp_buckets!r}")
    if not enabled or os.environ.get("DTPROF_DISABLE", "") not in ("", "0"):
        return NullProfiler()
    return Profiler(
        Path(trace_dir),
        model=model,
        optimizer=optimizer,
        pipeline=pipeline,
        fingerprint_every=fingerprint_every,
        hang_timeout_s=hang_timeout_s,
        ddp_buckets=ddp_buckets,
        gpu_sample_interval_s=gpu_sample_interval_s,
        gpu_timing=gpu_timing,
        flush_interval_s=flush_interval_s,
        seal_interval_s=seal_interval_s,
        clock_sync=clock_sync,
    )


class _NullRegion:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


class NullProfiler:
    """What profile() returns when recording is off: the same API, doing nothing."""

    step_index = 0

    def __enter__(self) -> NullProfiler:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def step(self) -> None:
        pass

    def region(self, name: str) -> _NullRegion:
        return _NullRegion()

    def log(self, **values: Any) -> None:
        pass


class _Region:
    """A user region: a span that closes even when its block raises."""

    __slots__ = ("_depth", "_event", "_name", "_prof", "_start")

    def __init__(self, prof: Profiler, name: str) -> None:
        self._prof = prof
        self._name = name

    def __enter__(self) -> None:
        prof = self._prof
        self._depth = prof._region_depth
        prof._region_depth += 1
        timer = prof.gpu_timer
        self._event = timer.mark() if timer is not None else None
        self._start = now_ns()

    def __exit__(self, *exc: object) -> None:
        end = now_ns()
        prof = self._prof
        prof._region_depth -= 1
        step = prof.step_index
        prof.spans.append((step, self._name, "region", self._start, end, self._depth, None, None))
        timer = prof.gpu_timer
        if timer is not None:
            timer.pair(self._event, (step, self._name, "region", None, None), self._start, end)


def copy_for_later(value: torch.Tensor) -> tuple[torch.Tensor, Any]:
    """A logged device scalar's copy, for the writer thread to read without stopping the
    training thread, and the event that says when it can (None: whenever it likes).

    On CUDA the copy goes to pinned host memory behind the work already queued, and the
    writer reads it once the event after it has passed: neither thread waits for the GPU (an
    ``item()`` on the writer would queue behind all the training's work and spin until the GPU
    caught up). Elsewhere an on-device copy, read with ``item()``. Either way, later in-place
    changes to the caller's tensor do not leak in."""
    value = value.detach()
    if not value.is_cuda:
        return value.clone(), None
    copy = value.to("cpu", non_blocking=True)
    arrived = torch.cuda.Event()
    arrived.record(torch.cuda.current_stream(value.device))
    return copy, arrived


class Profiler:
    """Records one rank: steps, phases, regions, collectives, memory, scalars, fingerprints."""

    def __init__(
        self,
        trace_dir: Path,
        *,
        model: torch.nn.Module | None,
        optimizer: torch.optim.Optimizer | None,
        pipeline: Any,
        fingerprint_every: int,
        hang_timeout_s: float | None,
        ddp_buckets: bool | str,
        gpu_sample_interval_s: float,
        gpu_timing: bool,
        flush_interval_s: float,
        seal_interval_s: float,
        clock_sync: bool,
    ) -> None:
        self.trace_dir = trace_dir
        self.model = model
        self.optimizer = optimizer
        self.pipeline = pipeline
        self.fingerprint_every = int(fingerprint_every)
        self.hang_timeout_s = hang_timeout_s
        self.ddp_buckets = ddp_buckets
        self.gpu_sample_interval_s = gpu_sample_interval_s
        self.gpu_timing = gpu_timing
        self.gpu_timer: GpuTimer | None = None  # on a CUDA job: CUDA-event timing
        self.flush_interval_s = flush_interval_s
        self.seal_interval_s = seal_interval_s
        self.clock_sync = clock_sync
        self.step_index = 0
        self.step_start_ns = 0
        self.active = False  # hooks record (off again after exit or a writer failure)
        self._entered = False  # __enter__ succeeded: __exit__ has work to do
        self._switched_off: set[str] = set()  # hooks switched off after they raised
        self._region_depth = 0
        self._phases_step_ends: Any = None  # PhaseHooks.step_ends, while the phases record
        self._removers: dict[str, list[Any]] = {}
        self._warned: set[str] = set()
        # of WORK_NAMES, those the script logs itself, and the first step it logged each at
        self.logged_work: dict[str, int] = {}
        # a CPU tensor's value as a float: item(), or the native kernel's reader once loaded
        # (see attach); also how dtprof run's session reads the loss it sees
        self.read_scalar: Any = torch.Tensor.item
        # logged device scalars on their way to the host: (step, name, copy, arrival event)
        self._pending_scalars: deque[tuple[int, str, torch.Tensor, Any]] = deque()
        self._scalars_lock = threading.Lock()  # the writer thread and exit both resolve them
        self.meta = RankMeta(schema_version=SCHEMA_VERSION, rank=0)
        self._meta_lock = threading.Lock()  # hooks on other threads note fields too

    # ----------------------------------------------------------------- lifecycle

    def __enter__(self) -> Profiler | NullProfiler:
        try:
            self._start()
        except Exception as exc:
            warnings.warn(
                f"dtprof: recording is off for this run: {exc}", DtprofWarning, stacklevel=2
            )
            self._teardown_quietly()
            return NullProfiler()
        return self

    def _start(self) -> None:
        if comms.is_recording():
            raise RuntimeError("another dtprof.profile() is already recording in this process")
        if dist.is_available() and dist.is_initialized():
            self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
            backend = str(dist.get_backend())
        else:
            self.rank, self.world_size, backend = 0, 1, "none"
        # the exchange with rank 0 comes before anything that can fail on one host only (a
        # full or read-only disk), so that no other rank is left waiting in it
        clock_info = clock.start(self.world_size if self.clock_sync else 1)
        self.folder = self.trace_dir / rank_dir_name(self.rank)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.writer = TraceWriter(
            self.folder,
            flush_interval_s=self.flush_interval_s,
            seal_interval_s=self.seal_interval_s,
            on_failure=self._writer_failed,
        )
        buffers = self.writer.buffers
        self.steps, self.spans = buffers["steps"], buffers["spans"]
        self.scalars = buffers["scalars"]
        self.samples, self.events = buffers["samples"], buffers["events"]
        self.fingerprints, self.collectives = buffers["fingerprints"], buffers["collectives"]
        self.groups = buffers["groups"]
        self.gpu_spans = buffers["gpu_spans"]
        self.memory = memory.StepMemory(self.samples)

        self.meta = RankMeta(
            schema_version=SCHEMA_VERSION,
            dtprof_version=_dtprof_version(),
            rank=self.rank,
            world_size=self.world_size,
            local_rank=int(os.environ.get("LOCAL_RANK", self.rank)),
            host=socket.gethostname(),
            pid=os.getpid(),
            backend=backend,
            device=_device_name(),
            torch_version=str(torch.__version__),
            python_version=sys.version.split()[0],
            started_at=datetime.now(timezone.utc).isoformat(),
            status="running",
            model_kind=phases.model_kind(self.model),
            config=Config(
                fingerprint_every=self.fingerprint_every,
                hang_timeout_s=self.hang_timeout_s,
                ddp_buckets=self.ddp_buckets,
                gpu_sample_interval_s=self.gpu_sample_interval_s,
                gpu_timing=self.gpu_timing,
                flush_interval_s=self.flush_interval_s,
                seal_interval_s=self.seal_interval_s,
            ),
            clock=clock_info,
        )
        self.write_meta()

        self.comms = comms.install(self)
        self._removers["collectives"] = [self.comms.uninstall]
        self._start_gpu_timer(self.model)
        self._attach(self.model, self.optimizer, self.pipeline)
        self._start_nvml()
        self.watchdog = watchdog.Watchdog(self, self.hang_timeout_s)
        self.writer.add_tick_hook(self._tick)
        self.write_meta()
        self.active = True
        self._entered = True
        self.writer.start()
        self.step_start_ns = now_ns()
        if hasattr(self, "phases"):
            self.phases.data_phase_from(self.step_start_ns)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self._entered:
            return
        self._entered = False
        self.active = False
        for name in list(self._removers):
            self._remove(name)
        try:
            # every rank that leaves normally joins the exit exchange, even with recording
            # stopped, so that no other rank waits for it
            if exc_type is None and self.clock_sync:
                self.note_meta(clock=clock.finish(self.meta.clock, self.world_size))
            self.note_meta(ended_at=datetime.now(timezone.utc).isoformat(), steps=self.step_index)
            if self.writer.failed:
                self.write_meta()
                return
            self.note_meta(status="finished" if exc_type is None else f"raised {exc_type.__name__}")
            if exc is not None:
                self._record_exception(exc)
            self._resolve_pending_scalars(wait=True)
            self.writer.close()
            write_json_atomic(self.folder / INFLIGHT_FILE, encode(self.comms.inflight_snapshot()))
            self.write_meta()
        except Exception as err:
            self._warn_once("close", f"dtprof: could not finish the trace cleanly: {err}")

    def attach(
        self,
        *,
        model: torch.nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        pipeline: Any = None,
    ) -> None:
        """Add, while recording, a model, an optimizer or a pipelining schedule that
        ``profile()`` was not given (one of each at most): their phases or actions are recorded
        from now on. Used by ``dtprof run``, which sees them only once the script makes them."""
        if not self.active:
            return
        try:
            self._attach(
                model if self.model is None else None,
                optimizer if self.optimizer is None else None,
                pipeline if self.pipeline is None else None,
            )
        except Exception as exc:
            self.hook_failed("attach", exc)
        else:
            self.write_meta()

    def _start_gpu_timer(self, model: Any) -> None:
        """CUDA-event timing, where the job runs on CUDA (or why not, in meta.json)."""
        if self.gpu_timer is not None or "gpu-timing" in self._switched_off:
            return
        why_not = gpu_timing.wanted(self, model)
        if why_not is None:
            try:
                self.gpu_timer = GpuTimer(self)
            except Exception as exc:
                why_not = f"unavailable: {exc}".splitlines()[0]
        if why_not is not None:
            self.note_meta(gpu_timing=GpuTiming(available=False, reason=why_not))
            return
        self._removers["gpu-timing"] = [self._stop_gpu_timer]

    def _stop_gpu_timer(self) -> None:
        timer, self.gpu_timer = self.gpu_timer, None
        if timer is not None:
            try:
                timer.close()
            finally:
                self.note_meta(gpu_timing=timer.status())

    def _start_nvml(self) -> None:
        self.gpu = gpu.NvmlSampler(self, self.gpu_sample_interval_s)
        self.note_meta(nvml=self.gpu.status, gpm=self.gpu.gpm_status)

    def _attach(self, model: Any, optimizer: Any, schedule: Any) -> None:
        if model is not None and self.active:  # given by attach() (dtprof run): it may be the
            # first sign that the job uses CUDA, which recording started too early to see
            self._start_gpu_timer(model)
            if self.gpu.status.reason == gpu.NOT_CUDA and gpu.why_no_cuda() is None:
                self._start_nvml()
        if model is not None:
            self.model = model
            self.note_meta(model_kind=phases.model_kind(model))
        if optimizer is not None:
            self.optimizer = optimizer
        # phase hooks that raised before stay off
        if (model is not None or optimizer is not None) and "phases" not in self._switched_off:
            if "phases" not in self._removers:
                self.phases = phases.PhaseHooks(self)
                self._phases_step_ends = self.phases.step_ends
                self._removers["phases"] = [self._stop_phases]
                if self.phases.native is not None:  # step() natively too, while they record
                    self.phases.native.state[native.RSS_EVERY] = memory.EVERY_NS
                    self._native_extras_due()
                    self.step = self.phases.native.profiler_step(self, self._native_extras)  # type: ignore[method-assign]
            if model is not None:
                self.phases.add_model(model)
            if optimizer is not None:
                self.phases.add_optimizer(stepped_optimizer(optimizer))
        kernel = native.loaded()  # by the phase hooks or DDP's buckets: never for logging alone
        if kernel is not None and "log" not in vars(self):  # log() and region() natively
            self.read_scalar = kernel.read_scalar
            python_log = type(self).log.__get__(self)
            self.log = kernel.profiler_log(self, python_log, WORK_NAMES)  # type: ignore[method-assign]
            self.region = kernel.profiler_region(self, type(self).region.__get__(self))  # type: ignore[method-assign]
        if schedule is not None:
            self.pipeline = schedule
            self.note_meta(pipeline=pipeline.describe(schedule, self.rank))
            self._removers["pipeline"] = [pipeline.install(self, schedule)]

    def _stop_phases(self) -> None:
        vars(self).pop("step", None)  # the native step's: Profiler.step again
        self._phases_step_ends = None
        self.phases.uninstall()

    def _record_exception(self, exc: BaseException) -> None:
        """The exception training left with: in meta.json, and as an event on the trace's
        clock (which rank failed first is read from these times)."""
        detail = exception_detail(exc, self.step_index)
        self.note_meta(exception=detail)
        self.events.append(
            (self.step_index, now_ns(), "exception", detail.message, _json(encode(detail)))
        )

    def _teardown_quietly(self) -> None:
        for name in list(self._removers):
            with contextlib.suppress(Exception):
                self._remove(name)

    # ----------------------------------------------------------------- public API

    def step(self) -> None:
        """End the current training step. (Where the native kernel times the phases, the
        profiler's own ``step`` is this method's native form, phases.cpp's profiler_step: a
        change here is made there too.)"""
        t = now_ns()
        if not self.active:
            return
        step = self.step_index
        self.steps.append((step, self.step_start_ns, t))
        if (self.fingerprint_every or t >= self.memory.due_ns) and "step" not in self._switched_off:
            t = self._step_extras(step, t)
        # the next step starts after dtprof's own per-step work, so that its time is charged
        # to neither step (a fingerprint shows as its own span)
        if self._phases_step_ends is not None:  # before the step's number moves on (StepWork)
            self._phases_step_ends(step, t)
        self.step_index = step + 1
        self.comms.step_cell[0] = step + 1
        self.step_start_ns = t

    def _step_extras(self, step: int, t: int) -> int:
        """Memory and fingerprints, when due; returns when this work ended."""
        try:
            self.memory.step_ends(step, t)
            due = self.fingerprint_every > 0 and step % self.fingerprint_every == 0
            if due and self.model is not None:
                fingerprint.record(self, step)
                end = now_ns()
                self.spans.append((step, "fingerprint", "phase", t, end, 0, None, None))
                return end
        except Exception as exc:
            self.hook_failed("step", exc)
        return now_ns()

    def _native_extras_due(self) -> None:
        """When the native step next calls the extras, and when it next reads the RSS itself
        (Profiler.step's condition): Python's extras at every step where fingerprints are
        taken (memory with them), the RSS natively otherwise; neither once they failed."""
        kernel = self.phases.native
        if kernel is None:
            return
        due = self.memory.due_ns
        if "step" in self._switched_off:
            extras, rss = NEVER_NS, NEVER_NS
        elif self.fingerprint_every:
            extras, rss = 0, NEVER_NS
        else:
            extras, rss = NEVER_NS, due
        kernel.state[native.EXTRAS_DUE] = extras
        kernel.state[native.RSS_DUE] = rss

    def _native_extras(self, step: int, t: int) -> int:
        """The native step's call when the extras are due (or the RSS, on a job that uses
        CUDA): them, and when they are next due; returns where the next step starts."""
        end = t if "step" in self._switched_off else self._step_extras(step, t)
        self._native_extras_due()
        return end

    def native_step_failed(self, exc: BaseException) -> None:
        """The native step raised: the phases, and it with them, are switched off."""
        self.hook_failed("phases", exc)

    def region(self, name: str) -> _Region | _NullRegion:
        """A named user region inside a step (nestable): ``with prof.region("data"):``.
        (Where the native kernel is loaded, the profiler's own ``region`` is its form of this
        method, regions.cpp's profiler_region, which hands it the regions it does not time: a
        change here or in _Region is made there too.)"""
        if not self.active:
            return _NullRegion()
        return _Region(self, name)

    def log(self, **values: Any) -> None:
        """Record named scalars for this step: floats or 0-d tensors (read without a sync).

        ``samples``, ``tokens`` and ``flops`` (the step's model FLOPs) make the report's
        throughput and MFU; logging ``samples`` or ``tokens`` replaces the count dtprof makes
        of them from the model's inputs (dtprof.record.throughput). (Where the native kernel
        is loaded, the profiler's own ``log`` is its form of this method, scalars.cpp's
        profiler_log, which hands it every call it does not read whole: a change here is made
        there too.)"""
        if not self.active or "log" in self._switched_off:
            return
        step = self.step_index
        try:
            for name, value in values.items():
                if name in WORK_NAMES:
                    self.logged_work.setdefault(name, step)
                if isinstance(value, torch.Tensor):
                    if not value.is_cpu:
                        self._pending_scalars.append((step, name, *copy_for_later(value)))
                        continue
                    value = self.read_scalar(value)
                self.scalars.append((step, name, float(value)))
        except Exception as exc:
            self.hook_failed("log", exc)

    # ----------------------------------------------------------------- internals

    def note_meta(self, **fields: Any) -> None:
        """Set fields of this rank's meta.json (written at the next write_meta)."""
        with self._meta_lock:
            self.meta = replace(self.meta, **fields)

    def write_meta(self) -> None:
        write_json_atomic(self.folder / META_FILE, encode(self.meta))

    def _tick(self) -> None:
        """Writer-thread work before each flush: scalars, samplers, watchdog, in-flight file."""
        if "writer-tick" in self._switched_off:
            return
        try:
            if "phases" in self._removers:
                self.phases.take_ended()
            with gpu_timing.relaxed_capture_mode():  # never breaks a graph the user captures
                self.comms.sync_native()
                self._drain_gpu_timer()
                self._resolve_pending_scalars()
            self.gpu.maybe_sample()
            self.watchdog.check()
            snapshot = self.comms.inflight_snapshot()
            if snapshot != getattr(self, "_last_inflight", None):
                write_json_atomic(self.folder / INFLIGHT_FILE, encode(snapshot))
                self._last_inflight = snapshot
        except Exception as exc:
            self.hook_failed("writer-tick", exc)

    def _drain_gpu_timer(self) -> None:
        timer = self.gpu_timer
        if timer is None:
            return
        try:
            timer.drain()
        except Exception as exc:
            timer.abandon()
            self.hook_failed("gpu-timing", exc)

    def _resolve_pending_scalars(self, wait: bool = False) -> None:
        """Logged device scalars that have reached the host, in the order logged, into the
        scalars table; with ``wait``, all of them, waiting for the device."""
        with self._scalars_lock:
            try:
                while self._pending_scalars:
                    step, name, copy, arrived = self._pending_scalars[0]
                    if arrived is not None:
                        if not wait and not arrived.query():
                            return
                        arrived.synchronize()
                    self._pending_scalars.popleft()
                    self.scalars.append((step, name, float(copy.item())))
            except Exception as exc:  # a device error: the values are lost, the rest goes on
                self._pending_scalars.clear()
                self.hook_failed("log", exc)

    def add_remover(self, name: str, remover: Any) -> None:
        self._removers.setdefault(name, []).append(remover)

    def _remove(self, name: str) -> None:
        for remover in self._removers.pop(name, []):
            with contextlib.suppress(Exception):
                remover()

    def hook_failed(self, name: str, exc: BaseException) -> None:
        """A hook raised: switch it off, warn once, note it in the trace; training goes on."""
        try:
            self._switched_off.add(name)
            self._remove(name)
            with self._meta_lock:
                if name not in self.meta.disabled_hooks:
                    hooks = (*self.meta.disabled_hooks, name)
                    self.meta = replace(self.meta, disabled_hooks=hooks)
            detail = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            self.events.append(
                (
                    self.step_index,
                    now_ns(),
                    "hook-error",
                    f"{name} hook raised {type(exc).__name__}: {exc}; it is off",
                    _json({"hook": name, "traceback": detail}),
                )
            )
            self._warn_once(
                name,
                f"dtprof: the {name} hook raised {type(exc).__name__}: {exc};"
                " it is switched off and training goes on",
            )
            self.write_meta()
        except Exception:
            pass

    def _writer_failed(self, exc: BaseException) -> None:
        """Writing failed (a full disk...): stop recording, say so once, keep what is written."""
        self._warn_once("writer", f"dtprof: trace writing stopped ({exc}); training goes on")
        self.active = False
        for name in list(self._removers):
            self._remove(name)
        self.note_meta(status=f"recording stopped: {exc}")
        with contextlib.suppress(OSError):  # the disk that failed may refuse this too
            self.write_meta()

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(message, DtprofWarning, stacklevel=3)


def stepped_optimizer(optimizer: Any) -> Any:
    """The torch optimizer that a framework's wrapper steps (Accelerate's AcceleratedOptimizer,
    Lightning's LightningOptimizer hold it as ``.optimizer``): its step hooks are the ones that
    run."""
    inner = getattr(optimizer, "optimizer", None)
    return inner if isinstance(inner, torch.optim.Optimizer) else optimizer


_NOT_USER_CODE = (
    str(Path(torch.__file__).parent),  # torch, and the collectives that raised inside it
    str(Path(__file__).parent),  # dtprof's recording hooks
    str(Path(traceback.__file__).parent),  # the standard library
)


def exception_detail(exc: BaseException, step: int) -> ExceptionDetail:
    """Type, message and step of an exception, and the innermost frame of the user's code it
    passed through (not torch's, dtprof's recording or the standard library's)."""
    frames = traceback.extract_tb(exc.__traceback__)
    user = [f for f in frames if not f.filename.startswith(_NOT_USER_CODE)]
    frame = (user or frames)[-1] if frames else None
    text = str(exc).strip().splitlines()
    return ExceptionDetail(
        type=type(exc).__name__,
        message=f"{type(exc).__name__}: {text[0] if text else ''}"[:500],
        step=step,
        file=frame.filename if frame else None,
        line=frame.lineno if frame else None,
        function=frame.name if frame else None,
        code=(frame.line or "") if frame else None,
    )


def _json(obj: Any) -> str:
    return json.dumps(obj, default=str)


def _device_name() -> str:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return f"cuda:{torch.cuda.current_device()}"
    return "cpu"


def _dtprof_version() -> str:
    from dtprof import __version__

    return __version__
