"""A DDP training script with nothing of dtprof in it: ``dtprof run`` records it as it is.

    dtprof run --trace runs/plain -- \
        torchrun --nproc-per-node 2 examples/plain_ddp.py --slow-rank 1
    dtprof analyze runs/plain

Each optimizer step takes two micro-batches (gradient accumulation). ``--slow-rank R`` makes
rank R's forward 10 ms slower, standing for a slower device: ``dtprof analyze`` names it.
"""

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--slow-rank", type=int, default=-1)
args = parser.parse_args()

dist.init_process_group("gloo")
slow = dist.get_rank() == args.slow_rank


class Delay(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if slow:
            time.sleep(0.01)
        return x


torch.manual_seed(0)
model = DistributedDataParallel(
    nn.Sequential(nn.Linear(32, 64), Delay(), nn.ReLU(), nn.Linear(64, 1))
)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(args.steps):
    for _micro in range(2):
        loss = model(torch.randn(16, 32)).pow(2).mean() / 2
        loss.backward()
    optimizer.step()
    optimizer.zero_grad()
dist.barrier()
dist.destroy_process_group()
