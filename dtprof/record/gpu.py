"""NVML sampler: utilization, memory, power, SM clock, temperature and the reasons the clocks
are held down, of this rank's GPU; on Hopper and later, where the driver offers them, the GPU
performance metrics (GPM): SM activity, tensor-core activity and DRAM bandwidth, each the
average over the interval since the last sample.

Runs on the writer thread at ``interval_s``. Where there is no GPU, no NVML or no GPM, that part
is off and the rank's metadata says why (``nvml``, ``gpm``). A reading the device refuses is
not asked for again.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from dtprof.trace.meta import Gpm, Nvml

if TYPE_CHECKING:
    from dtprof.record.profiler import Profiler

now_ns = time.perf_counter_ns


def _physical_index(local_index: int) -> int:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    ids = [v.strip() for v in visible.split(",") if v.strip()]
    if ids and all(v.isdigit() for v in ids) and local_index < len(ids):
        return int(ids[local_index])
    return local_index


NO_CUDA = "no CUDA device in this process"
NOT_CUDA = "the job does not use CUDA"


def why_no_cuda(model: Any = None) -> str | None:
    """Why there is no GPU to observe (NO_CUDA, NOT_CUDA), or None where the job uses CUDA: it
    has initialized CUDA (a flag read, so that a CPU job on a GPU machine never creates a CUDA
    context), or ``model`` has parameters on a CUDA device."""
    if not torch.cuda.is_available():
        return NO_CUDA
    if torch.cuda.is_initialized():
        return None
    if model is not None and any(p.is_cuda for p in model.parameters()):
        return None
    return NOT_CUDA


class NvmlSampler:
    """Samples NVML for the rank's device; ``status`` records whether and why not."""

    def __init__(self, prof: Profiler, interval_s: float) -> None:
        self.prof = prof
        self.interval_ns = int(interval_s * 1e9)
        self._next_ns = 0
        self._readers: dict[str, Callable[[], float]] = {}
        self._gpm: GpmSampler | None = None
        self.status = Nvml(available=False)
        self.gpm_status: Gpm | None = None
        if interval_s <= 0:
            self.status = Nvml(available=False, reason="off (gpu_sample_interval_s <= 0)")
            return
        why_not = why_no_cuda()
        if why_not is not None:
            # NVML would not create a CUDA context, but current_device() would: a CPU job on a
            # GPU machine keeps none (profile.attach() tries again once a model is on CUDA)
            self.status = Nvml(available=False, reason=why_not)
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            index = _physical_index(torch.cuda.current_device())
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
        except Exception as exc:  # pynvml.NVMLError (LibraryNotFound, ...) or ImportError
            self.status = Nvml(available=False, reason=f"NVML unavailable: {exc}")
            return
        self._readers = {
            "gpu_util_pct": lambda: pynvml.nvmlDeviceGetUtilizationRates(handle).gpu,
            "gpu_mem_util_pct": lambda: pynvml.nvmlDeviceGetUtilizationRates(handle).memory,
            "gpu_mem_used_bytes": lambda: pynvml.nvmlDeviceGetMemoryInfo(handle).used,
            "gpu_power_w": lambda: pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,
            "gpu_sm_clock_mhz": lambda: pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
            "gpu_temperature_c": lambda: pynvml.nvmlDeviceGetTemperature(
                handle, pynvml.NVML_TEMPERATURE_GPU
            ),
            # a bit mask of NVML's clocks event reasons (dtprof.trace.nvml)
            "gpu_clock_reasons": lambda: _clock_reasons(pynvml, handle),
        }
        try:
            self._gpm = GpmSampler(pynvml, handle)
            self.gpm_status = Gpm(available=True)
        except Exception as exc:  # an older GPU or driver, a virtual machine, an old pynvml
            self.gpm_status = Gpm(available=False, reason=f"unavailable: {exc}".splitlines()[0])
        self.status = Nvml(
            available=True,
            device_index=index,
            name=name if isinstance(name, str) else name.decode(),
        )

    def maybe_sample(self) -> None:
        if not self._readers:
            return
        t = now_ns()
        if t < self._next_ns:
            return
        self._next_ns = t + self.interval_ns
        step = self.prof.step_index
        for metric, read in list(self._readers.items()):
            try:
                value = float(read())
            except Exception:
                del self._readers[metric]  # not supported on this device: stop asking
                continue
            self.prof.samples.append((step, t, metric, value))
        if self._gpm is not None:
            try:
                for metric, value in self._gpm.read():
                    self.prof.samples.append((step, t, metric, value))
            except Exception as exc:
                self._gpm = None
                self.gpm_status = Gpm(available=False, reason=f"stopped: {exc}".splitlines()[0])
                self.prof.note_meta(gpm=self.gpm_status)


def _clock_reasons(pynvml: Any, handle: Any) -> int:
    read = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
    if read is None:  # nvidia-ml-py before 12.535
        read = pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
    return int(read(handle))


# GPM metric -> samples metric (percentages of the interval, averaged over the device)
GPM_METRICS = {
    "NVML_GPM_METRIC_SM_UTIL": "gpm_sm_activity_pct",
    "NVML_GPM_METRIC_ANY_TENSOR_UTIL": "gpm_tensor_activity_pct",
    "NVML_GPM_METRIC_DRAM_BW_UTIL": "gpm_dram_bw_pct",
}


class GpmSampler:
    """NVML's GPU performance metrics, computed between two samples of the device's counters:
    each read() takes a new sample and returns the metrics since the one before."""

    def __init__(self, pynvml: Any, handle: Any) -> None:
        if not pynvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice:
            raise RuntimeError("this device has no GPU performance metrics")
        self._nvml = pynvml
        self._handle = handle
        self._ids = [(getattr(pynvml, name), metric) for name, metric in GPM_METRICS.items()]
        self._before = pynvml.nvmlGpmSampleAlloc()
        self._after = pynvml.nvmlGpmSampleAlloc()
        pynvml.nvmlGpmSampleGet(handle, self._before)

    def read(self) -> list[tuple[str, float]]:
        nvml = self._nvml
        nvml.nvmlGpmSampleGet(self._handle, self._after)
        query = nvml.c_nvmlGpmMetricsGet_t()
        query.version = nvml.NVML_GPM_METRICS_GET_VERSION
        query.numMetrics = len(self._ids)
        query.sample1 = self._before
        query.sample2 = self._after
        for i, (metric_id, _) in enumerate(self._ids):
            query.metrics[i].metricId = metric_id
        nvml.nvmlGpmMetricsGet(query)
        self._before, self._after = self._after, self._before
        return [
            (name, float(query.metrics[i].value))
            for i, (_, name) in enumerate(self._ids)
            if query.metrics[i].nvmlReturn == 0
        ]
