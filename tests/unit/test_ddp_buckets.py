"""DDP's buckets seen at the dispatcher, in one process (a gloo world of one): what is recorded,
by the native kernel and by the Python one, that nothing of DDP changes, that the kernel goes
at exit, and the fallbacks: the Python kernel where the native one cannot be had, the comm hook
where neither can."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

import dtprof
from dtprof.jobs.launch import free_port
from dtprof.record import comms, ddp_buckets
from dtprof.record.ddp_buckets import BucketWatch, NativeBuckets
from dtprof.record.writer import DtprofWarning
from dtprof.trace import live
from dtprof.trace.schema import COLLECTIVES
from tests.conftest import native_kernel_or_skip

PARAM_BYTES = 4 * (128 * 128 + 128) * 4


@pytest.fixture
def world_of_one() -> Iterator[None]:
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    yield
    dist.destroy_process_group()
    gc.collect()  # the group's garbage (DDP models, profilers) goes here, not in a later fork


def _model(**kwargs: Any) -> tuple[DDP, torch.optim.Optimizer]:
    torch.manual_seed(0)
    layers = [nn.Linear(128, 128) for _ in range(4)]
    model = DDP(nn.Sequential(*layers), bucket_cap_mb=0.1, **kwargs)
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def _train(model: DDP, opt: torch.optim.Optimizer, prof: Any, steps: int) -> None:
    for step in range(steps):
        x = torch.randn(8, 128, generator=torch.Generator().manual_seed(step))
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
        prof.step()


def _same(a: DDP, b: DDP) -> bool:
    pairs = zip(a.parameters(), b.parameters(), strict=True)
    return all(torch.equal(x, y) for x, y in pairs)


def _kernels() -> int:
    """Kernels registered from Python for c10d::allreduce_ under the autograd keys."""
    dump = torch._C._dispatch_dump("c10d::allreduce_")
    return sum(line.startswith("Autograd") for line in dump.splitlines())


def test_buckets_are_recorded_without_a_comm_hook_and_the_kernel_goes_at_exit(
    tmp_path: Path, world_of_one: None, kernel: str
) -> None:
    model, opt = _model()
    bare, bare_opt = _model()
    with dtprof.profile(tmp_path, model=model, optimizer=opt) as prof:
        assert _kernels() == 2
        _train(model, opt, prof, 3)
        dist.all_reduce(torch.ones(4))  # through the Python API: recorded there, once
    assert _kernels() == 0
    assert model.reducer is not None and not getattr(model, "_dtprof_comm_hook", False)
    _train(bare, bare_opt, dtprof.profile(tmp_path / "off", enabled=False), 3)
    assert _same(model, bare)

    trace = dtprof.load_trace(tmp_path)
    assert trace.meta[0].ddp_buckets_via == "dispatcher"
    assert trace.meta[0].ddp_buckets_kernel == kernel
    # rows are written as operations complete: a bucket's may come after a later sync call's
    coll = trace.collectives.sort_values("seq", ignore_index=True)
    buckets = coll[coll["label"].notna()]
    assert buckets["label"].str.fullmatch(r"ddp\.bucket\d+").all()
    assert (buckets.groupby("step")["bytes"].sum() == PARAM_BYTES).all()
    # numbered from 0 within every backward pass, in launch order
    for _, labels in buckets.groupby("step")["label"]:
        assert list(labels) == [f"ddp.bucket{i}" for i in range(len(labels))]
    assert len(coll[coll["label"].isna()]) == 1
    assert list(coll["seq"]) == list(range(len(coll)))
    assert (coll["end_ns"] >= coll["start_ns"]).all()


def test_a_model_attached_mid_run_has_its_buckets_stamped_with_the_step_in_progress(
    tmp_path: Path, world_of_one: None, kernel: str
) -> None:
    model, opt = _model()
    with dtprof.profile(tmp_path) as prof:
        _train(model, opt, prof, 2)  # steps 0 and 1, the model not yet attached
        prof.attach(model=model, optimizer=opt)
        _train(model, opt, prof, 2)
    coll = dtprof.load_trace(tmp_path).collectives
    assert sorted(set(coll.loc[coll["label"].notna(), "step"])) == [2, 3]


def test_a_comm_hook_of_the_users_own_keeps_working_and_its_buckets_are_recorded(
    tmp_path: Path, world_of_one: None, kernel: str
) -> None:
    model, opt = _model()
    calls = []

    def hook(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        calls.append(bucket.index())
        return default_hooks.allreduce_hook(state, bucket)

    # DDP checks the annotations, which this module's future import makes strings
    hook.__annotations__ = {"bucket": dist.GradBucket, "return": torch.futures.Future[torch.Tensor]}
    model.register_comm_hook(None, hook)
    with dtprof.profile(tmp_path, model=model, optimizer=opt) as prof:
        _train(model, opt, prof, 2)
    assert calls
    coll = dtprof.load_trace(tmp_path).collectives
    # the stock hook reduces through dist.all_reduce: recorded there, not a second time here
    assert (
        len(coll) == len(calls)
        and coll.groupby("step")["bytes"].sum().tolist() == [PARAM_BYTES] * 2
    )


def test_used_parameters_map_is_labelled_apart_from_the_buckets(
    tmp_path: Path, world_of_one: None, kernel: str
) -> None:
    model, opt = _model(find_unused_parameters=True)
    with warnings.catch_warnings(), dtprof.profile(tmp_path, model=model, optimizer=opt) as prof:
        warnings.simplefilter("ignore")
        _train(model, opt, prof, 2)
    coll = dtprof.load_trace(tmp_path).collectives
    used = coll[coll["label"] == "ddp.used_parameters"]
    assert len(used) == 2 and set(used["dtype"]) == {"int32"}
    buckets = coll[coll["label"] != "ddp.used_parameters"]
    assert (buckets.groupby("step")["bytes"].sum() == PARAM_BYTES).all()


def test_a_kernel_that_raises_is_switched_off_and_training_goes_on(
    tmp_path: Path, world_of_one: None, monkeypatch: pytest.MonkeyPatch, kernel: str
) -> None:
    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("planted")

    if kernel == "native":  # its records fail to become rows
        monkeypatch.setattr(NativeBuckets, "_frame", broken)
    else:
        monkeypatch.setattr(comms.CommRecorder, "launched", broken)
    model, opt = _model()
    bare, bare_opt = _model()
    planted = "ddp buckets hook raised RuntimeError: planted"
    with (
        pytest.warns(DtprofWarning, match=planted),
        dtprof.profile(tmp_path, model=model, optimizer=opt) as prof,
    ):
        _train(model, opt, prof, 3)
    _train(bare, bare_opt, dtprof.profile(tmp_path / "off", enabled=False), 3)
    assert _same(model, bare)
    trace = dtprof.load_trace(tmp_path)
    assert trace.meta[0].disabled_hooks == ("ddp buckets",)
    assert len(trace.steps) == 3 and _kernels() == 0


def test_where_the_native_kernel_cannot_watch_the_python_kernel_records_the_buckets(
    tmp_path: Path, world_of_one: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    native_kernel_or_skip()

    def refused(self: NativeBuckets, model: DDP) -> None:
        raise RuntimeError("refused\nsecond line")

    monkeypatch.setattr(NativeBuckets, "watch", refused)
    model, opt = _model()
    with dtprof.profile(tmp_path, model=model, optimizer=opt) as prof:
        _train(model, opt, prof, 2)
    assert _kernels() == 0
    meta = dtprof.load_trace(tmp_path).meta[0]
    assert (meta.ddp_buckets_kernel, meta.ddp_buckets_native) == (
        "python",
        "unavailable: refused",
    )
    coll = dtprof.load_trace(tmp_path).collectives
    assert (coll.groupby("step")["bytes"].sum() == PARAM_BYTES).all()


def test_where_no_kernel_can_be_registered_a_comm_hook_records_the_buckets(
    tmp_path: Path, world_of_one: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refused(self: BucketWatch, model: DDP) -> None:
        raise RuntimeError("a kernel is already registered\nsecond line")

    monkeypatch.setenv("DTPROF_NATIVE", "0")
    monkeypatch.setattr(BucketWatch, "watch", refused)
    model, opt = _model()
    with dtprof.profile(tmp_path, model=model, optimizer=opt) as prof:
        _train(model, opt, prof, 2)
    trace = dtprof.load_trace(tmp_path)
    meta = trace.meta[0]
    assert meta.ddp_buckets_via == "comm_hook"
    assert meta.ddp_buckets_dispatcher == "unavailable: a kernel is already registered"
    assert getattr(model, "_dtprof_comm_hook", False)
    coll = trace.collectives
    assert coll["label"].str.fullmatch(r"ddp\.bucket\d+").all()
    assert (coll.groupby("step")["bytes"].sum() == PARAM_BYTES).all()


def test_ddp_buckets_takes_true_false_or_comm_hook(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="ddp_buckets must be True, False or 'comm_hook'"):
        dtprof.profile(tmp_path, ddp_buckets="dispatcher")


def test_parameters_on_another_device_are_left_to_the_comm_hook() -> None:
    class OnMeta:
        process_group = None

        def parameters(self) -> list[torch.Tensor]:
            return [torch.empty(4, device="meta")]

    with pytest.raises(RuntimeError, match="parameters on meta: the kernel is for cpu, cuda"):
        BucketWatch(None).watch(OnMeta())  # type: ignore[arg-type]


class _FakeOps:
    """The native library's take_buckets builtin and operators, fed by the test."""

    def __init__(self) -> None:
        self.done: list[tuple[int, ...]] = []
        self.pending_rows: list[tuple[int, ...]] = []
        self.failure = ""

    def take(self) -> tuple[str, bytes, list[tuple[int, ...]]]:
        rows, self.done = self.done, []
        done = np.array(rows, dtype=np.int64).reshape(-1, ddp_buckets.FIELDS).tobytes()
        return self.failure, done, list(self.pending_rows)

    def anchor(self, device: int) -> int:
        self.anchors = getattr(self, "anchors", 0) + 1
        return 40_000  # the anchor's error bound, ns

    def gpu_dropped(self) -> int:
        return 3

    def uninstall(self) -> None:
        pass


