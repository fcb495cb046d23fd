"""Parameter fingerprints compared across data-parallel replicas, which hold bit-identical
parameters while they agree."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from dtprof.analysis.columns import codes, groups, is_null, rows, values


def odd_ranks(fingerprints: pa.Table) -> pa.Table:
    """(step, tensor, rank) rows whose fingerprint differs from the majority's."""
    f = fingerprints
    finite = np.isfinite(values(f, "sum", float)) & np.isfinite(values(f, "sumsq", float))
    step, null = values(f, "step"), is_null(f, "step")
    f = rows(f, ~(np.isin(step, step[~finite]) | (null & null[~finite].any())))
    tensor, _ = codes(f, "tensor")
    # rows with a null key are in no group (pandas' groupby drops them): never odd
    keyed = ~is_null(f, "step") & (tensor >= 0)
    if not keyed.any():
        return f.slice(0, 0)
    keys, inverse = groups(
        values(f, "step")[keyed], tensor[keyed], values(f, "sum")[keyed], values(f, "sumsq")[keyed]
    )
    size = np.bincount(inverse)  # of each distinct (step, tensor, sum, sumsq)
    _, place = groups(keys[0], keys[1])  # sorted: each (step, tensor) in one run
    majority = np.maximum.reduceat(size, np.flatnonzero(np.diff(place, prepend=-1)))
    odd = np.zeros(f.num_rows, bool)
    odd[keyed] = (size < majority[place])[inverse]
    return rows(f, odd)


def odd_counts(fingerprints: pa.Table) -> pa.Table:
    """rank, step, tensors: for each rank and step with fingerprints, how many of its tensors
    differ from the majority's (0 where none); rows without a step are left out."""
    f = rows(fingerprints, ~is_null(fingerprints, "step"))
    odd = odd_ranks(f)
    step = values(f, "step", np.int64)
    low, span = (int(step.min()), int(np.ptp(step)) + 1) if len(step) else (0, 1)

    def cell(t: pa.Table) -> np.ndarray:
        return values(t, "rank", np.int64) * span + values(t, "step", np.int64) - low

    cells = np.unique(cell(f))
    tensors = np.bincount(np.searchsorted(cells, cell(odd)), minlength=len(cells))
    return pa.table(
        {"rank": cells // span, "step": cells % span + low, "tensors": tensors.astype(np.int64)}
    )
