"""Parameter fingerprints: sum and sum of squares of every parameter tensor.

Computed on the parameters' own device, accumulated in float32 (float64 for float64
parameters), and read back once per fingerprinted step. While data-parallel replicas agree they
hold bit-identical parameters, and the same reduction over identical tensors gives identical
sums; a differing fingerprint names the drifting replica. float32 accumulation is about ten
times cheaper than float64 on CPU and still moves with a change in any element. Sharded
parameters (DTensor) are fingerprinted by their local shard.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from dtprof.record.profiler import Profiler


@torch.no_grad()
def compute(model: torch.nn.Module) -> list[tuple[str, float, float]]:
    """(name, sum, sum of squares) per parameter."""
    names, values = [], []
    for name, param in model.named_parameters():
        local = param.to_local() if hasattr(param, "to_local") else param
        local = local.detach()
        acc = torch.float64 if local.dtype == torch.float64 else torch.float32
        names.append(name)
        values.append(torch.sum(local, dtype=acc).to(torch.float64))
        values.append(torch.linalg.vector_norm(local, dtype=acc).to(torch.float64).square())
    if not values:
        return []
    flat = torch.stack(values).tolist()  # one transfer from the device
    return [(n, flat[2 * i], flat[2 * i + 1]) for i, n in enumerate(names)]


def record(prof: Profiler, step: int) -> None:
    assert prof.model is not None
    out = prof.fingerprints
    for name, total, sumsq in compute(prof.model):
        out.append((step, name, total, sumsq))
