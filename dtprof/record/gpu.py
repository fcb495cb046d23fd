"""NVML sampler: utilization, memory, power, SM clock and temperature of this rank's GPU.

Runs on the writer thread at ``interval_s``. Where there is no GPU or no NVML the sampler is
off and the rank's metadata says why.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from dtprof.trace.meta import Nvml

if TYPE_CHECKING:
    from dtprof.record.profiler import Profiler

now_ns = time.perf_counter_ns


def _physical_index(local_index: int) -> int:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    ids = [v.strip() for v in visible.split(",") if v.strip()]
    if ids and all(v.isdigit() for v in ids) and local_index < len(ids):
        return int(ids[local_index])
    return local_index


class NvmlSampler:
    """Samples NVML for the rank's device; ``status`` records whether and why not."""

    def __init__(self, prof: Profiler, interval_s: float) -> None:
        self.prof = prof
        self.interval_ns = int(interval_s * 1e9)
        self._next_ns = 0
        self._readers: dict[str, Callable[[], float]] = {}
        self.status = Nvml(available=False)
        if interval_s <= 0:
            self.status = Nvml(available=False, reason="off (gpu_sample_interval_s <= 0)")
            return
        if not torch.cuda.is_available():
            self.status = Nvml(available=False, reason="no CUDA device in this process")
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
        }
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
