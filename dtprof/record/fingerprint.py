"""Parameter fingerprints: float64 sum and sum of squares of every parameter tensor.

Computed on the parameters' own device and read back once per fingerprinted step. While
data-parallel replicas agree they hold bit-identical parameters, so equal inputs give equal
sums; a differing fingerprint names the drifting replica. Sharded parameters (DTensor) are
fingerprinted by their local shard.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from dtprof.record.profiler import Profiler


@torch.no_grad()
def compute(model: torch.nn.Module) -> list[tuple[str, float, float]]:
    """(name, sum, sum of squares) per parameter, accumulated in float64."""
    names, values = [], []
    for name, param in model.named_parameters():
        local = param.to_local() if hasattr(param, "to_local") else param
        local = local.detach()
        names.append(name)
        values.append(torch.sum(local, dtype=torch.float64))
        values.append(torch.linalg.vector_norm(local, dtype=torch.float64).square())
    if not values:
        return []
    flat = torch.stack([v.to("cpu") for v in values]).tolist()
    return [(n, flat[2 * i], flat[2 * i + 1]) for i, n in enumerate(names)]


def record(prof: Profiler, step: int) -> None:
    assert prof.model is not None
    out = prof.fingerprints
    for name, total, sumsq in compute(prof.model):
        out.append((step, name, total, sumsq))
