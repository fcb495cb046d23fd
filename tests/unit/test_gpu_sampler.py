"""The NVML sampler's logic, with a stand-in pynvml: this machine has no GPU."""

from __future__ import annotations

import sys
import types
from collections import deque
from types import SimpleNamespace

import pytest

from dtprof.record import gpu
from dtprof.trace.meta import Gpm, Nvml


class _NVMLError(Exception):
    pass


GPM_VALUES = {2: 71.5, 5: 33.0, 10: 12.5}  # SM, tensor, DRAM bandwidth


class _GpmQuery:
    def __init__(self) -> None:
        self.metrics = [SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0) for _ in range(8)]


def _fake_pynvml(
    fail_init: bool = False, no_power: bool = False, gpm: bool = True
) -> types.ModuleType:
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
    m.nvmlDeviceGetCurrentClocksEventReasons = lambda h: 0x4 | 0x40  # type: ignore[attr-defined]
    m.NVML_GPM_METRIC_SM_UTIL = 2  # type: ignore[attr-defined]
    m.NVML_GPM_METRIC_ANY_TENSOR_UTIL = 5  # type: ignore[attr-defined]
    m.NVML_GPM_METRIC_DRAM_BW_UTIL = 10  # type: ignore[attr-defined]
    m.NVML_GPM_METRICS_GET_VERSION = 1  # type: ignore[attr-defined]
    m.nvmlGpmQueryDeviceSupport = lambda h: SimpleNamespace(isSupportedDevice=int(gpm))  # type: ignore[attr-defined]
    m.nvmlGpmSampleAlloc = object  # type: ignore[attr-defined]
    m.nvmlGpmSampleGet = lambda h, sample: sample  # type: ignore[attr-defined]
    m.c_nvmlGpmMetricsGet_t = _GpmQuery  # type: ignore[attr-defined]

    def metrics_get(query: _GpmQuery) -> _GpmQuery:
        assert query.sample1 is not query.sample2  # type: ignore[attr-defined]
        for metric in query.metrics[: query.numMetrics]:  # type: ignore[attr-defined]
            metric.value = GPM_VALUES[metric.metricId]
        return query

    m.nvmlGpmMetricsGet = metrics_get  # type: ignore[attr-defined]
    return m


@pytest.fixture
def cuda_present(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr("torch.cuda.is_initialized", lambda: True)
    monkeypatch.setattr("torch.cuda.current_device", lambda: 1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")


def _prof() -> SimpleNamespace:
    return SimpleNamespace(samples=deque(), step_index=7)


def test_samples_every_metric_of_the_ranks_physical_device(monkeypatch, cuda_present) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml())
    prof = _prof()
    sampler = gpu.NvmlSampler(prof, interval_s=10.0)  # type: ignore[arg-type]
    assert sampler.status == Nvml(available=True, device_index=5, name="NVIDIA H100")
    assert sampler.gpm_status == Gpm(available=True)
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
        "gpu_clock_reasons": float(0x4 | 0x40),  # software power cap, hardware thermal
        "gpm_sm_activity_pct": 71.5,
        "gpm_tensor_activity_pct": 33.0,
        "gpm_dram_bw_pct": 12.5,
    }
    assert len(prof.samples) == 10


def test_a_device_without_gpm_samples_the_rest_and_says_why(monkeypatch, cuda_present) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(gpm=False))
    prof = _prof()
    sampler = gpu.NvmlSampler(prof, interval_s=10.0)  # type: ignore[arg-type]
    reason = "unavailable: this device has no GPU performance metrics"
    assert sampler.gpm_status == Gpm(available=False, reason=reason)
    sampler.maybe_sample()
    assert len(prof.samples) == 7 and not any(s[2].startswith("gpm_") for s in prof.samples)


def test_a_cpu_job_on_a_gpu_machine_is_not_sampled(monkeypatch, cuda_present) -> None:
    """NVML would need the device index, and asking torch for it creates a CUDA context."""
    monkeypatch.setattr("torch.cuda.is_initialized", lambda: False)
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml())
    sampler = gpu.NvmlSampler(_prof(), interval_s=1.0)  # type: ignore[arg-type]
    assert sampler.status == Nvml(available=False, reason="the job does not use CUDA")


def test_an_unsupported_metric_is_dropped_and_the_rest_kept(monkeypatch, cuda_present) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(no_power=True))
    prof = _prof()
    sampler = gpu.NvmlSampler(prof, interval_s=0.000001)  # type: ignore[arg-type]
    sampler.maybe_sample()
    assert "gpu_power_w" not in {s[2] for s in prof.samples} and len(prof.samples) == 9


def test_no_nvml_is_off_with_the_reason(monkeypatch, cuda_present) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(fail_init=True))
    sampler = gpu.NvmlSampler(_prof(), interval_s=1.0)  # type: ignore[arg-type]
    reason = "NVML unavailable: NVML Shared Library Not Found"
    assert sampler.status == Nvml(available=False, reason=reason)
    sampler.maybe_sample()


def test_no_cuda_device_means_no_sampling() -> None:
    sampler = gpu.NvmlSampler(_prof(), interval_s=1.0)  # type: ignore[arg-type]
    assert sampler.status == Nvml(available=False, reason="no CUDA device in this process")
