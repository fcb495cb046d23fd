"""A training loop with Hugging Face Accelerate and nothing of dtprof in it: ``dtprof run``
records it as it is, however it is launched.

    pip install accelerate
    dtprof run --trace runs/accelerate -- \
        torchrun --nproc-per-node 2 examples/accelerate_loop.py --slow-rank 1
    dtprof analyze runs/accelerate

(``accelerate launch`` in place of torchrun works the same.) Each optimizer step takes two
micro-batches (``gradient_accumulation_steps=2``). ``--slow-rank R`` makes rank R's forward
10 ms slower, standing for a slower device.
"""

import argparse
import time

import torch
from accelerate import Accelerator
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--slow-rank", type=int, default=-1)
args = parser.parse_args()

accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
slow = accelerator.process_index == args.slow_rank


class Delay(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if slow:
            time.sleep(0.01)
        return x


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), Delay(), nn.ReLU(), nn.Linear(64, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
data = torch.utils.data.DataLoader(
    torch.utils.data.TensorDataset(torch.randn(4096, 32), torch.randn(4096, 1)), batch_size=16
)
model, optimizer, data = accelerator.prepare(model, optimizer, data)
for i, (x, y) in enumerate(data):
    if i == 2 * args.steps:
        break
    with accelerator.accumulate(model):
        loss = nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
accelerator.wait_for_everyone()
accelerator.end_training()
