"""profile() in one process: steps, phases, regions, scalars, fingerprints, failures, switches."""

from __future__ import annotations

import copy
import ctypes
import gc
import inspect
import itertools
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import nn

import dtprof
from dtprof.jobs.launch import free_port
from dtprof.record.memory import rss_bytes
from dtprof.record.phases import NativePhases, Ring
from dtprof.record.profiler import WORK_NAMES, NullProfiler
from dtprof.record.writer import DtprofWarning
from tests.conftest import native_kernel_or_skip


@pytest.fixture
def fake_clock(monkeypatch: pytest.MonkeyPatch) -> itertools.count:
    """Every clock read advances 1000 ns: spans get exact, predictable bounds."""
    ticks = itertools.count(0, 1000)
    clock = lambda: next(ticks)  # noqa: E731
    for module in ("profiler", "phases", "comms", "pipeline"):
        monkeypatch.setattr(f"dtprof.record.{module}.now_ns", clock)
    return ticks


def _train(prof, model, opt, steps: int = 3) -> None:
    for step in range(steps):
        with prof.region("data"):
            x = torch.randn(4, 8)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        prof.log(loss=loss, lr=0.1, step_plus_one=torch.tensor(step + 1))
        prof.step()


def test_each_backward_pass_of_a_step_is_a_span(tmp_path: Path, kernel: str) -> None:
    """Two micro-batches a step: two backward passes, each inside its step, after its forward."""
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with dtprof.profile(tmp_path, model=model, optimizer=opt, clock_sync=False) as prof:
        for _ in range(3):
            for _ in range(2):
                model(torch.randn(4, 8)).sum().backward()
            with torch.no_grad():
                model(torch.randn(4, 8))  # evaluation: no backward to watch
            opt.step()
            opt.zero_grad()
            prof.step()
    trace = dtprof.load_trace(tmp_path)
    assert trace.meta[0].phase_timing.startswith(kernel)
    spans = trace.spans.sort_values("start_ns", kind="stable")
    for step, rows in spans.groupby("step"):
        names = [n for n in rows["name"] if n != "data"]
        assert names == ["forward", "backward", "forward", "backward", "forward", "optimizer"]
        step_row = trace.steps[trace.steps["step"] == step].iloc[0]
        assert step_row["start_ns"] <= rows["start_ns"].min()
        assert rows["end_ns"].max() <= step_row["end_ns"]
        assert (rows["end_ns"] >= rows["start_ns"]).all()


def _backward_steps(trace_dir: Path, kernel: str) -> list[int]:
    """The steps of a trace's backward spans, in order, once ``kernel`` is seen to have timed
    them."""
    trace = dtprof.load_trace(trace_dir)
    assert trace.meta[0].phase_timing.startswith(kernel)
    return sorted(trace.spans.loc[trace.spans["name"] == "backward", "step"])


class _RaisesOnce(torch.autograd.Function):
    """The identity, whose backward raises the first time (an out-of-memory error, say)."""

    raised = False

    @staticmethod
    def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:
        if not _RaisesOnce.raised:
            _RaisesOnce.raised = True
            raise RuntimeError("out of memory (planted)")
        return grad


def test_a_backward_pass_that_raised_leaves_the_next_ones_timed(
    tmp_path: Path, kernel: str
) -> None:
    """A user catches a failed backward (a batch too large, say) and trains on: the pass that
    raised has no span, every later one has its own."""
    _RaisesOnce.raised = False
    inner = nn.Linear(8, 8)
    model = nn.Sequential(inner, nn.Linear(8, 1))
    inner.register_forward_hook(lambda m, a, out: _RaisesOnce.apply(out))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with dtprof.profile(tmp_path, model=model, optimizer=opt, clock_sync=False) as prof:
        for step in range(4):
            try:
                model(torch.randn(4, 8)).sum().backward()
            except RuntimeError:
                assert step == 0
            opt.step()
            opt.zero_grad()
            prof.step()
    assert _backward_steps(tmp_path, kernel) == [1, 2, 3]


def test_a_pass_under_compiled_autograd_leaves_the_next_ones_timed(
    tmp_path: Path, kernel: str
) -> None:
    """Under compiled autograd the pass is not timed (the native hook is skipped there, the
    Python one is traced into the graph and its end never comes); the passes after it are."""
    compiled_autograd = pytest.importorskip("torch._dynamo.compiled_autograd")
    if not hasattr(compiled_autograd, "_enable"):
        pytest.skip("this torch enables compiled autograd another way")
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with (
        warnings.catch_warnings(),  # dynamo's warning about the hook it cannot trace
        dtprof.profile(tmp_path, model=model, optimizer=opt, clock_sync=False) as prof,
    ):
        warnings.simplefilter("ignore")
        for step in range(4):
            loss = model(torch.randn(4, 8)).sum()
            if step == 1:
                with compiled_autograd._enable(torch.compile(backend="eager")):
                    loss.backward()
            else:
                loss.backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    assert _backward_steps(tmp_path, kernel) == [0, 2, 3]


