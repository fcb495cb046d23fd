"""The NVML sampler's logic, with a stand-in pynvml: this machine has no GPU."""

from __future__ import annotations

import sys
import types
from collections import deque
from types import SimpleNamespace

import pytest

from dtprof.record import gpu
from dtprof.trace.meta import Nvml


class _NVMLError(Exception):
    pass


def _fake_pynvml(fail_init: bool = False, no_power: bool = False) -> types.ModuleType:
    m = types.ModuleType("pynvml")
    m.NVMLError = _NVMLError  # type: ignore[attr-defined]
    m.NVML_CLOCK_SM = 1  # type: ignore[attr-defined]
    m.NVML_TEMPERATURE_GPU = 0  # type: ignore[attr-defined]

    def init() -> None:
        if fail_init:
            raise _NVMLError("NVML Shared Library Not Found")

    def power(handle: object) -> int:
        if no_power:
            raise _NVMLError("Not Supported")
        return 312_500

    m.nvmlInit = init  # type: ignore[attr-defined]
    m.nvmlDeviceGetHandleByIndex = lambda i: ("handle", i)  # type: ignore[attr-defined]
    m.nvmlDeviceGetName = lambda h: b"NVIDIA H100"  # type: ignore[attr-defined]
    m.nvmlDeviceGetUtilizationRates = lambda h: SimpleNamespace(gpu=87, memory=40)  # type: ignore[attr-defined]
    m.nvmlDeviceGetMemoryInfo = lambda h: SimpleNamespace(used=2**34)  # type: ignore[attr-defined]
    m.nvmlDeviceGetPowerUsage = power  # type: ignore[attr-defined]
    m.nvmlDeviceGetClockInfo = lambda h, kind: 1980  # type: ignore[attr-defined]
    m.nvmlDeviceGetTemperature = lambda h, kind: 61  # type: ignore[attr-defined]
    return m


@pytest.fixture
def cuda_present(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr("torch.cuda.current_device", lambda: 1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")


def _prof() -> SimpleNamespace:
    return SimpleNamespace(samples=deque(), step_index=7)


def test_samples_every_metric_of_the_ranks_physical_device(monkeypatch, cuda_present) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml())
    prof = _prof()
    sampler = gpu.NvmlSampler(prof, interval_s=10.0)  # type: ignore[arg-type]
    assert sampler.status == Nvml(available=True, device_index=5, name="NVIDIA H100")
    sampler.maybe_sample()
    sampler.maybe_sample()  # within the interval: nothing more
    got = {metric: value for step, _ts, metric, value in prof.samples if step == 7}
    assert got == {
        "gpu_util_pct": 87.0,
        "gpu_mem_util_pct": 40.0,
        "gpu_mem_used_bytes": float(2**34),
        "gpu_power_w": 312.5,
        "gpu_sm_clock_mhz": 1980.0,
        "gpu_temperature_c": 61.0,
    }
    assert len(prof.samples) == 6


def test_an_unsupported_metric_is_dropped_and_the_rest_kept(monkeypatch, cuda_present) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(no_power=True))
    prof = _prof()
    sampler = gpu.NvmlSampler(prof, interval_s=0.000001)  # type: ignore[arg-type]
    sampler.maybe_sample()
    assert "gpu_power_w" not in {s[2] for s in prof.samples} and len(prof.samples) == 5


def test_no_nvml_is_off_with_the_reason(monkeypatch, cuda_present) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(fail_init=True))
    sampler = gpu.NvmlSampler(_prof(), interval_s=1.0)  # type: ignore[arg-type]
    reason = "NVML unavailable: NVML Shared Library Not Found"
    assert sampler.status == Nvml(available=False, reason=reason)
    sampler.maybe_sample()


def test_no_cuda_device_means_no_sampling() -> None:
    sampler = gpu.NvmlSampler(_prof(), interval_s=1.0)  # type: ignore[arg-type]
    assert sampler.status == Nvml(available=False, reason="no CUDA device in this process")
