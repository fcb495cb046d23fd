"""Seeded toy models and data for the jobs: small enough for a 2-core CPU, real enough to time."""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn


def mlp(
    width: int = 256,
    depth: int = 4,
    classes: int = 16,
    seed: int = 0,
    device_s_per_row: float = 0.0,
) -> nn.Sequential:
    """``depth`` ReLU layers and a classifier; with ``device_s_per_row``, device time per row
    spread evenly over the linear layers (see DeviceTime)."""
    torch.manual_seed(seed)
    per_layer = device_s_per_row / (depth + 1)
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), *device_time(per_layer), nn.ReLU()]
    layers += [nn.Linear(width, classes), *device_time(per_layer)]
    return nn.Sequential(*layers)


def device_time(seconds_per_row: float) -> list[nn.Module]:
    """A DeviceTime layer in a list, or an empty list for no device time."""
    return [DeviceTime(seconds_per_row)] if seconds_per_row > 0 else []


class _Wait(torch.autograd.Function):
    """Identity whose forward waits ``seconds`` and whose backward waits twice as long."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, seconds: float) -> torch.Tensor:
        ctx.seconds = seconds
        time.sleep(seconds)
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        time.sleep(2 * ctx.seconds)
        return grad, None


class DeviceTime(nn.Module):
    """Stands for the time an accelerator spends on a layer: ``seconds_per_row`` times the
    rows of the input (times ``scale``) in forward, twice that in backward.

    The process sleeps, as a host does while its GPU computes, so four ranks on two CPU
    cores keep steady, comparable timings; ``scale`` above 1 makes a slower device.
    """

    def __init__(self, seconds_per_row: float) -> None:
        super().__init__()
        self.seconds_per_row = seconds_per_row
        self.scale = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Wait.apply(x, self.seconds_per_row * x.shape[0] * self.scale)


def scale_device_time(model: nn.Module, scale: float) -> int:
    """Make every DeviceTime of ``model`` ``scale`` times slower; returns how many it found."""
    found = [m for m in model.modules() if isinstance(m, DeviceTime)]
    for m in found:
        m.scale = scale
    return len(found)


class Batches:
    """Deterministic batches per (rank, step): inputs and class targets."""

    def __init__(
        self, rank: int, batch: int = 64, width: int = 256, classes: int = 16, seed: int = 0
    ) -> None:
        self.rank, self.batch, self.width, self.classes = rank, batch, width, classes
        self.seed = seed

    def get(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(1_000_000 * self.seed + 10_000 * self.rank + step)
        x = torch.randn(self.batch, self.width, generator=g)
        y = torch.randint(0, self.classes, (self.batch,), generator=g)
        return x, y


def burn(seconds: float) -> None:
    """Busy CPU compute for about ``seconds``: a slow device, not a sleep."""
    a = torch.randn(96, 96)
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        a = torch.tanh(a @ a)


class SlowDown:
    """A forward hook that adds ``fraction`` of the measured step compute as extra compute."""

    def __init__(self, fraction: float, warmup_steps: int = 3) -> None:
        self.fraction = fraction
        self.warmup = warmup_steps
        self.seen: list[float] = []
        self.extra_s = 0.0

    def observe(self, compute_s: float) -> None:
        if len(self.seen) < self.warmup:
            self.seen.append(compute_s)
            if len(self.seen) == self.warmup:
                self.extra_s = self.fraction * sorted(self.seen)[len(self.seen) // 2]

    def __call__(self, module: nn.Module, args: object, output: object) -> None:
        if self.extra_s:
            burn(self.extra_s)