def test_backward_passes_reach_the_trace_while_it_records(tmp_path: Path, kernel: str) -> None:
    """The native kernel's passes are taken by the writer's tick: a live reader sees them
    before the profile ends, as it sees the other phases."""
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with dtprof.profile(tmp_path, model=model, optimizer=opt, flush_interval_s=0.05) as prof:
        _train(prof, model, opt, steps=3)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            spans = dtprof.load_trace(tmp_path).spans
            if (spans["name"] == "backward").sum() == 3:
                break
            time.sleep(0.05)
        live = spans[spans["kind"] == "phase"]
    assert sorted(live[live["name"] == "backward"]["step"]) == [0, 1, 2]
    assert sorted(live[live["name"] == "forward"]["step"]) == [0, 1, 2]


def test_a_native_ring_is_read_in_order_and_its_losses_counted() -> None:
    """A ring the C++ kernel writes (the count written, then rows of ``width`` numbers), read as
    Python reads it: the rows that came since the last read, oldest first, around the ring's
    end; what was written over before it was read is counted, not made up."""
    size = 64
    memory = (ctypes.c_int64 * (1 + 3 * size))()
    ring = Ring(ctypes.addressof(memory), lambda: memory[0], width=3, size=size)

    def write(n: int) -> None:
        for _ in range(n):
            i = memory[0]
            at = 1 + 3 * (i % size)
            memory[at], memory[at + 1], memory[at + 2] = i // 2, 100 * i, 100 * i + 50
            memory[0] = i + 1

    assert ring.take().shape == (0, 3)
    write(3)
    assert ring.take().tolist() == [[0, 0, 50], [0, 100, 150], [1, 200, 250]]
    assert ring.take().shape == (0, 3)  # nothing new
    write(size - 5)  # up to two short of the end
    ring.take()
    write(4)  # two rows at the end, two from the start again
    assert ring.take()[:, 1].tolist() == [100 * i for i in range(size - 2, size + 2)]
    write(size + 10)  # Python fell behind by more than the ring holds
    starts = ring.take()[:, 1].tolist()
    assert ring.lost == 11  # the oldest slot left may be the one being written: not read
    assert starts == [100 * i for i in range(size + 2 + 11, 2 * size + 12)]


