"""The peak matrix throughput of accelerators, per dtype, that MFU is measured against: the
vendors' datasheet figures for dense math (without 2:4 sparsity), in TFLOP/s. docs/throughput.md
lists them with their sources; ``dtprof analyze --peak-tflops`` states one for any device."""

from __future__ import annotations

import re

_HOPPER: dict[str, float] = {"fp8": 1979, "bf16": 989, "fp16": 989, "tf32": 495, "fp32": 67}  # SXM
_HOPPER_NVL: dict[str, float] = {"fp8": 1671, "bf16": 835, "fp16": 835, "tf32": 418, "fp32": 60}
_MI300: dict[str, float] = {"fp8": 2615, "bf16": 1307, "fp16": 1307, "tf32": 654, "fp32": 163}

# (pattern of the device's name as CUDA or ROCm reports it, the device, TFLOP/s per dtype):
# the first that matches is taken, so a variant comes before its family
PEAKS: tuple[tuple[str, str, dict[str, float]], ...] = (
    (r"GH200", "NVIDIA GH200", _HOPPER),
    (r"H200 NVL", "NVIDIA H200 NVL", _HOPPER_NVL),
    (r"H200", "NVIDIA H200 SXM", _HOPPER),
    (r"H100 NVL", "NVIDIA H100 NVL", _HOPPER_NVL),
    (
        r"H100 PCIe",
        "NVIDIA H100 PCIe",
        {"fp8": 1513, "bf16": 756, "fp16": 756, "tf32": 378, "fp32": 51},
    ),
    (r"H100", "NVIDIA H100 SXM", _HOPPER),
    (r"B200", "NVIDIA B200", {"fp8": 4500, "bf16": 2250, "fp16": 2250, "tf32": 1100}),
    (r"A100", "NVIDIA A100", {"bf16": 312, "fp16": 312, "tf32": 156, "fp32": 19.5}),
    (r"L40S", "NVIDIA L40S", {"fp8": 733, "bf16": 362, "fp16": 362, "tf32": 183, "fp32": 91.6}),
    (r"\bL4\b", "NVIDIA L4", {"fp8": 242, "bf16": 121, "fp16": 121, "tf32": 60, "fp32": 30.3}),
    (r"\bA10\b", "NVIDIA A10", {"bf16": 125, "fp16": 125, "tf32": 62.5, "fp32": 31.2}),
    (r"V100.*PCIE", "NVIDIA V100 PCIe", {"fp16": 112, "fp32": 14}),
    (r"V100", "NVIDIA V100 SXM2", {"fp16": 125, "fp32": 15.7}),
    (r"\bT4\b", "NVIDIA T4", {"fp16": 65, "fp32": 8.1}),
    (r"MI300X|MI325X", "AMD Instinct MI300X / MI325X", _MI300),
    (r"MI250X", "AMD Instinct MI250X", {"bf16": 383, "fp16": 383, "fp32": 95.7}),
    (r"MI250", "AMD Instinct MI250", {"bf16": 362, "fp16": 362, "fp32": 90.5}),
    (r"MI210", "AMD Instinct MI210", {"bf16": 181, "fp16": 181, "fp32": 45.3}),
)


def peak_tflops(device_name: str | None, dtype: str | None) -> tuple[float, str] | None:
    """The peak TFLOP/s of a device in a dtype, and what it is (``NVIDIA H100 SXM, bf16``);
    None for a device or dtype the table does not hold."""
    if not device_name or not dtype:
        return None
    for pattern, device, peaks in PEAKS:
        if re.search(pattern, device_name, re.IGNORECASE):
            return (float(peaks[dtype]), f"{device}, {dtype}") if dtype in peaks else None
    return None
