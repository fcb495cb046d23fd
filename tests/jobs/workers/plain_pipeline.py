"""A 2-stage GPipe training script written without dtprof (``dtprof run`` records it)."""

import torch
import torch.distributed as dist
import torch.distributed.pipelining as pp
from torch import nn

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(rank)
block = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64))
stage = pp.PipelineStage(block, rank, world, torch.device("cpu"))
schedule = pp.ScheduleGPipe(stage, 4, loss_fn=nn.MSELoss())
optimizer = torch.optim.SGD(block.parameters(), lr=0.01)
for _ in range(12):
    x, y = torch.randn(16, 64), torch.randn(16, 64)
    optimizer.zero_grad()
    if rank == 0:
        schedule.step(x)
    else:
        schedule.step(target=y, losses=[])
    optimizer.step()
dist.barrier()
dist.destroy_process_group()
