"""Seeded toy models and data for the jobs: small enough for a 2-core CPU, real enough to time."""

from __future__ import annotations

import time

import torch
from torch import nn


def mlp(width: int = 256, depth: int = 4, classes: int = 16, seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    layers.append(nn.Linear(width, classes))
    return nn.Sequential(*layers)


class Batches:
    """Deterministic batches per (rank, step): inputs and class targets."""

    def __init__(self, rank: int, batch: int = 64, width: int = 256, classes: int = 16) -> None:
        self.rank, self.batch, self.width, self.classes = rank, batch, width, classes

    def get(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(10_000 * self.rank + step)
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
