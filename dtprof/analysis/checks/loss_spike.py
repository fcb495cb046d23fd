"""loss-spike: a logged loss far above its own recent history.

Rule: for every logged scalar whose name contains "loss", on each rank, a finite value is a
spike when it exceeds both twice the median of the previous values (up to 20) and that median
plus 10 of their median absolute deviations from it (a robust statistic: one earlier spike
does not hide the next). At least 5 earlier values are needed, so a spike is seen from the
sixth logged value on. Non-finite values are the non-finite check's.

Spikes less than 5 steps apart are one episode, one warning: its ranks are those that spiked
at its first step (gradients are averaged, so a bad batch on one rank can lift the others'
losses in the next steps: those are listed as reached, not blamed).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.lib.stride_tricks import sliding_window_view

from dtprof.analysis.columns import codes, rows, values
from dtprof.analysis.report import Finding
from dtprof.analysis.summarize import RunSummary

WINDOW = 20
MIN_HISTORY = 5
TIMES_MEDIAN = 2.0
MADS = 10.0
EPISODE_GAP = 5  # steps: spikes closer than this belong to one episode
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
    order = np.lexsort((values(s, "step"), name, rank))  # stable
    s, rank, name = s.take(order), rank[order], name[order]
    value = values(s, "value", float)
    # each row's series (rank, name) starts at row `start`
    first = np.ones(len(value), bool)
    first[1:] = (rank[1:] != rank[:-1]) | (name[1:] != name[:-1])
    start = np.maximum.accumulate(np.where(first, np.arange(len(value)), 0))
    median, mad = _history(value, start)
    spike = (value > TIMES_MEDIAN * median) & (value > median + MADS * mad)
    return rows(s, spike).append_column("baseline", pa.array(median[spike], pa.float64()))


def _history(x: np.ndarray, start: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the median of the previous values of its series (up to WINDOW; the series
    starts at row ``start``) and their median absolute deviation from it; NaN for both with
    fewer than MIN_HISTORY previous values."""
    median, mad = np.full(len(x), np.nan), np.full(len(x), np.nan)
    padded = np.concatenate([np.full(WINDOW, np.nan), x[:-1] if len(x) else x])
    view = sliding_window_view(padded, WINDOW)  # row i: the WINDOW values before row i
    reach = np.minimum(np.arange(len(x)) - start, WINDOW)  # its series' rows in its window
    column = np.arange(WINDOW)
    for lo in range(0, len(x), CHUNK_ROWS):
        at = slice(lo, lo + CHUNK_ROWS)
        window = np.where(column >= WINDOW - reach[at, None], view[at], np.nan)
        count = WINDOW - np.isnan(window).sum(axis=1)
        mid = _sorted_median(window, count)
        spread = _sorted_median(np.abs(window - mid[:, None]), count)
        enough = count >= MIN_HISTORY
        median[at] = np.where(enough, mid, np.nan)
        mad[at] = np.where(enough, spread, np.nan)
    return median, mad


def _sorted_median(window: np.ndarray, count: np.ndarray) -> np.ndarray:
    """Per row, the median of its ``count`` values that are not NaN."""
    window = np.sort(window, axis=1)  # NaN last
    row = np.arange(len(window))
    low, high = window[row, np.maximum(count - 1, 0) // 2], window[row, count // 2]
    return np.where(count % 2, low, (low + high) / 2)


def check(run: RunSummary) -> list[Finding]:
    if not run.scalars.num_rows:
        return []
    found = spikes(run.scalars)
    if not found.num_rows:
        return []
    found = found.take(np.argsort(values(found, "step"), kind="stable"))
    step = values(found, "step")
    cuts = np.flatnonzero(np.diff(step) >= EPISODE_GAP) + 1
    return [
        _episode(found.slice(lo, hi - lo))
        for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, len(step)], strict=True)
    ]


def _episode(found: pa.Table) -> Finding:
    """One finding for spikes close together (in step order): blamed on the first step's."""
    rank, step = values(found, "rank"), values(found, "step")
    name, value, baseline = values(found, "name"), values(found, "value"), values(found, "baseline")
    first = int(step[0])
    origin = np.unique(rank[step == first]).tolist()
    reached = sorted(set(rank.tolist()) - set(origin))
    message = (
        f"{name[0]} spiked to {value[0]:.4g} at step {first} on rank {int(rank[0])} "
        f"(median of its previous values {baseline[0]:.4g})"
    )
    if len(origin) > 1:
        message += f"; ranks {', '.join(map(str, origin))} spiked at that step"
    if reached:
        message += f"; in the next steps rank(s) {', '.join(map(str, reached))} spiked too"
    return Finding(
        code="loss-spike",
        severity="warning",
        ranks=origin,
        first_step=first,
        last_step=int(step[-1]),
        message=message,
        suggestion=(
            f"look at rank {origin[0]}'s batch at step {first} (outliers, bad samples), lower "
            "the learning rate or add gradient clipping"
        ),
        evidence={
            "statistic": f"median of up to {WINDOW} previous values and their MAD",
            "reached": reached,
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
