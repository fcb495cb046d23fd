"""A one-process training job whose recording fails part-way; training must reach its end.

Usage: recording_faults.py TRACE disk|hook STEPS FAIL_AT

``disk``: from step FAIL_AT every write of a trace segment fails with ENOSPC, as on a full disk.
``hook``: from step FAIL_AT dtprof's phase hooks raise (the counting of a forward pass's
samples, which the native kernel hands to Python for a batch given as a dict, as Python does
every pass's). Every warning is printed (not only the
first per place), and the job prints ``trained N steps`` when the loop is done.
"""

from __future__ import annotations

import errno
import sys
import warnings

import torch
from torch import nn

import dtprof
from dtprof.record import throughput, writer


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.layers(batch["x"])


def main() -> None:
    trace, mode, steps, fail_at = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    warnings.simplefilter("always")
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    done = 0
    with dtprof.profile(trace, model=model, optimizer=opt, flush_interval_s=0.05) as prof:
        for step in range(steps):
            if step == fail_at:
                prof._tick()  # as the writer thread does: the native kernel's rows taken
                prof.writer.flush()  # what came before is on disk
                if mode == "disk":

                    def full(self: object, frame: bytes, rows: int) -> None:
                        raise OSError(errno.ENOSPC, "No space left on device")

                    writer._Segment.append_frames = full  # type: ignore[method-assign]
                else:

                    def broken(*args: object, **kwargs: object) -> object:
                        raise ValueError("injected fault")

                    throughput.batch_counts = broken
            x = torch.randn(16, 32)
            loss = model({"x": x}).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            prof.log(loss=loss)
            prof.step()
            done += 1
    print(f"trained {done} steps", flush=True)


if __name__ == "__main__":
    main()