class _FakeRecorder:
    """The CommRecorder, profiler and writer NativeBuckets hands its records to."""

    def __init__(self, folder: Path) -> None:
        self.inflight: dict[int, tuple[Any, ...]] = {}
        self.failed: list[str] = []
        self.prof = self.writer = self
        self.gpu_spans: list[tuple[Any, ...]] = []
        self.gpu_timer: Any = None
        self.segment = folder / live.segment_name(0)
        self.segment.write_bytes(live.header(COLLECTIVES))

    def hook_failed(self, name: str, exc: BaseException) -> None:
        self.failed.append(f"{name}: {exc}")

    def add_frame(self, table: str, rows: int, frame: bytes) -> None:
        assert table == "collectives"
        with open(self.segment, "ab") as f:
            f.write(frame)

    def rows(self) -> list[tuple[Any, ...]]:
        table, _ = live.read(self.segment, COLLECTIVES)
        return [tuple(row.values()) for row in table.to_pylist()]


def _row(
    rid: int, seq: int, bucket: int, end: int = -1, error: int = 0, gpu: int = -1
) -> tuple[int, ...]:
    # id, slot, seq, step, start, end, bytes, dtype, floating, bucket, error, GPU start, end
    gpu_end = gpu + 500 if gpu >= 0 else -1
    floating = int(bucket >= 0)
    return (rid, 0, seq, 7, 1000 + rid, end, 64, 6, floating, bucket, error, gpu, gpu_end)


