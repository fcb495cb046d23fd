"""A Lightning Trainer with the DDP strategy, recorded by ``DtprofCallback``: the one line of
dtprof in it.

    pip install 'dtprof[lightning]'
    torchrun --nproc-per-node 2 examples/lightning_ddp.py --trace runs/lightning --slow-rank 1
    dtprof analyze runs/lightning

``--slow-rank R`` makes rank R's forward 10 ms slower, standing for a slower device.
"""

import argparse
import os
import time

import lightning
import torch
from torch import nn

from dtprof.integrations.lightning import DtprofCallback

parser = argparse.ArgumentParser()
parser.add_argument("--trace", default="runs/lightning")
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--slow-rank", type=int, default=-1)
args = parser.parse_args()
slow = int(os.environ.get("RANK", "0")) == args.slow_rank


class Delay(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if slow:
            time.sleep(0.01)
        return x


class Regression(lightning.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), Delay(), nn.ReLU(), nn.Linear(64, 1))

    def training_step(self, batch: list[torch.Tensor], index: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


torch.manual_seed(0)
data = torch.utils.data.DataLoader(
    torch.utils.data.TensorDataset(torch.randn(4096, 32), torch.randn(4096, 1)), batch_size=16
)
trainer = lightning.Trainer(
    accelerator="cpu",
    devices=int(os.environ.get("WORLD_SIZE", "1")),
    strategy="ddp",
    max_steps=args.steps,
    accumulate_grad_batches=2,
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
    callbacks=[DtprofCallback(args.trace)],
)
trainer.fit(Regression(), data)
