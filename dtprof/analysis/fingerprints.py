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
