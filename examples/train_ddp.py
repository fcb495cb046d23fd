"""A DDP training script recorded with dtprof. Run it under torchrun:

    torchrun --nproc-per-node 4 examples/train_ddp.py --trace runs/demo

``--slow-rank R`` adds about 4 ms of compute to rank R's forward, standing for a slower GPU,
the most common way a job loses time: every other rank waits for it at each gradient
all-reduce, and ``dtprof analyze`` names it.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import dtprof


def burn(seconds: float) -> None:
    """Busy compute for about ``seconds``."""
    a = torch.randn(64, 64)
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        a = torch.tanh(a @ a)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trace", default="runs/demo")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--slow-rank", type=int, default=-1)
    args = parser.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(
        nn.Sequential(
            nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 16)
        )
    )
    if rank == args.slow_rank:  # extra compute in its forward: stands for a slower GPU
        model.module.register_forward_hook(lambda *_: burn(0.004))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loss_fn = nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(rank)

    with dtprof.profile(
        args.trace, model=model, optimizer=optimizer, fingerprint_every=10, hang_timeout_s=60
    ) as prof:
        for _ in range(args.steps):
            with prof.region("data"):
                x = torch.randn(64, 256, generator=gen)
                y = torch.randint(0, 16, (64,), generator=gen)
            loss = loss_fn(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            prof.log(loss=loss)
            prof.step()

    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
