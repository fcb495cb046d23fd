"""Faults planted in a real job at one rank and step: what the accuracy benchmark scores.

``python -m dtprof.jobs.worker fault --fault KIND --culprit R --onset S --magnitude M ...``
runs the DDP loop (or, for the pipeline kinds, the pipeline and 2-D situations read the same
options) with one fault planted on rank R from step S on. Each kind is a thing that goes wrong
in real training, made here the way it happens there: a slower device, a bad batch, a rank
stuck elsewhere, a process killed, an exception raised, memory held on to.
"""

from __future__ import annotations

import argparse
import functools
import os
import signal
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch import nn

from dtprof.jobs import models

# the kinds planted in the DDP loop (the pipeline kinds live in their situations)
DDP_KINDS = (
    "none",
    "chronic-straggler",
    "transient-straggler",
    "non-finite",
    "perturbed-replica",
    "data-stall",
    "hang",
    "killed",
    "memory-leak",
    "loss-spike",
    "exception",
)


class PlantedFault(RuntimeError):
    """The exception the ``exception`` kind raises on its rank."""


class DdpFault:
    """The hooks of the DDP loop (dtprof.jobs.worker.train_loop) that plant one fault."""

    def __init__(self, args: argparse.Namespace, model: nn.Module) -> None:
        if args.fault not in DDP_KINDS:
            raise SystemExit(f"unknown fault {args.fault!r}; DDP kinds: {', '.join(DDP_KINDS)}")
        self.kind = args.fault
        self.on_culprit = dist.get_rank() == args.culprit
        self.onset, self.magnitude = args.onset, args.magnitude
        self.duration, self.period = args.duration, args.period
        self.model = model
        self.held: list[torch.Tensor] = []

    def active(self, step: int) -> bool:
        """Whether the fault acts on this rank at this step."""
        if not self.on_culprit or step < self.onset:
            return False
        return self.kind != "transient-straggler" or step < self.onset + self.duration

    def before_forward(self, step: int, x: torch.Tensor) -> torch.Tensor:
        kind, active = self.kind, self.active(step)
        if kind in ("chronic-straggler", "transient-straggler") and self.on_culprit:
            # a slower device: its simulated accelerator time scaled while the fault lasts
            models.scale_device_time(self.model, 1 + self.magnitude if active else 1.0)
        if not active or step != self.onset:
            return x
        if kind == "non-finite":
            x = x.clone()
            x[0, 0] = float("inf")
        elif kind == "perturbed-replica":
            with torch.no_grad():
                first = next(self.model.parameters())
                first.add_(torch.randn_like(first) * self.magnitude)
        elif kind == "hang":
            time.sleep(3600)  # stuck elsewhere: the others wait in this step's all-reduce
        elif kind == "killed":
            os.kill(os.getpid(), signal.SIGKILL)  # the OOM killer, a lost node
        elif kind == "exception":
            raise PlantedFault(f"planted fault on rank {dist.get_rank()} at step {step}")
        return x

    def on_loss(self, step: int, loss: torch.Tensor) -> torch.Tensor:
        if self.kind == "loss-spike" and self.active(step) and step == self.onset:
            # a bad batch: its loss (and so its gradient) that many times the usual
            return loss * self.magnitude
        return loss

    def in_data(self, step: int) -> None:
        if not self.active(step):
            return
        if self.kind == "data-stall" and (step - self.onset) % self.period == 0:
            time.sleep(self.magnitude / 1000)  # the loader's batch late by that many ms
        elif self.kind == "memory-leak":
            # a loader that keeps every batch it made: magnitude MiB more held each step
            self.held.append(torch.ones(int(self.magnitude * 2**20) // 4))


class SlowLink:
    """A degraded link under one process group: from step ``onset`` on, each synchronous
    all-reduce on ``group`` takes ``magnitude`` times as long as its transfer did, on every
    member alike. After the real call, the members agree on its shortest time there (the
    member that arrived last waited for no one: its time is the transfer's) and each sleeps
    (magnitude - 1) times that, so that the group still ends together.

    Installed before dtprof's profile starts, so that dtprof records the throttled call as the
    user's all-reduce, as it would a slow one; the members' agreement goes to the real
    all-reduce underneath and is not recorded.
    """

    def __init__(self, group: dist.ProcessGroup, magnitude: float, onset: int) -> None:
        self.group, self.magnitude, self.onset = group, magnitude, onset
        self.step = 0
        self.real = dist.all_reduce

    def install(self) -> None:
        """Put the throttled all-reduce where torch.distributed's callers find it."""
        real = self.real

        @functools.wraps(real)
        def all_reduce(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            work = real(tensor, *args, **kwargs)
            group = kwargs.get("group", args[1] if len(args) > 1 else None)
            if group is self.group and self.step >= self.onset and work is None:
                shortest = torch.tensor([time.perf_counter() - started])
                real(shortest, op=dist.ReduceOp.MIN, group=group)
                time.sleep((self.magnitude - 1) * float(shortest))
            return work

        c10d.all_reduce = dist.all_reduce = all_reduce  # type: ignore[assignment]

    def uninstall(self) -> None:
        c10d.all_reduce = dist.all_reduce = self.real  # type: ignore[assignment]


def add_options(p: argparse.ArgumentParser) -> None:
    """The worker's options that choose and place a fault."""
    p.add_argument("--fault", default="none", help="the kind of fault to plant")
    p.add_argument("--culprit", type=int, default=1, help="the rank it is planted on")
    p.add_argument("--onset", type=int, default=10, help="the step it starts at")
    p.add_argument(
        "--magnitude",
        type=float,
        default=0.3,
        help="stragglers and slow stages: extra device time (0.3: 1.3x); slow link: times the "
        "healthy transfer time; data stall: ms; memory leak: MiB per step; loss spike: times "
        "the loss; perturbed replica: noise scale",
    )
    p.add_argument("--duration", type=int, default=10, help="transient straggler: steps")
    p.add_argument("--period", type=int, default=5, help="data stall: every that many steps")
