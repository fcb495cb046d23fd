"""A DDP job with small buckets (several per step), for the integration tests.

Beside the recorded model, a second replica trains on the same batches without dtprof, on a
process group of its own (so that its buckets are not the recorded model's); each rank writes
``bare-equal-RANK`` beside the trace: whether the two ended bit-identical, i.e. whether
recording changed the training's arithmetic. Both use
``gradient_as_bucket_view`` and set gradients to None only every third step, so DDP scales by
both of its ways: multiplying gradients it copies into a bucket, dividing those that already are
the bucket's views. A few steps after recording ends must stay bit-identical too.

Usage (one process per rank, torchrun-style environment): ddp_buckets.py TRACE STEPS [HOW]
HOW is ``comm_hook`` for ``profile(ddp_buckets="comm_hook")``; anything else (``native``,
``python``: which kernel, the environment's ``DTPROF_NATIVE`` picks) is the default, True.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import dtprof


def replica(group: dist.ProcessGroup | None = None) -> tuple[DDP, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = DDP(
        nn.Sequential(*[nn.Linear(128, 128) for _ in range(6)]),
        bucket_cap_mb=0.1,
        gradient_as_bucket_view=True,
        process_group=group,
    )
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def main() -> None:
    trace, steps = sys.argv[1], int(sys.argv[2])
    how = "comm_hook" if len(sys.argv) > 3 and sys.argv[3] == "comm_hook" else True
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model, opt = replica()
    bare, bare_opt = replica(dist.new_group(list(range(dist.get_world_size()))))

    def batch(step: int) -> torch.Tensor:
        return torch.randn(32, 128, generator=torch.Generator().manual_seed(rank * 99 + step))

    def train_bare(x: torch.Tensor, step: int) -> None:
        bare_opt.zero_grad(set_to_none=step % 3 == 0)
        bare(x).square().mean().backward()
        bare_opt.step()

    with dtprof.profile(
        trace, model=model, optimizer=opt, fingerprint_every=1, ddp_buckets=how
    ) as prof:
        for step in range(steps):
            with prof.region("data"):
                x = batch(step)
            loss = model(x).square().mean()
            opt.zero_grad(set_to_none=step % 3 == 0)
            loss.backward()
            opt.step()
            prof.log(loss=loss)
            prof.step()
            train_bare(x, step)
    for step in range(steps, steps + 4):  # after recording (a comm hook stays on the model)
        x = batch(step)
        opt.zero_grad(set_to_none=step % 3 == 0)
        model(x).square().mean().backward()
        opt.step()
        train_bare(x, step)
    pairs = zip(model.parameters(), bare.parameters(), strict=True)
    equal = all(torch.equal(a, b) for a, b in pairs)
    (Path(trace).parent / f"bare-equal-{rank}").write_text(str(equal))
    dist.barrier()
    dist.destroy_process_group()
    # Out without freeing the models. With torch 2.13 and gloo, freeing a DDP model frees its
    # reducer, and with it the last reference to its process group; the group's destructor,
    # run holding the GIL, joins its worker threads, and one of them may be waiting for the GIL
    # to free a finished all-reduce (launched during backward, which keeps a Python object in
    # the thread state the work copied). About one run in ten hung so, without dtprof too (the
    # kind of deadlock of pytorch/pytorch#56297, here through the reducer).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
