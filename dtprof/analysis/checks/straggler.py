"""straggler: the rank the others wait for, found by arrival time at matched collectives.

Rule: match each collective across its group's members by (group, seq); the member that
entered it last is that collective's culprit, and every other member's wait (last arrival -
its own arrival) is charged to it. Never by the longest collective: the culprit has the
shortest ones, since the others are already waiting when it arrives.

- Chronic: the rank charged with the most waiting caused the most of it in >= 50% of the
  analysed steps, and its own compute (forward + backward + optimizer, no waiting) is >= 1.10x
  the median of the ranks (warning; >= 1.20x: error).
- Transient: otherwise, a window of >= 5 consecutive steps in each of which the same rank caused
  the most waiting with compute >= 1.10x that step's median, >= 1.20x over the window
  (a warning per window; the worst three are reported).

The first steps (10%, at least 2) are skipped: DDP rebuilds its buckets and caches are cold.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from dtprof.analysis.report import Finding
from dtprof.analysis.summarize import RunSummary

WARN_SLOWDOWN = 1.10
ERROR_SLOWDOWN = 1.20
CHRONIC_SHARE = 0.5
MIN_STEPS = 5
WINDOW_STEPS = 5
WINDOW_SLOWDOWN = 1.20
MAX_WINDOWS = 3


def warmup_steps(steps: pd.Series) -> int:
    """How many first steps to skip: 10% of them, at least 2."""
    n = int(steps.nunique())
    return max(2, n // 10)


@dataclass(frozen=True)
class Arrivals:
    """Who arrived last at each complete collective, and who waited how long, per step."""

    culprits: pd.DataFrame  # step, rank (the last to enter; ties: the lowest), caused_ns
    waited: pd.DataFrame  # step, rank, wait_ns: each rank's waiting at collectives in the step
    last_share: pd.Series  # by rank: share of the collectives it entered last (ties count)


def last_arrival_shares(run: RunSummary, first_step: int) -> pd.Series:
    """By rank: the share of the complete collectives from first_step on that it took part in
    and entered last (a tie counts for every rank in it)."""
    last_counts, member_rows = pd.Series(dtype="float64"), pd.Series(dtype="float64")
    for g in run.matched:
        keep = g.complete & (g.step >= first_step)
        if not keep.any():
            continue
        start = g.start[keep]
        last = (start == start.max(axis=1, keepdims=True)).sum(axis=0)
        last_counts = last_counts.add(pd.Series(last, index=g.ranks), fill_value=0)
        member_rows = member_rows.add(pd.Series(int(keep.sum()), index=g.ranks), fill_value=0)
    return last_counts / member_rows


def arrivals(run: RunSummary, first_step: int) -> Arrivals:
    """Charge the waiting at every complete collective from first_step on to its last arriver."""
    culprits, waited = [], []
    for g in run.matched:
        keep = g.complete & (g.step >= first_step)
        if not keep.any():
            continue
        start, step = g.start[keep], g.step[keep]
        last = start.max(axis=1)
        wait = last[:, None] - start
        culprits.append(
            pd.DataFrame(
                {"step": step, "rank": g.ranks[start.argmax(axis=1)], "caused_ns": wait.sum(axis=1)}
            )
        )
        order = np.argsort(step, kind="stable")
        steps, bounds = np.unique(step[order], return_index=True)
        per_step = np.add.reduceat(wait[order], bounds, axis=0)
        waited.append(
            pd.DataFrame(
                {
                    "step": np.repeat(steps, len(g.ranks)),
                    "rank": np.tile(g.ranks, len(steps)),
                    "wait_ns": per_step.ravel(),
                }
            )
        )
    shares = last_arrival_shares(run, first_step)
    if not culprits:
        empty = pd.DataFrame({"step": [], "rank": [], "caused_ns": []}, dtype="int64")
        return Arrivals(empty, empty.rename(columns={"caused_ns": "wait_ns"}), shares)
    waits = pd.concat(waited, ignore_index=True).groupby(["step", "rank"], as_index=False).sum()
    return Arrivals(pd.concat(culprits, ignore_index=True), waits, shares)


def check(run: RunSummary) -> list[Finding]:
    if run.world_size < 2 or run.collectives.empty or run.steps.empty:
        return []
    skip = warmup_steps(run.steps["step"])
    steps = run.steps[run.steps["step"] >= skip]
    if steps["step"].nunique() < MIN_STEPS or steps["compute_ns"].isna().all():
        return []  # too short, or no phases recorded (no model given to profile())
    arr = arrivals(run, skip)
    if arr.culprits.empty:
        return []
    # each step's culprit: the rank that caused the most waiting in it
    per_step = arr.culprits.groupby(["step", "rank"])["caused_ns"].sum().unstack(fill_value=0)
    step_culprit = per_step.idxmax(axis=1)
    caused_by = arr.culprits.groupby("rank")["caused_ns"].sum()
    suspect = int(caused_by.idxmax())
    compute = steps.groupby("rank")["compute_ns"].median()
    slowdown = float(compute[suspect] / compute.median())
    share = float((step_culprit == suspect).mean())
    if share >= CHRONIC_SHARE and slowdown >= WARN_SLOWDOWN:
        return [_finding(run, steps, arr, suspect, slowdown, chronic=True, share=share)]
    return _transient(run, steps, arr, step_culprit)


def _transient(
    run: RunSummary, steps: pd.DataFrame, arr: Arrivals, step_culprit: pd.Series
) -> list[Finding]:
    """Windows of consecutive steps with one slow last arriver."""
    step_no, rank_no, compute = _compute_matrix(steps)
    culprit = step_culprit.reindex(step_no)
    known = culprit.notna().to_numpy()
    cols = pd.Index(rank_no).get_indexer(culprit.fillna(-1).astype(int))
    own = np.where(known & (cols >= 0), compute[np.arange(len(cols)), cols], np.nan)
    with np.errstate(all="ignore"):
        ratio = own / np.nanmedian(compute, axis=1) if compute.size else own
    flagged = ratio >= WARN_SLOWDOWN
    # runs of flagged steps with the same culprit, steps consecutive
    who = np.where(flagged, culprit.fillna(-1).to_numpy(), -1)
    breaks = np.r_[True, (who[1:] != who[:-1]) | (np.diff(step_no) != 1)]
    starts = np.flatnonzero(breaks)
    ends = np.r_[starts[1:], len(who)] - 1
    culprit_runs = who[starts] >= 0
    first, last = starts[culprit_runs], ends[culprit_runs]
    runs = pd.DataFrame(
        {
            "rank": who[first],
            "first": step_no[first],
            "last": step_no[last],
            "n": last - first + 1,
            "slowdown": [np.median(ratio[a : b + 1]) for a, b in zip(first, last, strict=True)],
        }
    )
    runs = runs[(runs["n"] >= WINDOW_STEPS) & (runs["slowdown"] >= WINDOW_SLOWDOWN)]
    findings = []
    for w in runs.sort_values("n", ascending=False).head(MAX_WINDOWS).itertuples():
        window = steps[steps["step"].between(w.first, w.last)]
        findings.append(
            _finding(run, window, arr, int(w.rank), float(w.slowdown), chronic=False, share=1.0)
        )
    return sorted(findings, key=lambda f: f.first_step or 0)


def _compute_matrix(steps: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Compute ns by step (rows) and rank (columns), both sorted, NaN where a rank has none;
    steps and ranks without any value left out (``pivot_table``'s mean, without its cost)."""
    values = steps["compute_ns"].to_numpy(np.float64)
    has = ~np.isnan(values)
    step_no, row = np.unique(steps["step"].to_numpy()[has], return_inverse=True)
    rank_no, col = np.unique(steps["rank"].to_numpy()[has], return_inverse=True)
    total = np.zeros((len(step_no), len(rank_no)))
    count = np.zeros((len(step_no), len(rank_no)))
    np.add.at(total, (row, col), values[has])
    np.add.at(count, (row, col), 1)
    with np.errstate(invalid="ignore"):
        return step_no, rank_no, total / count


