"""Tensor parallelism as Megatron-LM splits an MLP, for the 2-D jobs: each block's first linear
layer split by columns over the group, its second by rows, their partial outputs summed by an
all-reduce in forward, and the block input's gradient summed by one in backward."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from dtprof.jobs import models


class _SumInForward(torch.autograd.Function):
    """Sum over the group in forward (the row-split layer's partial outputs); identity back."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


class _SumInBackward(torch.autograd.Function):
    """Identity forward (each member gets the whole input); the input's gradient summed back."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class ParallelBlock(nn.Module):
    """Linear(width, 2 width) split by columns, ReLU, Linear(2 width, width) split by rows, over
    ``group``; ``device_s_per_row`` of device time after the first (see models.DeviceTime)."""

    def __init__(self, width: int, group: dist.ProcessGroup, device_s_per_row: float) -> None:
        super().__init__()
        shard = 2 * width // dist.get_world_size(group)
        self.group = group
        self.up = nn.Linear(width, shard)
        self.work = nn.Sequential(*models.device_time(device_s_per_row), nn.ReLU())
        self.down = nn.Linear(shard, width, bias=False)
        self.bias = nn.Parameter(torch.zeros(width))  # added once, after the sum

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _SumInBackward.apply(x, self.group)
        partial = self.down(self.work(self.up(x)))
        return torch.relu(_SumInForward.apply(partial, self.group) + self.bias)


def mlp(
    width: int, depth: int, group: dist.ProcessGroup, seed: int, device_s_per_row: float,
    classes: int = 16,
) -> nn.Sequential:  # fmt: skip
    """``depth`` parallel blocks and a classifier each member holds whole; the device time
    spread over the blocks as models.mlp spreads it over its layers. Each member's shards are
    seeded by its place in the group, the rest by ``seed`` alone."""
    torch.manual_seed(seed)
    head = nn.Linear(width, classes)
    torch.manual_seed(1000 * seed + 1 + dist.get_rank(group))
    per_block = device_s_per_row / depth
    blocks = [ParallelBlock(width, group, per_block) for _ in range(depth)]
    return nn.Sequential(*blocks, head)