def test_native_records_become_rows_in_flight_first_and_labelled_by_their_bucket(
    tmp_path: Path,
) -> None:
    ops, recorder = _FakeOps(), _FakeRecorder(tmp_path)
    native = type(
        "N",
        (),
        {
            "ops": ops,
            "take_buckets": ops.take,
            "dtype_name": staticmethod(lambda c: "float32"),
            "frame_of": staticmethod(live.frame_of),
        },
    )()
    watch = NativeBuckets(recorder, native)  # type: ignore[arg-type]
    watch.names[0] = "0"
    # tick 1: bucket 0 done, bucket 1 still in flight
    ops.done, ops.pending_rows = [_row(0, 0, 0, end=2000)], [_row(1, 1, 1)]
    watch.sync()
    assert recorder.rows() == [(7, "0", 0, "all_reduce", 64, "float32", None, 1000, 2000, True,
                                "ddp.bucket0")]  # fmt: skip
    assert recorder.inflight == {
        -2: (7, "0", 1, "all_reduce", 64, "float32", None, 1001, True, "ddp.bucket1")
    }
    # tick 2: it completes with an error; the next backward pass's bucket 0, and the integer
    # map of used parameters (no bucket)
    ops.done = [_row(1, 1, 1, end=3000, error=1), _row(2, 2, 0, end=3500),
                _row(3, 3, -1, end=3600)]  # fmt: skip
    ops.pending_rows = []
    watch.sync()
    assert [(r[2], r[8], r[10]) for r in recorder.rows()[1:]] == [
        (1, 3000, "ddp.bucket1;error"),
        (2, 3500, "ddp.bucket0"),
        (3, 3600, "ddp.used_parameters"),
    ]
    assert recorder.inflight == {}
    # a failure the library reports switches the recording off, once
    ops.failure = "reading the call: boom"
    watch.sync()
    watch.sync()
    assert recorder.failed == ["ddp buckets: reading the call: boom"] and not watch.enabled


