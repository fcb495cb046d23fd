"""One rank of a job: ``python -m dtprof.jobs.worker SITUATION --trace DIR [options]``.

Rank and world come from the environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), as
under torchrun or dtprof.jobs.launch.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

import dtprof
from dtprof.jobs import faults, models, situations


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("situation", choices=sorted(situations.SITUATIONS))
    p.add_argument("--trace", required=True, help="trace directory")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seed", type=int, default=0, help="seeds the model and the data")
    p.add_argument(
        "--device-ms",
        type=float,
        default=0.0,
        help="simulated accelerator time of a forward pass over one batch (backward: twice)",
    )
    p.add_argument("--bucket-mb", type=float, default=None, help="DDP bucket cap (default DDP's)")
    p.add_argument("--slow-rank", type=int, default=1)
    p.add_argument("--slow-fraction", type=float, default=0.3)
    p.add_argument("--stall-every", type=int, default=5)
    p.add_argument("--stall-ms", type=float, default=150.0)
    p.add_argument("--perturb-step", type=int, default=10)
    p.add_argument("--perturb-rank", type=int, default=2)
    p.add_argument("--nan-step", type=int, default=20)
    p.add_argument("--nan-rank", type=int, default=1)
    p.add_argument("--schedule", default="gpipe")
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--fingerprint-every", type=int, default=5)
    p.add_argument("--hang-timeout-s", type=float, default=None)
    p.add_argument("--rounds", type=int, default=5, help="overhead: rounds per mode")
    faults.add_options(p)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        situations.SITUATIONS[args.situation](args)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


def train_loop(
    args: argparse.Namespace,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    profile_model: nn.Module | None = None,
    before_forward: Callable[[int, torch.Tensor], torch.Tensor] | None = None,
    on_loss: Callable[[int, torch.Tensor], torch.Tensor] | None = None,
    after_backward: Callable[[int], None] | None = None,
    in_data: Callable[[int], None] | None = None,
    slowdown: models.SlowDown | None = None,
    replica: int | None = None,
) -> None:
    """The common DDP-style loop: data region, forward, loss, backward, optimizer, log, step;
    each rank reads the batches of data-parallel ``replica`` (default: its own rank's)."""
    data = models.Batches(
        dist.get_rank() if replica is None else replica, args.batch, args.width, seed=args.seed
    )
    loss_fn = nn.CrossEntropyLoss()
    with dtprof.profile(
        args.trace,
        model=profile_model or model,
        optimizer=optimizer,
        fingerprint_every=args.fingerprint_every,
        hang_timeout_s=args.hang_timeout_s,
    ) as prof:
        for step in range(args.steps):
            with prof.region("data"):
                x, y = data.get(step)
                if in_data is not None:
                    in_data(step)
            if before_forward is not None:
                x = before_forward(step, x)
            t0 = time.perf_counter()
            loss = loss_fn(model(x), y)
            if on_loss is not None:
                loss = on_loss(step, loss)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if slowdown is not None:
                slowdown.observe(time.perf_counter() - t0)
            if after_backward is not None:
                after_backward(step)
            optimizer.step()
            prof.log(loss=loss)
            prof.step()


if __name__ == "__main__":
    raise SystemExit(main())
