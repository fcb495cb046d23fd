"""A DDP training script written without dtprof (``dtprof run`` records it): two micro-batches
per optimizer step; the rank in SLOW_RANK has a slower forward."""

import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
rank = dist.get_rank()
slow_rank = int(os.environ.get("SLOW_RANK", "-1"))


class Delay(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if rank == slow_rank:
            time.sleep(0.01)
        return x


torch.manual_seed(0)
model = DistributedDataParallel(
    torch.nn.Sequential(torch.nn.Linear(32, 64), Delay(), torch.nn.ReLU(), torch.nn.Linear(64, 1))
)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(int(os.environ.get("STEPS", "20"))):
    for _micro in range(2):
        loss = model(torch.randn(16, 32)).pow(2).mean() / 2
        loss.backward()
    optimizer.step()
    optimizer.zero_grad()
dist.barrier()
dist.destroy_process_group()