def test_native_spans_lost_between_takes_are_said_in_the_metadata(tmp_path: Path) -> None:
    """More spans between two takes than the kernel's ring holds (a forward and a backward a
    pass): the newest are kept, and meta.json says how many were lost."""
    native_kernel_or_skip()
    model = nn.Linear(2, 1)
    extra = 5
    # no tick of the writer's before the end: all the passes wait for one take
    with dtprof.profile(tmp_path, model=model, clock_sync=False, flush_interval_s=1e6):
        for _ in range(NativePhases.RING // 2 + extra):
            model(torch.ones(1, 2)).sum().backward()
    trace = dtprof.load_trace(tmp_path)
    assert len(trace.spans) == NativePhases.RING - 1
    assert (trace.spans["name"] == "backward").sum() == NativePhases.RING // 2
    lost = 2 * extra + 2  # and a data span
    assert trace.meta[0].phase_timing.startswith(f"native ({lost} rows lost")


@pytest.mark.parametrize("by_name", [False, True])
def test_a_step_given_a_closure_times_the_optimizer_from_where_the_closure_returned(
    tmp_path: Path, kernel: str, by_name: bool
) -> None:
    """A closure (LBFGS, Lightning) runs forward and backward inside the optimizer's step: the
    optimizer's phase starts where it returned, whether it is passed by position or name."""
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = model(torch.randn(4, 8)).sum()
        loss.backward()
        return loss

    with dtprof.profile(tmp_path, model=model, optimizer=opt, clock_sync=False) as prof:
        for _ in range(3):
            loss = opt.step(closure=closure) if by_name else opt.step(closure)
            assert isinstance(loss, torch.Tensor)  # the closure's result, handed back
            prof.step()
    trace = dtprof.load_trace(tmp_path)
    assert trace.meta[0].phase_timing.startswith(kernel)
    phases = trace.spans[trace.spans["kind"] == "phase"]
    for _, rows in phases.groupby("step"):
        t = rows.set_index("name")
        assert t.loc["forward", "end_ns"] <= t.loc["backward", "start_ns"]
        assert t.loc["backward", "end_ns"] <= t.loc["optimizer", "start_ns"]
    assert list(phases[phases["name"] == "optimizer"]["step"]) == [0, 1, 2]


def test_regions_nest_and_close_even_when_their_block_raises(tmp_path: Path, fake_clock) -> None:
    with dtprof.profile(tmp_path, clock_sync=False) as prof:
        vars(prof).pop("region", None)  # Python's regions, on the fake clock (the kernel's below)
        with prof.region("outer"), pytest.raises(KeyError), prof.region("inner"):
            raise KeyError("boom")
        prof.step()
    spans = dtprof.load_trace(tmp_path).spans
    rows = spans[["name", "depth", "start_ns", "end_ns"]].to_dict("records")
    inner, outer = rows
    assert (inner["name"], inner["depth"], outer["name"], outer["depth"]) == (
        "inner",
        1,
        "outer",
        0,
    )
    assert outer["start_ns"] < inner["start_ns"] < inner["end_ns"] < outer["end_ns"]
    assert inner["end_ns"] - inner["start_ns"] == 1000  # exactly one clock read apart


def _regions(prof) -> None:
    """Nested regions over two steps, the inner one of step 1 left by an exception."""
    for step in range(2):
        with prof.region("outer"):
            with prof.region("inner"):
                if step == 1:
                    with pytest.raises(KeyError), prof.region("deepest"):
                        raise KeyError("boom")
            with prof.region("inner"):
                pass
        prof.step()


def test_regions_are_the_same_natively_and_in_python(tmp_path: Path) -> None:
    """Where the kernel is loaded the profiler's ``region`` is its builtin, whose regions are
    C: the same spans (names, depths, steps, nesting) as Profiler.region's, the block's
    exception passed on; with GPU timing on, Profiler.region's own regions (CUDA events)."""
    native_kernel_or_skip()
    recorded = []
    for native in (True, False):
        model = torch.nn.Linear(2, 1)
        folder = tmp_path / str(native)
        with dtprof.profile(folder, model=model, clock_sync=False) as prof:
            if native:
                assert type(prof.region("x")).__name__ == "Region"
            else:
                del prof.region  # type: ignore[attr-defined]
                assert type(prof.region("x")).__name__ == "_Region"
            _regions(prof)
            assert prof._region_depth == 0  # type: ignore[union-attr]
        spans = dtprof.load_trace(folder).spans
        spans = spans[spans["kind"] == "region"].sort_values("start_ns", kind="stable")
        for row in spans.itertuples():
            inside = spans[(spans["start_ns"] < row.start_ns) & (row.end_ns < spans["end_ns"])]
            assert len(inside) == row.depth and row.start_ns < row.end_ns
        recorded.append(spans[["step", "name", "depth"]].to_records(index=False).tolist())
    assert recorded[0] == recorded[1]
    assert recorded[0][:3] == [(0, "outer", 0), (0, "inner", 1), (0, "inner", 1)]
    assert (1, "deepest", 2) in recorded[0]
    # on a CUDA job the GPU timer is set: the regions are Profiler.region's (faked here)
    model = torch.nn.Linear(2, 1)
    with dtprof.profile(tmp_path / "gpu", model=model, clock_sync=False) as prof:
        paired: list[tuple[object, ...]] = []

        class Timer:
            def mark(self) -> str:
                return "event"

            def pair(self, event: object, key: tuple[object, ...], *times: int) -> None:
                paired.append(key)

        prof.gpu_timer = Timer()  # type: ignore[union-attr, assignment]
        with prof.region("timed"):
            pass
        prof.gpu_timer = None  # type: ignore[union-attr]
    assert paired == [(0, "timed", "region", None, None)]


def test_a_failure_inside_a_native_region_never_reaches_its_block() -> None:
    """The region's depth unreadable (a failure inside the kernel): region_failed is told,
    the user's block runs and its own exception passes, nothing else is raised."""
    native_kernel_or_skip()
    from dtprof.record import native

    failures: list[str] = []

    class Recorder:  # what the native region reads of a profiler, less its depth
        def __init__(self) -> None:
            self.active, self.step_index, self.gpu_timer = True, 0, None
            self._switched_off: set[str] = set()
            self.spans: list[tuple[object, ...]] = []

        def hook_failed(self, name: str, exc: BaseException) -> None:
            failures.append(f"{name}: {type(exc).__name__}")

    recorder = Recorder()
    region = native.load()[0].profiler_region(recorder, None)  # type: ignore[union-attr]
    ran = []
    with pytest.raises(KeyError), region("data"):
        ran.append(True)
        raise KeyError("the block's own")
    assert ran == [True] and failures == ["region: AttributeError"] and not recorder.spans


def test_steps_phases_scalars_and_fingerprints(tmp_path: Path, kernel: str) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with dtprof.profile(tmp_path, model=model, optimizer=opt, fingerprint_every=2) as prof:
        _train(prof, model, opt)
    trace = dtprof.load_trace(tmp_path)
    assert list(trace.steps["step"]) == [0, 1, 2]
    assert trace.meta[0].phase_timing.startswith(kernel)
    phases = trace.spans[trace.spans["kind"] == "phase"].sort_values("start_ns", kind="stable")
    fingerprinting = phases[phases["name"] == "fingerprint"]
    assert list(fingerprinting["step"]) == [0, 2]  # its own span, charged to no step's phases
    phases = phases[phases["name"] != "fingerprint"]
    assert (
        phases.groupby("step")["name"].apply(list).tolist()
        == [["data", "forward", "backward", "optimizer"]] * 3
    )
    for step, rows in phases.groupby("step"):
        t = rows.set_index("name")
        assert t.loc["data", "end_ns"] == t.loc["forward", "start_ns"]
        assert t.loc["forward", "end_ns"] <= t.loc["backward", "start_ns"]
        assert t.loc["backward", "end_ns"] <= t.loc["optimizer", "start_ns"]
        step_row = trace.steps[trace.steps["step"] == step].iloc[0]
        assert step_row["start_ns"] <= rows["start_ns"].min()
        assert rows["end_ns"].max() <= step_row["end_ns"]
    scalars = trace.scalars.pivot(index="step", columns="name", values="value")
    assert list(scalars["step_plus_one"]) == [1.0, 2.0, 3.0]
    assert list(scalars["lr"]) == [0.1] * 3
    fps = trace.fingerprints
    assert sorted(fps["step"].unique()) == [0, 2]
    weight = model[0].weight.detach().double()
    last = fps[(fps["step"] == 2) & (fps["tensor"] == "0.weight")].iloc[0]
    assert last["sum"] == pytest.approx(weight.sum().item(), rel=1e-6)
    assert last["sumsq"] == pytest.approx(weight.pow(2).sum().item(), rel=1e-6)
    samples = trace.samples
    assert set(samples["metric"]) == {"rss_bytes"} and (samples["value"] > 1e6).all()
    meta = trace.meta[0]
    assert meta.status == "finished" and meta.steps == 3
    assert meta.nvml.available is False and meta.nvml.reason


def test_non_finite_scalars_are_kept(tmp_path: Path) -> None:
    with dtprof.profile(tmp_path, clock_sync=False) as prof:
        prof.log(loss=float("nan"), gnorm=torch.tensor(float("inf")))
        prof.step()
    values = dtprof.load_trace(tmp_path).scalars.set_index("name")["value"]
    assert values.isna()["loss"] and values["gnorm"] == float("inf")


class _Scalar(torch.Tensor):
    """A Python subclass: its value is item()'s to give."""


def test_the_native_kernel_reads_a_logged_tensor_as_item_does() -> None:
    native_kernel_or_skip()
    from dtprof.record import native

    read = native.load()[0].read_scalar  # type: ignore[union-attr]
    plain = [
        torch.tensor(1.5),
        torch.tensor(-2.25, dtype=torch.float64),
        torch.tensor(3.25, dtype=torch.float16),
        torch.tensor(-1.5, dtype=torch.bfloat16),
        torch.tensor(2**40 + 1),
        torch.tensor(-7, dtype=torch.int32),
        torch.tensor(300, dtype=torch.int16),
        torch.tensor(-3, dtype=torch.int8),
        torch.tensor(250, dtype=torch.uint8),
        torch.tensor(True),
        torch.tensor([[4.0]]),
        torch.arange(5.0)[3],  # a view at an offset into its storage
        torch.tensor(5.0, requires_grad=True) * 2,
        torch.nn.Parameter(torch.tensor(9.0)),
        torch.tensor(float("inf")),
    ]
    for tensor in plain:
        value = read(tensor)
        assert type(value) is float and value == float(tensor.item()), tensor
    # what it leaves to item(): a negated view, complex, a subclass (the same values)
    for tensor in (
        torch._neg_view(torch.tensor(3.0)),
        torch.tensor(1 + 2j),
        torch.tensor(2.0).as_subclass(_Scalar),
    ):
        assert read(tensor) == tensor.item()
    with pytest.raises(RuntimeError, match="3 elements"):
        read(torch.arange(3.0))  # item()'s own error


def test_a_logged_tensor_holds_its_value_at_the_log(tmp_path: Path, kernel: str) -> None:
    model = torch.nn.Linear(2, 1)
    with dtprof.profile(tmp_path, model=model, clock_sync=False) as prof:
        reader = prof.read_scalar  # type: ignore[union-attr]
        assert reader.__name__ == ("read_scalar" if kernel == "native" else "item")
        for step in range(3):
            loss = model(torch.ones(1, 2)).sum() * 0 + step + 0.5
            prof.log(loss=loss, count=torch.tensor(step, dtype=torch.int64))
            loss.data.fill_(-1.0)  # changed after the log: not what was logged
            prof.step()
    scalars = dtprof.load_trace(tmp_path).scalars
    assert scalars[scalars["name"] == "loss"]["value"].tolist() == [0.5, 1.5, 2.5]
    assert scalars[scalars["name"] == "count"]["value"].tolist() == [0.0, 1.0, 2.0]


def _log_everything(prof) -> None:
    """Three steps of log calls of every kind: what log() reads itself natively (floats, ints,
    plain CPU scalar tensors), what it hands to Profiler.log (a work name, a numpy float,
    positional arguments), and a value that cannot be read (step 2), which switches log off."""
    for step in range(3):
        prof.log(loss=torch.tensor(step + 0.5), lr=0.1, count=step, half=torch.tensor(1.5).half())
        prof.log(samples=8, gnorm=np.float64(2.5))
        with pytest.raises(TypeError):
            prof.log(1.0)  # what Profiler.log itself raises
        if step == 2:
            prof.log(loss=torch.arange(3.0))  # three values: log is off from here
            prof.log(loss=9.0)
        prof.step()
    prof.log(loss=9.0)  # nothing once the profile has ended


def test_log_records_the_same_natively_and_in_python(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the kernel is loaded the profiler's ``log`` is its builtin, which reads the common
    values itself and hands the rest to Profiler.log: the same rows, the same work noted, the
    same failure said, as Profiler.log alone."""
    native_kernel_or_skip()
    from dtprof.record.profiler import Profiler

    handed: list[tuple[str, ...]] = []
    python_log = Profiler.log

    def counted(self: Profiler, *args: object, **values: object) -> None:
        handed.append(tuple(values))
        python_log(self, *args, **values)

    monkeypatch.setattr(Profiler, "log", counted)
    recorded = []
    for native in (True, False):
        model = torch.nn.Linear(2, 1)
        folder = tmp_path / str(native)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with dtprof.profile(folder, model=model, clock_sync=False) as prof:
                if not native:
                    del prof.log  # type: ignore[attr-defined]
                assert ("log" in vars(prof)) is native
                _log_everything(prof)
                work = dict(prof.logged_work)  # type: ignore[union-attr]
        said = [str(w.message) for w in caught if w.category is DtprofWarning]
        trace = dtprof.load_trace(folder)
        rows = sorted(trace.scalars[["step", "name", "value"]].itertuples(index=False))
        recorded.append((rows, work, said, trace.meta[0].disabled_hooks))
    assert recorded[0] == recorded[1]
    rows, work, said, disabled = recorded[0]
    assert (0, "loss", 0.5) in rows and (2, "count", 2.0) in rows and (1, "gnorm", 2.5) in rows
    assert not [r for r in rows if r[1] == "loss" and r[2] == 9.0]
    assert work == {"samples": 0} and disabled == ("log",) and len(said) == 1
    # natively, Python saw only what the kernel does not read itself (then every call, in
    # Python's run: 3 steps of 3 calls, 2 more at step 2 and 1 after the end)
    natively = [("samples", "gnorm"), (), ("samples", "gnorm"), (), ("samples", "gnorm"), ()]
    assert handed[: len(natively) + 1] == [*natively, ("loss",)]
    assert len(handed) == len(natively) + 1 + 3 * 3 + 2 + 1


def test_a_failure_inside_the_native_log_switches_log_off() -> None:
    """The append failing (out of memory) reaches the profiler's hook_failed("log", exc),
    never the training step."""
    native_kernel_or_skip()
    from dtprof.record import native

    failures: list[tuple[str, BaseException]] = []

    class Full:
        def append(self, row: object) -> None:
            raise MemoryError("full")

    class Recorder:  # what the native log reads of a profiler
        def __init__(self) -> None:
            self.active, self.step_index, self._switched_off = True, 4, set()
            self.scalars = Full()

        def hook_failed(self, name: str, exc: BaseException) -> None:
            failures.append((name, exc))

    def python_log(**values: object) -> None:
        raise AssertionError("handed to Python")

    kernel = native.load()[0]
    log = kernel.profiler_log(Recorder(), python_log, WORK_NAMES)  # type: ignore[union-attr]
    assert log(loss=1.0) is None
    assert [(name, str(exc)) for name, exc in failures] == [("log", "full")]


class _Arrival:
    """Stands in for the CUDA event after a logged scalar's copy to the host."""

    def __init__(self) -> None:
        self.arrived = False

    def query(self) -> bool:
        return self.arrived

    def synchronize(self) -> None:
        self.arrived = True


def test_device_scalars_are_read_once_arrived_in_order_and_all_at_exit(tmp_path: Path) -> None:
    """The writer reads a device scalar's host copy only once its event has passed, never out
    of order; exit waits for the rest."""
    first, second, third = _Arrival(), _Arrival(), _Arrival()
    with dtprof.profile(tmp_path, clock_sync=False) as prof:
        for step, arrival in enumerate((first, second, third)):
            prof._pending_scalars.append((step, "loss", torch.tensor(step + 0.5), arrival))
        # (the writer thread resolves them too, at its own pace: the same outcome)
        prof._resolve_pending_scalars()
        assert [row[0] for row in prof._pending_scalars] == [0, 1, 2]
        second.arrived = True  # the first has not: nothing may pass it
        prof._resolve_pending_scalars()
        assert [row[0] for row in prof._pending_scalars] == [0, 1, 2]
        first.arrived = True
        prof._resolve_pending_scalars()
        assert [row[0] for row in prof._pending_scalars] == [2]
        prof.step()
    values = dtprof.load_trace(tmp_path).scalars.set_index("step")["value"]
    assert list(values) == [0.5, 1.5, 2.5] and third.arrived


def test_a_device_error_while_reading_a_scalar_loses_the_values_not_the_trace(
    tmp_path: Path,
) -> None:
    class Broken(_Arrival):
        def query(self) -> bool:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    warned = pytest.warns(DtprofWarning, match="the log hook raised RuntimeError")
    with warned, dtprof.profile(tmp_path, clock_sync=False) as prof:
        prof.log(lr=0.5)
        prof._pending_scalars.append((0, "loss", torch.tensor(1.0), Broken()))
        prof._resolve_pending_scalars()  # as the writer thread does
        prof.step()
        prof.log(lr=0.25)  # switched off: not recorded
        prof.step()
    trace = dtprof.load_trace(tmp_path)
    assert list(trace.scalars["value"]) == [0.5]
    assert trace.meta[0].status == "finished" and "log" in trace.meta[0].disabled_hooks


def test_a_raising_hook_is_switched_off_with_one_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kernel: str
) -> None:
    """The work of a step's first forward pass raises (the native forward hands that pass to
    Python, which counts its FLOPs): training goes on, the phases are off, said once."""

    def broken(*args: object) -> list[object]:
        raise ValueError("injected")

    monkeypatch.setattr("dtprof.record.phases.StepWork.forward_begins", broken)
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with dtprof.profile(tmp_path, model=model, optimizer=opt) as prof:
            _train(prof, model, opt, steps=4)
    ours = [str(w.message) for w in caught if w.category is DtprofWarning]
    assert ours == [
        "dtprof: the phases hook raised ValueError: injected; it is switched off "
        "and training goes on"
    ]
    trace = dtprof.load_trace(tmp_path)
    assert list(trace.steps["step"]) == [0, 1, 2, 3]  # training went on, steps still recorded
    assert trace.meta[0].disabled_hooks == ("phases",)
    errors = trace.events[trace.events["kind"] == "hook-error"]
    assert len(errors) == 1 and "injected" in errors.iloc[0]["detail"]
    # the forward of step 0 was recorded before the failure; nothing of the phases after it
    assert trace.spans[trace.spans["kind"] == "phase"]["step"].max() == 0


def test_the_step_ends_natively_and_a_failure_there_leaves_it_to_python(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the kernel times the phases, the profiler's ``step`` is its builtin (the step's
    row, memory and fingerprints when due, the counts, the next step). The extras raising
    inside it (step 2's; fingerprints every 2 steps) switch the phases off with one warning, and
    Profiler.step ends that step: every step recorded once, memory and fingerprints still read."""
    native_kernel_or_skip()
    from dtprof.record.profiler import Profiler

    extras = Profiler._step_extras
    raised: list[int] = []

    def once(self: Profiler, step: int, t: int) -> int:
        if step == 2 and not raised:
            raised.append(step)
            raise ValueError("injected")
        return extras(self, step, t)

    monkeypatch.setattr(Profiler, "_step_extras", once)
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with dtprof.profile(tmp_path, model=model, optimizer=opt, fingerprint_every=2) as prof:
            assert "step" in vars(prof)  # the native step
            _train(prof, model, opt, steps=2)
            assert prof.step_index == 2 and prof.phases.native.state[0] == 2
            _train(prof, model, opt, steps=3)
            assert "step" not in vars(prof) and prof.step_index == 5
    ours = [str(w.message) for w in caught if w.category is DtprofWarning]
    assert ours == [
        "dtprof: the phases hook raised ValueError: injected; it is switched off "
        "and training goes on"
    ]
    trace = dtprof.load_trace(tmp_path)
    assert list(trace.steps["step"]) == [0, 1, 2, 3, 4]
    assert sorted(trace.fingerprints["step"].unique()) == [0, 2, 4]
    assert 0 in set(trace.samples["step"])  # memory read at the first step's end
    timed = {"data", "forward", "backward", "optimizer"}
    phases = trace.spans[trace.spans["name"].isin(timed) & (trace.spans["kind"] == "phase")]
    assert set(phases[phases["step"] < 2]["name"]) == timed
    assert phases["step"].max() == 2  # the phases of the step that failed, none after


def test_memory_is_read_at_step_ends_at_most_every_50_ms_under_either_kernel(
    tmp_path: Path, kernel: str
) -> None:
    """The step's end decides when memory is due (Python's step or the kernel's): the first
    step's end, then one at least 50 ms after the last reading; each step's row once."""
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with dtprof.profile(tmp_path, model=model, optimizer=opt, clock_sync=False) as prof:
        _train(prof, model, opt, steps=3)  # quick steps: memory read at the first only
        time.sleep(0.06)
        _train(prof, model, opt, steps=2)  # the first of these: 50 ms on
    trace = dtprof.load_trace(tmp_path)
    assert trace.meta[0].phase_timing.startswith(kernel)
    assert list(trace.steps["step"]) == [0, 1, 2, 3, 4]
    rss = trace.samples[trace.samples["metric"] == "rss_bytes"].sort_values("ts_ns")
    assert {0, 3} <= set(rss["step"]) and rss["step"].is_unique
    assert (rss["ts_ns"].diff().dropna() >= 50_000_000).all()
    assert (abs(rss["value"] / rss_bytes() - 1) < 0.5).all()  # this process's, in bytes


def test_a_job_that_uses_cuda_has_its_memory_read_with_the_allocators_figures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kernel: str
) -> None:
    """Once torch.cuda is initialized (faked here), the step's end reads the caching
    allocator's figures beside the RSS, whichever kernel ends the step."""
    stats = {"allocated_bytes": {"all": {"current": 5, "peak": 7}}, "num_ooms": 0}
    monkeypatch.setattr(torch.cuda, "_initialized", True)
    monkeypatch.setattr(torch.cuda, "memory_stats_as_nested_dict", lambda: stats)
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with dtprof.profile(tmp_path, model=model, optimizer=opt, clock_sync=False) as prof:
        _train(prof, model, opt, steps=2)
    trace = dtprof.load_trace(tmp_path)
    assert trace.meta[0].phase_timing.startswith(kernel) and not trace.meta[0].disabled_hooks
    first = trace.samples[trace.samples["step"] == 0].set_index("metric")["value"]
    assert first["cuda_allocated_bytes"] == 5 and first["cuda_max_allocated_bytes"] == 7
    assert first["rss_bytes"] > 0


def test_a_full_disk_stops_recording_with_one_warning_and_training_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with dtprof.profile(tmp_path, model=model, optimizer=opt, flush_interval_s=0.05) as prof:
            _train(prof, model, opt, steps=2)
            prof._tick()  # as the writer thread does: the native kernel's rows taken
            prof.writer.flush()  # two steps safely on disk

            def disk_full(self: object, frame: bytes, rows: int) -> None:
                raise OSError(28, "No space left on device")

            monkeypatch.setattr("dtprof.record.writer._Segment.append_frames", disk_full)
            _train(prof, model, opt, steps=3)
            prof.writer.flush()
            _train(prof, model, opt, steps=3)  # hooks are off now: nothing more is queued
            assert not any(prof.writer.buffers.values())
    ours = [str(w.message) for w in caught if w.category is DtprofWarning]
    assert ours == [
        "dtprof: trace writing stopped ([Errno 28] No space left on device); training goes on"
    ]
    trace = dtprof.load_trace(tmp_path)
    assert list(trace.steps["step"]) == [0, 1]
    assert trace.meta[0].status == "recording stopped: [Errno 28] No space left on device"


def test_disabled_by_argument_or_environment_records_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prof = dtprof.profile(tmp_path / "a", enabled=False)
    assert isinstance(prof, NullProfiler)
    monkeypatch.setenv("DTPROF_DISABLE", "1")
    with dtprof.profile(tmp_path / "b") as prof:
        with prof.region("x"):
            prof.log(loss=1.0)
        prof.step()
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


@pytest.fixture
def world_of_one():
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    yield
    dist.destroy_process_group()
    gc.collect()  # the group's garbage (DDP models, profilers) goes here, not in a later fork


def test_collectives_in_a_world_of_one_and_the_api_restored_after(
    tmp_path: Path, world_of_one
) -> None:
    original = dist.all_reduce
    with dtprof.profile(tmp_path) as prof:
        assert dist.all_reduce is not original
        t = torch.ones(16)
        dist.all_reduce(t)
        work = dist.all_reduce(t, async_op=True)
        work.wait()
        dist.broadcast(t, 0)
        dist.barrier()
        prof.step()
    assert dist.all_reduce is original
    assert dist.distributed_c10d.all_reduce is original
    coll = dtprof.load_trace(tmp_path).collectives
    assert list(coll["op"]) == ["all_reduce", "all_reduce", "broadcast", "barrier"]
    assert list(coll["seq"]) == [0, 1, 2, 3]
    assert list(coll["bytes"]) == [64, 64, 64, 0]
    assert list(coll["async_op"]) == [False, True, False, False]
    assert (coll["end_ns"] >= coll["start_ns"]).all()


def test_an_async_collective_launched_into_a_graph_capture_gets_no_callback(
    tmp_path: Path, world_of_one, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a callback's streams would join the capture and never leave it: the user's graph breaks
    from dtprof.record import comms, gpu_timing

    callbacks: list[int] = []
    on_future = comms.CommRecorder._on_future
    monkeypatch.setattr(gpu_timing, "capturing", lambda: True)
    monkeypatch.setattr(
        comms.CommRecorder, "_on_future", lambda *a: callbacks.append(1) or on_future(*a)
    )
    with dtprof.profile(tmp_path) as prof:
        dist.all_reduce(torch.ones(4), async_op=True).wait()
        prof.step()
    coll = dtprof.load_trace(tmp_path).collectives
    assert list(coll["op"]) == ["all_reduce"] and list(coll["async_op"]) == [True]
    assert callbacks == []


def test_every_collective_of_the_api_is_wrapped(tmp_path: Path, world_of_one) -> None:
    t = torch.ones(4)
    calls = {
        "all_reduce": lambda: dist.all_reduce(t),
        "all_reduce_coalesced": lambda: dist.all_reduce_coalesced([t, t.clone()]),
        "all_gather": lambda: dist.all_gather([torch.empty(4)], t),
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(torch.empty(4), t),
        "reduce_scatter": lambda: dist.reduce_scatter(torch.empty(4), [t]),
        "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(torch.empty(4), t),
        "broadcast": lambda: dist.broadcast(t, 0),
        "reduce": lambda: dist.reduce(t, 0),
        "all_to_all": lambda: dist.all_to_all([torch.empty(4)], [t]),
        "all_to_all_single": lambda: dist.all_to_all_single(torch.empty(4), t),
        "barrier": lambda: dist.barrier(),
        "monitored_barrier": lambda: dist.monitored_barrier(),
        "gather": lambda: dist.gather(t, [torch.empty(4)], 0),
        "scatter": lambda: dist.scatter(t, [torch.ones(4)], 0),
    }
    with dtprof.profile(tmp_path) as prof:
        for call in calls.values():
            call()
        prof.step()
    coll = dtprof.load_trace(tmp_path).collectives
    assert list(coll["op"]) == list(calls)
    assert list(coll["seq"]) == list(range(len(calls)))
    assert coll["label"].isna().all()  # none failed


def test_a_second_profile_in_the_same_process_is_refused_not_fatal(
    tmp_path: Path, world_of_one
) -> None:
    with dtprof.profile(tmp_path / "a") as outer:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with dtprof.profile(tmp_path / "b") as inner:
                dist.barrier()
                inner.step()
        outer.step()
    assert isinstance(inner, NullProfiler)
    assert any("already recording" in str(w.message) for w in caught)
    assert len(dtprof.load_trace(tmp_path / "a").collectives) == 1
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize("ddp_buckets", [True, False])
def test_ddp_buckets_are_recorded_through_the_comm_hook_unless_switched_off(
    tmp_path: Path, world_of_one, ddp_buckets: bool
) -> None:
    model = nn.parallel.DistributedDataParallel(nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with dtprof.profile(tmp_path, model=model, optimizer=opt, ddp_buckets=ddp_buckets) as prof:
        _train(prof, model, opt, steps=2)
    trace = dtprof.load_trace(tmp_path)
    labels = list(trace.collectives["label"])
    assert labels == (["ddp.bucket0"] * 2 if ddp_buckets else [])
    assert trace.meta[0].config.ddp_buckets is ddp_buckets
    assert len(trace.steps) == 2


@pytest.mark.parametrize("ddp_buckets", [True, "comm_hook"])
def test_a_recorded_model_copies_and_saves_and_its_copies_record_nothing(
    tmp_path: Path, world_of_one, ddp_buckets: bool | str, kernel: str
) -> None:
    """An EMA model deep-copied mid-training, or the whole model saved with torch.save: both
    work as without dtprof, and the copy's passes are not the recorded model's phases."""
    model = nn.parallel.DistributedDataParallel(nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    saved = tmp_path / "model.pt"
    with dtprof.profile(tmp_path / "trace", model=model, optimizer=opt, ddp_buckets=ddp_buckets):
        ema = copy.deepcopy(model)
        torch.save(model, saved)
        for _ in range(3):
            ema(torch.randn(4, 8)).sum().backward()
    loaded = torch.load(saved, weights_only=False)
    with torch.no_grad():
        model.module.weight.add_(1.0)  # each copy runs its own weights, not the model's
    x = torch.randn(4, 8)
    assert torch.equal(loaded(x), loaded.module(x))
    assert torch.equal(ema(x), ema.module(x))
    assert not torch.equal(ema(x), model(x))
    spans = dtprof.load_trace(tmp_path / "trace").spans
    assert not spans["name"].isin(["forward", "backward"]).any()


class _OwnForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return self.linear(x) * scale


def test_the_forward_is_timed_without_module_hooks_and_given_back(
    tmp_path: Path, kernel: str
) -> None:
    """The model takes nn.Module's fast path (no hooks), its forward's signature reads as its
    own while recorded (Hugging Face's Trainer keeps the columns it names), and after the
    profile the model has the forward it had: its class's, or one set on the instance."""
    plain, own = _OwnForward(), _OwnForward()
    doubled = lambda x, scale=1.0: _OwnForward.forward(own, x, scale) * 2  # noqa: E731
    own.forward = doubled  # type: ignore[method-assign]
    x = torch.randn(4, 8)
    for model in (plain, own):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        before = model(x)
        with dtprof.profile(tmp_path / str(id(model)), model=model, optimizer=opt) as prof:
            assert not model._forward_hooks and not model._forward_pre_hooks
            assert list(inspect.signature(model.forward).parameters) == ["x", "scale"]
            assert torch.equal(model(x), before)
            _train(prof, model, opt, steps=2)
        phases = dtprof.load_trace(tmp_path / str(id(model))).spans
        forwards = phases[phases["name"] == "forward"]["step"]
        assert list(forwards) == [0, 0, 1]  # the call above, then one per step
    assert "forward" not in vars(plain)
    assert vars(own)["forward"] is doubled


def test_a_compiled_model_is_timed_through_its_wrapped_forward(tmp_path: Path, kernel: str) -> None:
    """torch.compile traces the model's call, dtprof's forward wrapper included: training runs
    as without dtprof and each step still has its forward."""
    model = _OwnForward()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    compiled = torch.compile(model, backend="eager")
    x = torch.randn(4, 8)
    with (
        warnings.catch_warnings(),  # dynamo's warning about the clock it cannot trace
        dtprof.profile(tmp_path, model=model, optimizer=opt, clock_sync=False) as prof,
    ):
        warnings.simplefilter("ignore")
        for _ in range(3):
            out = compiled(x)
            assert torch.equal(out, model.linear(x))
            out.sum().backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    phases = dtprof.load_trace(tmp_path).spans
    assert list(phases[phases["name"] == "forward"]["step"]) == [0, 1, 2]


def test_a_forward_wrapped_again_while_recorded_still_runs_after(
    tmp_path: Path, kernel: str
) -> None:
    """Something that wraps the model's forward after dtprof did (as Accelerate does) keeps
    working when the profile ends: dtprof's wrapper stays inside it, timing nothing."""
    model = _OwnForward()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with dtprof.profile(tmp_path, model=model, optimizer=opt) as prof:
        timed = model.forward
        model.forward = lambda x: timed(x) + 1  # type: ignore[method-assign]
        _train(prof, model, opt, steps=2)
    x = torch.randn(4, 8)
    assert torch.equal(model(x), model.linear(x) + 1)
    phases = dtprof.load_trace(tmp_path).spans
    assert list(phases[phases["name"] == "forward"]["step"]) == [0, 1]
