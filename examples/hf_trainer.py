"""A tiny GPT-2 (built from a config: nothing is downloaded) trained by the Hugging Face
Trainer, recorded by ``DtprofCallback``: the one line of dtprof in it.

    pip install 'dtprof[hf]'
    torchrun --nproc-per-node 2 examples/hf_trainer.py --trace runs/hf --slow-rank 1
    dtprof analyze runs/hf

``--slow-rank R`` makes rank R's first block 20 ms slower, standing for a slower device.
"""

import argparse
import os
import time
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from dtprof.integrations.hf import DtprofCallback

parser = argparse.ArgumentParser()
parser.add_argument("--trace", default="runs/hf")
parser.add_argument("--steps", type=int, default=12)
parser.add_argument("--slow-rank", type=int, default=-1)
args = parser.parse_args()

torch.manual_seed(0)
config = GPT2Config(
    n_layer=2, n_head=2, n_embd=64, vocab_size=256, n_positions=64, bos_token_id=0, eos_token_id=0
)
model = GPT2LMHeadModel(config)
if int(os.environ.get("RANK", "0")) == args.slow_rank:
    model.transformer.h[0].register_forward_pre_hook(lambda module, inputs: time.sleep(0.02))


class RandomTokens(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 4096

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, 256, (32,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}


training = TrainingArguments(
    output_dir=str(Path(args.trace).parent / "hf-output"),
    per_device_train_batch_size=4,
    gradient_accumulation_steps=2,
    max_steps=args.steps,
    logging_steps=1000,
    save_strategy="no",
    report_to=[],
    use_cpu=True,
    ddp_backend="gloo",
    disable_tqdm=True,
)
trainer = Trainer(
    model=model,
    args=training,
    train_dataset=RandomTokens(),
    callbacks=[DtprofCallback(args.trace)],
)
trainer.train()