def test_build_native_fails_in_one_line_naming_the_source(tmp_path: Path) -> None:
    env = dict(os.environ, CXX="false", DTPROF_CACHE_DIR=str(tmp_path / "cache"))
    done = subprocess.run(
        [sys.executable, "-m", "dtprof", "build-native"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    errors = [line for line in done.stderr.splitlines() if line.startswith("dtprof: error: ")]
    assert len(errors) == 1, done.stderr
    assert "buckets.cpp + " in errors[0]
    assert "phases.cpp + " in errors[0] and "scalars.cpp + " in errors[0]
    assert "regions.cpp + " in errors[0]
    assert "frames.cpp: building the native kernel failed" in errors[0]
    assert "Traceback" not in done.stderr
    assert "profiler-trace reader built at install" in done.stdout  # the install built it


def test_the_kernel_is_built_at_its_first_use_and_a_failed_build_is_not_tried_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from dtprof.errors import DtprofError
    from dtprof.record import native

    monkeypatch.setenv("DTPROF_NATIVE_DIR", str(tmp_path / "native"))
    monkeypatch.setattr(native, "_loaded", None)
    monkeypatch.setattr(native, "_has_ops", lambda torch: False)  # as if never loaded here
    tries: list[int] = []

    def no_compiler(verbose: bool = False) -> Path:
        tries.append(1)
        raise DtprofError("cannot build the native kernel: ninja is required")

    monkeypatch.setattr(native, "build", no_compiler)
    assert native.load() == (None, "cannot build the native kernel: ninja is required")
    assert "building the native recording kernel for this torch (once" in capsys.readouterr().err
    kernel, why = native.load()
    assert kernel is None and why.startswith("cannot build the native kernel: ninja is required")
    assert "`dtprof build-native` tries again" in why and tries == [1]  # remembered, not retried
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("LOCAL_RANK", "1")  # another rank of the node: waits, says nothing
    native.failure_path().unlink()
    native.load()
    assert capsys.readouterr().err == "" and tries == [1, 1]


def test_native_buckets_timed_on_the_gpu_become_gpu_spans_rows(tmp_path: Path) -> None:
    ops, recorder = _FakeOps(), _FakeRecorder(tmp_path)
    recorder.gpu_timer = SimpleNamespace(timed=0, dropped_native=0, anchor_error_ns=10)
    native = type(
        "N",
        (),
        {
            "ops": ops,
            "take_buckets": ops.take,
            "dtype_name": staticmethod(lambda c: "float32"),
            "frame_of": staticmethod(live.frame_of),
        },
    )()
    watch = NativeBuckets(recorder, native)  # type: ignore[arg-type]
    watch.names[0] = "0"
    watch._gpu = 0  # as watch() sets it for a model on cuda:0
    ops.done = [_row(0, 0, 0, end=2000, gpu=4000), _row(1, 1, 1, end=2100)]  # one not timed
    watch.sync()
    assert recorder.gpu_spans == [(7, "all_reduce", "collective", "0", 0, 1000, 2000, 4000, 4500)]
    assert [r[2] for r in recorder.rows()] == [0, 1]  # both are collectives rows
    timer = recorder.gpu_timer
    assert (timer.timed, timer.dropped_native, timer.anchor_error_ns) == (1, 3, 40_000)
    assert ops.anchors == 1  # the anchor was due: renewed on the writer's tick


def test_the_native_kernel_uses_nccls_timing_only_on_a_group_whose_cuda_backend_is_nccl(
    world_of_one: None,
) -> None:
    native_kernel_or_skip()
    from dtprof.record import native

    ops = native.load()[0].ops
    ops.install()
    try:
        slot = int(ops.watch(dist.group.WORLD.boxed()))
        assert not ops.use_nccl_timing(slot)  # gloo's
        with pytest.raises(RuntimeError, match="no watched group"):
            ops.use_nccl_timing(slot + 1)
    finally:
        ops.uninstall()
