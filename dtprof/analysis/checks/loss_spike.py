"""loss-spike: a logged loss far above its own recent history.

Rule: for every logged scalar whose name contains "loss", on each rank, a finite value is a
spike when it exceeds both twice the median of the previous 20 values and that median plus 10
median absolute deviations (a robust statistic: one earlier spike does not hide the next). At
least 10 earlier values are needed. Non-finite values are the non-finite check's. Warning.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dtprof.analysis.report import Finding
from dtprof.analysis.summarize import RunSummary

WINDOW = 20
MIN_HISTORY = 10
TIMES_MEDIAN = 2.0
MADS = 10.0


def spikes(scalars: pd.DataFrame) -> pd.DataFrame:
    """Rows of loss scalars that spike, with the baseline median they are compared with."""
    s = scalars[scalars["name"].str.contains("loss", case=False)]
    s = s[np.isfinite(s["value"].to_numpy(dtype=float))].sort_values(["rank", "name", "step"])
    if s.empty:
        return s.assign(baseline=pd.Series(dtype=float))
    keys = [s["rank"], s["name"]]
    prev = s.groupby(keys)["value"].shift(1)

    def rolling_median(values: pd.Series) -> pd.Series:
        by = values.groupby(keys, sort=False).rolling(WINDOW, min_periods=MIN_HISTORY)
        return by.median().droplevel([0, 1])

    median = rolling_median(prev)
    mad = rolling_median((prev - median).abs())
    spike = (s["value"] > TIMES_MEDIAN * median) & (s["value"] > median + MADS * mad)
    return s[spike.fillna(False)].assign(baseline=median[spike.fillna(False)])


def check(run: RunSummary) -> list[Finding]:
    if run.scalars.empty:
        return []
    found = spikes(run.scalars)
    if found.empty:
        return []
    first = found.sort_values("step").iloc[0]
    ranks = sorted(int(r) for r in found["rank"].unique())
    return [
        Finding(
            code="loss-spike",
            severity="warning",
            ranks=ranks,
            first_step=int(found["step"].min()),
            last_step=int(found["step"].max()),
            message=(
                f"{first['name']} spiked to {first['value']:.4g} at step {int(first['step'])} on "
                f"rank {int(first['rank'])} (recent median {first['baseline']:.4g}); "
                f"{len(found)} spike(s) in all"
            ),
            suggestion=(
                "look at the batches of those steps (outliers, bad samples), lower the learning "
                "rate or add gradient clipping"
            ),
            evidence={
                "statistic": f"rolling median of the previous {WINDOW} values and its MAD",
                "spikes": [
                    {
                        "rank": int(r.rank),
                        "step": int(r.step),
                        "name": str(r.name),
                        "value": float(r.value),
                        "baseline": float(r.baseline),
                    }
                    for r in found.head(20).itertuples()
                ],
            },
        )
    ]