def _finding(
    run: RunSummary,
    steps: pd.DataFrame,
    arr: Arrivals,
    suspect: int,
    slowdown: float,
    *,
    chronic: bool,
    share: float,
) -> Finding:
    """The finding for one culprit over the given steps, with its cost and a what-if."""
    in_steps = steps["step"].unique()
    culprits = arr.culprits[arr.culprits["step"].isin(in_steps)]
    caused_s = float(culprits.loc[culprits["rank"] == suspect, "caused_ns"].sum()) / 1e9
    # what-if: the culprit at the median compute; the others wait at most that much less
    median = steps.groupby("step")["compute_ns"].median()
    step_ns = steps.groupby("step")["step_ns"].median()
    excess = steps[steps["rank"] == suspect].set_index("step")["compute_ns"] - median
    waited = arr.waited[(arr.waited["rank"] != suspect) & arr.waited["step"].isin(in_steps)]
    waited = waited.groupby("step")["wait_ns"].max().reindex(step_ns.index, fill_value=0)
    saving = np.minimum(excess.reindex(step_ns.index).clip(lower=0).fillna(0), waited)
    speedup = float(step_ns.sum() / (step_ns - saving).sum())
    first, last = int(in_steps.min()), int(in_steps.max())
    host = run.meta[suspect].get("host", "?")
    matched = len(culprits)
    last_share = float(arr.last_share.get(suspect, 0.0))
    if chronic:
        severity = "error" if slowdown >= ERROR_SLOWDOWN else "warning"
        message = (
            f"rank {suspect} is a straggler: its compute is {slowdown:.2f}x the median and it "
            f"arrived last at {last_share:.0%} of {matched} collectives; the other ranks "
            f"waited {caused_s:.2f} s for it, and steps would be {speedup:.2f}x faster if it "
            f"ran at the median"
        )
        suggestion = (
            f"look at rank {suspect}'s host ({host}) and device: clocks and temperature "
            "(NVML samples), another process on it, or larger inputs on that rank"
        )
    else:
        severity = "warning"
        message = (
            f"rank {suspect} straggled in steps {first}-{last}: its compute was {slowdown:.2f}x "
            f"the median there and it held the others up at each of those steps; they waited "
            f"{caused_s:.2f} s for it, and those steps would be {speedup:.2f}x faster without it"
        )
        suggestion = (
            f"find what else ran on rank {suspect}'s host ({host}) around steps {first}-{last}: "
            "a checkpoint or evaluation on that rank, another job, thermal throttling (NVML "
            "samples), a garbage collection"
        )
    return Finding(
        code="straggler",
        severity=severity,
        ranks=[suspect],
        first_step=first,
        last_step=last,
        message=message,
        suggestion=suggestion,
        evidence={
            "slowdown": round(slowdown, 4),
            "wait_caused_s": round(caused_s, 6),
            "speedup_if_fixed": round(speedup, 4),
            "chronic": chronic,
            "last_arrival_share": round(last_share, 4),
            "steps_last": round(share, 4),
            "collectives_matched": matched,
            "median_compute_ms": {
                int(r): round(v / 1e6, 3)
                for r, v in steps.groupby("rank")["compute_ns"].median().items()
            },
        },
    )
