"""The analysis' reductions the dashboard shows, on small tables whose answers are known."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa

from dtprof.analysis import measures
from dtprof.analysis.fingerprints import odd_counts


def _steps() -> pd.DataFrame:
    # rank 1 is twice as slow; rank 0 has no data phase
    return pd.DataFrame(
        {
            "rank": [0, 0, 0, 1, 1, 1],
            "step": [0, 1, 2, 0, 1, 2],
            "step_ns": [10.0, 12.0, 11.0, 20.0, 24.0, 22.0],
            "compute_ns": [5.0, 6.0, 5.5, 10.0, 12.0, 11.0],
            "data_ns": [np.nan, np.nan, np.nan, 2.0, 2.0, 2.0],
        }
    )


def test_rank_medians_and_the_typical_step() -> None:
    per = measures.rank_medians(_steps())
    assert list(per["step_ns"]) == [11.0, 22.0] and list(per["compute_ns"]) == [5.5, 11.0]
    step_ns, shares = measures.typical_step(_steps())
    assert step_ns == 16.5
    assert shares == {"compute_share": 8.25 / 16.5, "data_share": 2.0 / 16.5}
    _, none = measures.typical_step(_steps().assign(data_ns=np.nan))
    assert none["data_share"] is None


def test_step_spread_across_ranks() -> None:
    spread = measures.step_spread(_steps())
    assert list(spread["step"]) == [0, 1, 2]
    assert list(spread["min_ns"]) == [10.0, 12.0, 11.0]
    assert list(spread["max_ns"]) == [20.0, 24.0, 22.0]
    assert list(spread["median_ns"]) == [15.0, 18.0, 16.5]


def test_rank_overlap_sums_over_the_steps_and_leaves_out_ranks_without_communication() -> None:
    rank_steps = pd.DataFrame(
        {
            "rank": [0, 0, 1, 1, 2],
            "step": [0, 1, 0, 1, 0],
            "step_ns": [100.0, 100.0, 100.0, 100.0, 100.0],
            "comm_ns": [30.0, 10.0, 40.0, 0.0, 0.0],
            "overlap_ns": [30.0, 10.0, 10.0, 0.0, 0.0],
        }
    )
    per = measures.rank_overlap(rank_steps)
    assert list(per["rank"]) == [0, 1]
    assert list(per["overlap_fraction"]) == [1.0, 0.25]
    assert list(per["exposed_fraction"]) == [0.0, 30.0 / 200.0]


def test_odd_counts_per_rank_and_step_with_zeros_where_replicas_agree() -> None:
    # three replicas, two tensors, two steps: rank 2's tensor "w" drifts at step 5
    rank = [0, 1, 2] * 4
    step = [0] * 6 + [5] * 6
    tensor = (["w"] * 3 + ["b"] * 3) * 2
    total = [1.0] * 9 + [1.0] * 3
    total[6 + 2] = 2.0  # step 5, "w", rank 2
    fp = pa.table({"rank": rank, "step": step, "tensor": tensor, "sum": total, "sumsq": [1.0] * 12})
    out = odd_counts(fp).to_pandas()
    assert list(zip(out["rank"], out["step"], out["tensors"], strict=True)) == [
        (0, 0, 0),
        (0, 5, 0),
        (1, 0, 0),
        (1, 5, 0),
        (2, 0, 0),
        (2, 5, 1),
    ]
    assert odd_counts(fp.slice(0, 0)).num_rows == 0
