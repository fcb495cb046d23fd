"""loss-spike: a logged loss far above its own recent history.

Rule: for every logged scalar whose name contains "loss", on each rank, a finite value is a
spike when it exceeds both twice the median of the previous 20 values and that median plus 10
median absolute deviations (a robust statistic: one earlier spike does not hide the next). At
least 10 earlier values are needed. Non-finite values are the non-finite check's. Warning.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.lib.stride_tricks import sliding_window_view

from dtprof.analysis.columns import codes, rows, sort_order, values
from dtprof.analysis.report import Finding
from dtprof.analysis.summarize import RunSummary

WINDOW = 20
MIN_HISTORY = 10
TIMES_MEDIAN = 2.0
MADS = 10.0
CHUNK_ROWS = 1 << 16  # rows whose windows are sorted at once: WINDOW floats each


def spikes(scalars: pa.Table) -> pa.Table:
    """Rows of loss scalars that spike, by rank, name and step, with the baseline median they
    are compared with."""
    loss = pc.match_substring(scalars.column("name"), "loss", ignore_case=True)
    keep = pc.fill_null(loss, False).to_numpy(zero_copy_only=False)
    s = rows(scalars, np.asarray(keep, bool) & np.isfinite(values(scalars, "value", float)))
    code, names = codes(s, "name")
    name = np.argsort(np.argsort(names))[code]  # codes in the names' order
    rank = values(s, "rank")
    order = np.lexsort((values(s, "step"), name, rank))  # stable, as pandas' sort
    s, rank, name = s.take(order), rank[order], name[order]
    value = values(s, "value", float)
    # each row's series (rank, name) starts at row `start`; its first row has no previous value
    first = np.ones(len(value), bool)
    first[1:] = (rank[1:] != rank[:-1]) | (name[1:] != name[:-1])
    start = np.maximum.accumulate(np.where(first, np.arange(len(value)), 0))
    prev = np.where(first, np.nan, np.roll(value, 1))
    median = _rolling_median(prev, start)
    mad = _rolling_median(np.abs(prev - median), start)
    spike = (value > TIMES_MEDIAN * median) & (value > median + MADS * mad)
    return rows(s, spike).append_column("baseline", pa.array(median[spike], pa.float64()))


def _rolling_median(x: np.ndarray, start: np.ndarray) -> np.ndarray:
    """Per row, the median of the values that are not NaN in the last WINDOW rows to it of its
    series (which starts at row ``start``); NaN with fewer than MIN_HISTORY: pandas' rolling
    median per group."""
    out = np.full(len(x), np.nan)
    view = sliding_window_view(np.concatenate([np.full(WINDOW - 1, np.nan), x]), WINDOW)
    reach = np.minimum(np.arange(len(x)) - start + 1, WINDOW)  # its series' rows in its window
    column = np.arange(WINDOW)
    for lo in range(0, len(x), CHUNK_ROWS):
        at = slice(lo, lo + CHUNK_ROWS)
        window = np.where(column >= WINDOW - reach[at, None], view[at], np.nan)
        window.sort(axis=1)  # NaN last
        count = WINDOW - np.isnan(window).sum(axis=1)
        row = np.arange(len(window))
        low, high = window[row, np.maximum(count - 1, 0) // 2], window[row, count // 2]
        median = np.where(count % 2, low, (low + high) / 2)
        out[at] = np.where(count >= MIN_HISTORY, median, np.nan)
    return out


def check(run: RunSummary) -> list[Finding]:
    if not run.scalars.num_rows:
        return []
    found = spikes(run.scalars)
    if not found.num_rows:
        return []
    rank, step = values(found, "rank"), values(found, "step")
    name, value, baseline = values(found, "name"), values(found, "value"), values(found, "baseline")
    i = int(sort_order(found, "step")[0])
    return [
        Finding(
            code="loss-spike",
            severity="warning",
            ranks=np.unique(rank).tolist(),
            first_step=int(np.nanmin(step)),
            last_step=int(np.nanmax(step)),
            message=(
                f"{name[i]} spiked to {value[i]:.4g} at step {int(step[i])} on "
                f"rank {int(rank[i])} (recent median {baseline[i]:.4g}); "
                f"{found.num_rows} spike(s) in all"
            ),
            suggestion=(
                "look at the batches of those steps (outliers, bad samples), lower the learning "
                "rate or add gradient clipping"
            ),
            evidence={
                "statistic": f"rolling median of the previous {WINDOW} values and its MAD",
                "spikes": [
                    {
                        "rank": int(rank[j]),
                        "step": int(step[j]),
                        "name": str(name[j]),
                        "value": float(value[j]),
                        "baseline": float(baseline[j]),
                    }
                    for j in range(min(found.num_rows, 20))
                ],
            },
        )
    ]
