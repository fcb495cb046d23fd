"""straggler: the rank the others wait for, found by arrival time at matched collectives.

Rule: match each collective across its group's members by (group, seq); the member that
entered it last is that collective's culprit, and every other member's wait (last arrival -
its own arrival) is charged to it. Never by the longest collective: the culprit has the
shortest ones, since the others are already waiting when it arrives.

- Chronic: the rank charged with the most waiting caused the most of it in >= 50% of the
  analysed steps, and from the step it became slow (see _onset) its own compute (forward +
  backward + optimizer, no waiting) is >= 1.10x the median of the ranks, or >= 1.03x when it
  caused the most waiting in so many of those steps that ranks of equal speed would come to it
  by chance less than once in a thousand runs: a small excess, held that consistently, is no
  jitter (warning; >= 1.20x: error). It must still be that slow over the last quarter of the
  steps (else it was a passing window), and its extra compute must account for at least a
  quarter of the waiting it caused (else it was late from its data phase: data-stall's).
  Where it became slow: see _onset.
- Transient: otherwise, a window of >= 5 consecutive steps in each of which the same rank caused
  the most waiting with compute >= 1.10x that step's median, >= 1.20x over the window
  (a warning per window; the longest three are reported). The window goes on over the steps
  next to it where that rank's compute was still >= 1.10x, though another rank was later still
  there.

The first steps (10%, at least 2) are skipped: DDP rebuilds its buckets and caches are cold.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa

from dtprof.analysis.arrivals import Arrivals, arrivals
from dtprof.analysis.columns import (
    group_median,
    group_sum_ns,
    groups,
    nan_median,
    rows,
    values,
    warmup_steps,
)
from dtprof.analysis.device import clock_note
from dtprof.analysis.report import Finding
from dtprof.analysis.summarize import RunSummary
from dtprof.analysis.throughput import job_rates, rate_text

WARN_SLOWDOWN = 1.10
ERROR_SLOWDOWN = 1.20
CHRONIC_SHARE = 0.5
CONSISTENT_SLOWDOWN = 1.03  # enough for a rank that held the others up consistently:
CONSISTENT_CHANCE = 0.001  # as often as equal ranks would by chance at most this rarely
EXPLAINED_SHARE = 0.25  # of the waiting it caused, its extra compute accounts for at least this
MIN_STEPS = 5
WINDOW_STEPS = 5
WINDOW_SLOWDOWN = 1.20
MAX_WINDOWS = 3
ONSET_STEPS = 2  # a chronic straggler's onset is found from this many analysed steps on


def check(run: RunSummary) -> list[Finding]:
    if run.world_size < 2 or not run.collectives.num_rows or not run.steps.num_rows:
        return []
    skip = warmup_steps(values(run.steps, "step"))
    steps = rows(run.steps, values(run.steps, "step") >= skip)
    compute_ns = values(steps, "compute_ns", np.float64)
    if len(np.unique(values(steps, "step"))) < MIN_STEPS or np.isnan(compute_ns).all():
        return []  # too short, or no phases recorded (no model given to profile())
    arr = arrivals(run, skip)
    if not len(arr.step):
        return []
    culprit_steps, step_culprit = _step_culprits(arr)
    # a collective after the last step (a barrier before the end) is in no analysed step
    analysed = np.isin(culprit_steps, values(steps, "step"))
    culprit_steps, step_culprit = culprit_steps[analysed], step_culprit[analysed]
    if not len(culprit_steps):
        return []
    ranks, inverse = np.unique(arr.culprit, return_inverse=True)
    suspect = int(ranks[np.argmax(group_sum_ns(inverse.ravel(), len(ranks), arr.caused_ns))])
    if (step_culprit == suspect).mean() >= CHRONIC_SHARE:
        # judged from the step it became slow: before it, it was one of the others
        onset = _onset(steps, culprit_steps, step_culprit, suspect)
        since = rows(steps, values(steps, "step") >= onset)
        held = step_culprit[culprit_steps >= onset] == suspect
        share = float(held.mean())
        slowdown = _slowdown(since, suspect)
        by_chance = _chance_held(int(held.sum()), len(held), run.world_size)
        bar = CONSISTENT_SLOWDOWN if by_chance <= CONSISTENT_CHANCE else WARN_SLOWDOWN
        tail = rows(since, values(since, "step") >= _tail_from(since))
        if (
            slowdown >= bar
            and _slowdown(tail, suspect) >= bar  # still slow at the end: not a passing window
            and _explained(run, since, suspect) >= EXPLAINED_SHARE
        ):
            return [_finding(run, since, arr, suspect, slowdown, chronic=True, share=share)]
    return _transient(run, steps, arr, culprit_steps, step_culprit)


def _chance_held(held: int, steps: int, ranks: int) -> float:
    """The chance that, of ``ranks`` equally fast ranks, one would hold the others up in at
    least ``held`` of ``steps`` steps: each is the step's culprit with chance 1/ranks, so a
    binomial tail, times the ranks (any one of them could have been the suspect)."""
    p = 1 / ranks
    j = np.arange(held, steps + 1)
    log_factorial = np.r_[0.0, np.cumsum(np.log(np.arange(1, steps + 1)))]
    log_terms = (
        log_factorial[steps]
        - log_factorial[j]
        - log_factorial[steps - j]
        + j * np.log(p)
        + (steps - j) * np.log1p(-p)
    )
    return min(1.0, ranks * float(np.exp(log_terms).sum()))


def _tail_from(steps: pa.Table) -> int:
    """The first of the last quarter of the steps (at least MIN_STEPS of them)."""
    distinct = np.unique(values(steps, "step"))
    return int(distinct[-max(MIN_STEPS, len(distinct) // 4) :][0])


def _explained(run: RunSummary, steps: pa.Table, rank: int) -> float:
    """How much of the others' waiting for ``rank`` its extra compute accounts for: its median
    excess over each step's median compute, over the median of each step's longest wait at a
    collective it entered last. A rank late from its data phase (a stall, a leaking loader)
    makes them wait as long with no extra compute."""
    step_no, rank_no, compute = _compute_matrix(steps)
    col = np.searchsorted(rank_no, rank)
    if col >= len(rank_no) or rank_no[col] != rank:
        return 0.0
    excess = compute[:, col] - np.nanmedian(compute, axis=1)
    waited = np.zeros(len(step_no), np.int64)
    for g in run.matched:
        member = np.flatnonzero(g.ranks == rank)
        keep = g.complete & np.isin(g.step, step_no)
        if not len(member) or not keep.any():
            continue
        start = g.start[keep]
        late = start[:, member[0]] == start.max(axis=1)  # it entered last
        wait = (start.max(axis=1) - start.min(axis=1))[late]
        np.maximum.at(waited, np.searchsorted(step_no, g.step[keep][late]), wait)
    median_wait = float(np.median(waited))
    return float(np.nanmedian(excess)) / median_wait if median_wait > 0 else 1.0


def _slowdown(steps: pa.Table, rank: int) -> float:
    """A rank's median compute over the median of all ranks' medians (NaN without any)."""
    step_ranks, compute = _by_rank_median(values(steps, "rank"), values(steps, "compute_ns", float))
    at = np.searchsorted(step_ranks, rank)
    own = compute[at] if at < len(step_ranks) and step_ranks[at] == rank else np.nan
    return float(own / nan_median(compute))


def _onset(
    steps: pa.Table, culprit_steps: np.ndarray, step_culprit: np.ndarray, suspect: int
) -> int:
    """The step a chronic straggler became slow: of the steps with at least half of those it
    held the others up in from there on (the evidence it is chronic), the one where its compute
    over the step's median splits best into a level before, nearer the others' than its own
    after, and that level; where none does (a few percent of excess is within a step's jitter,
    and a rank may have been a little slower all along), the one where the share of steps it
    held the others up in splits best into at most half and the rest; else the first analysed
    step."""
    held = (step_culprit == suspect).astype(np.float64)
    step_no, rank_no, compute = _compute_matrix(steps)
    col = np.searchsorted(rank_no, suspect)
    with np.errstate(all="ignore"):
        excess = compute[:, col] / np.nanmedian(compute, axis=1) - 1
    known = ~np.isnan(excess)
    candidates = step_no[known]
    at = _split(
        excess[known],
        lambda before, after, k: (
            (before < after / 2) & _most_held_after(culprit_steps, held, candidates[k])
        ),
    )
    if at is not None:
        return int(candidates[at])
    at = _split(
        held,
        lambda before, after, k: (
            (before <= after / 2) & _most_held_after(culprit_steps, held, culprit_steps[k])
        ),
    )
    return int(culprit_steps[at if at is not None else 0])


def _most_held_after(culprit_steps: np.ndarray, held: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """For each step, whether at least half of the steps a rank held the others up in are from
    it on (culprit_steps ascending)."""
    before = np.r_[0.0, np.cumsum(held)][np.searchsorted(culprit_steps, steps)]
    return held.sum() - before >= before


def _split(
    x: np.ndarray, admits: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]
) -> int | None:
    """The index where x splits best (least squares) into a level before and one after (at
    least ONSET_STEPS before, MIN_STEPS after), of the splits k that admits(mean before, mean
    after, k) takes; None where it takes none."""
    if len(x) < MIN_STEPS + ONSET_STEPS:
        return None
    total, square, n = np.cumsum(x), np.cumsum(x**2), np.arange(1, len(x) + 1)
    k = np.arange(ONSET_STEPS, len(x) - MIN_STEPS + 1)
    before_sse = square[k - 1] - total[k - 1] ** 2 / n[k - 1]
    after_sum, after_sq, after_n = (
        total[-1] - total[k - 1],
        square[-1] - square[k - 1],
        n[-1] - n[k - 1],
    )
    sse = before_sse + after_sq - after_sum**2 / after_n
    ok = admits(total[k - 1] / n[k - 1], after_sum / after_n, k)
    return int(k[ok][np.argmin(sse[ok])]) if ok.any() else None


def _step_culprits(arr: Arrivals) -> tuple[np.ndarray, np.ndarray]:
    """The steps with collectives, and each one's culprit: the rank that caused the most waiting
    in it, the lowest of equals; in a step where none caused any, the lowest culprit of all (the
    first column of a step x rank table of the waiting caused)."""
    (step, rank), inverse = groups(arr.step, arr.culprit)
    caused = group_sum_ns(inverse, len(step), arr.caused_ns)
    order = np.lexsort((-caused, step))  # stable: ranks ascending among equals
    top = order[np.r_[True, np.diff(step[order]) != 0]]
    culprit = np.where(caused[top] > 0, rank[top], rank.min())
    return step[top], culprit


def _transient(
    run: RunSummary,
    steps: pa.Table,
    arr: Arrivals,
    culprit_steps: np.ndarray,
    step_culprit: np.ndarray,
) -> list[Finding]:
    """Windows of consecutive steps with one slow last arriver."""
    step_no, rank_no, compute = _compute_matrix(steps)
    with np.errstate(all="ignore"):
        ratio = compute / np.nanmedian(compute, axis=1, keepdims=True)  # step x rank
    # check() saw compute: every step of the matrix has some, and there are steps with culprits
    at = np.minimum(np.searchsorted(culprit_steps, step_no), len(culprit_steps) - 1)
    culprit = np.where(culprit_steps[at] == step_no, step_culprit[at], -1)
    col = np.minimum(np.searchsorted(rank_no, culprit), len(rank_no) - 1)
    culprit_ratio = np.where(rank_no[col] == culprit, ratio[np.arange(len(col)), col], np.nan)
    # runs of flagged steps with the same culprit, steps consecutive
    who = np.where(culprit_ratio >= WARN_SLOWDOWN, culprit, -1)
    breaks = np.r_[True, (who[1:] != who[:-1]) | (np.diff(step_no) != 1)]
    starts = np.flatnonzero(breaks)
    ends = np.r_[starts[1:], len(who)] - 1
    culprit_runs = who[starts] >= 0
    first, last = starts[culprit_runs], ends[culprit_runs]
    n = last - first + 1
    slowdown = np.array(
        [np.median(culprit_ratio[a : b + 1]) for a, b in zip(first, last, strict=True)]
    )
    wanted = (n >= WINDOW_STEPS) & (slowdown >= WINDOW_SLOWDOWN)
    first, last, suspects = _widened(
        first[wanted], last[wanted], who[first[wanted]], step_no, rank_no, ratio
    )
    n = last - first + 1
    cols = np.searchsorted(rank_no, suspects)
    slowdown = np.array(
        [np.median(ratio[a : b + 1, c]) for a, b, c in zip(first, last, cols, strict=True)]
    )
    held = np.array(
        [(culprit[a : b + 1] == r).mean() for a, b, r in zip(first, last, suspects, strict=True)]
    )
    # the longest first, as pandas' sort_values(ascending=False) ordered them (quicksort of
    # the reversed lengths, reversed): which of equally long windows make the cut
    longest = np.arange(len(n))[::-1][n[::-1].argsort(kind="quicksort")][::-1]
    findings = []
    step = values(steps, "step")
    for i in longest[:MAX_WINDOWS]:
        window = rows(steps, (step >= step_no[first[i]]) & (step <= step_no[last[i]]))
        rank = int(suspects[i])
        findings.append(
            _finding(run, window, arr, rank, float(slowdown[i]), chronic=False, share=held[i])
        )
    return sorted(findings, key=lambda f: f.first_step or 0)


def _widened(
    first: np.ndarray,
    last: np.ndarray,
    ranks: np.ndarray,
    step_no: np.ndarray,
    rank_no: np.ndarray,
    ratio: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each window (rows first..last of the step x rank table of compute over the step's
    median, ``ratio``; its rank in ``ranks``) goes on over the consecutive steps next to it
    where its rank's compute was still >= 1.10x the step's median, though another rank was
    later still there: one late step of another rank splits no window. Windows of one rank
    that then overlap become one. Returns each window's first and last row and its rank,
    in the order of their rows."""
    follows = np.r_[np.diff(step_no) == 1, False]  # row i + 1 is the step after row i
    spans: dict[int, list[list[int]]] = {}
    for a, b, rank in zip(first.tolist(), last.tolist(), ranks.tolist(), strict=True):
        slow = ratio[:, np.searchsorted(rank_no, rank)] >= WARN_SLOWDOWN
        while a > 0 and follows[a - 1] and slow[a - 1]:
            a -= 1
        while follows[b] and slow[b + 1]:
            b += 1
        mine = spans.setdefault(rank, [])
        for other in mine:
            if a <= other[1] and other[0] <= b:  # overlapping: one window
                other[0], other[1] = min(a, other[0]), max(b, other[1])
                break
        else:
            mine.append([a, b])
    merged = sorted((a, b, rank) for rank, windows in spans.items() for a, b in windows)
    return (
        np.array([a for a, _, _ in merged], np.int64),
        np.array([b for _, b, _ in merged], np.int64),
        np.array([rank for _, _, rank in merged], np.int64),
    )


def _held_in(share: float, first: int, last: int) -> str:
    """ "each of those steps", or "k of those n steps"."""
    n = last - first + 1
    held = round(share * n)
    return "each of those steps" if held == n else f"{held} of those {n} steps"


def _compute_matrix(steps: pa.Table) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Compute ns by step (rows) and rank (columns), both sorted, NaN where a rank has none;
    steps and ranks without any value left out (a pivot table of the mean)."""
    compute = values(steps, "compute_ns", np.float64)
    has = ~np.isnan(compute)
    step_no, row = np.unique(values(steps, "step")[has], return_inverse=True)
    rank_no, col = np.unique(values(steps, "rank")[has], return_inverse=True)
    total = np.zeros((len(step_no), len(rank_no)))
    count = np.zeros((len(step_no), len(rank_no)))
    np.add.at(total, (row, col), compute[has])
    np.add.at(count, (row, col), 1)
    with np.errstate(invalid="ignore"):
        return step_no, rank_no, total / count


def _finding(
    run: RunSummary,
    steps: pa.Table,
    arr: Arrivals,
    suspect: int,
    slowdown: float,
    *,
    chronic: bool,
    share: float,
) -> Finding:
    """The finding for one culprit over the given steps, with its cost and a what-if."""
    step, rank = values(steps, "step"), values(steps, "rank")
    compute = values(steps, "compute_ns", np.float64)
    (in_steps,), by_step = groups(step)
    culprits = np.isin(arr.step, in_steps)
    caused_s = float(arr.caused_ns[culprits & (arr.culprit == suspect)].sum()) / 1e9
    # what-if: the culprit at the median compute; the others wait at most that much less
    median = group_median(by_step, len(in_steps), compute)
    step_ns = group_median(by_step, len(in_steps), values(steps, "step_ns", np.float64))
    own = np.full(len(in_steps), np.nan)
    own[by_step[rank == suspect]] = compute[rank == suspect]
    excess = own - median
    others = (arr.wait_rank != suspect) & np.isin(arr.wait_step, in_steps)
    waited = np.zeros(len(in_steps), np.int64)  # waiting is never negative: 0 where none
    np.maximum.at(waited, np.searchsorted(in_steps, arr.wait_step[others]), arr.wait_ns[others])
    saving = np.minimum(np.where(np.isnan(excess), 0.0, np.maximum(excess, 0)), waited)
    speedup = float(np.nansum(step_ns) / np.nansum(step_ns - saving))
    rates = job_rates(run, in_steps)  # samples/s and tokens/s, where the run has them
    if_fixed = {f"{name}_if_fixed": round(v * speedup, 1) for name, v in rates.items()}
    first, last = int(in_steps.min()), int(in_steps.max())
    host = run.meta[suspect].host or "?"
    matched = int(culprits.sum())
    last_share = float(arr.last_share.get(suspect, 0.0))
    # what NVML saw of its GPU's clocks (None: not sampled, as on CPU)
    clocks = clock_note(run.device, suspect, first, last)
    throttled = clocks is not None and clocks[0]
    if chronic:
        severity = "error" if slowdown >= ERROR_SLOWDOWN else "warning"
        message = (
            f"rank {suspect} is a straggler: its compute is {slowdown:.2f}x the median and it "
            f"arrived last at {last_share:.0%} of {matched} collectives; the other ranks "
            f"waited {caused_s:.2f} s for it, and steps would be {speedup:.2f}x faster if it "
            f"ran at the median{_throughput_if_fixed(rates, speedup)}"
        )
        suggestion = (
            f"look at rank {suspect}'s host ({host}) and device: clocks and temperature "
            "(NVML samples), another process on it, or larger inputs on that rank"
        )
        if clocks is not None and throttled:
            suggestion = (
                f"rank {suspect}'s GPU is throttled ({clocks[1]}): look at its cooling and "
                f"power limit on {host} (nvidia-smi -q -d PERFORMANCE), or leave that GPU out"
            )
        elif clocks is not None:
            suggestion = (
                f"rank {suspect}'s GPU is not throttled ({clocks[1]}): look at what else runs "
                f"on it or on its host ({host}), or larger inputs on that rank"
            )
    else:
        severity = "warning"
        message = (
            f"rank {suspect} straggled in steps {first}-{last}: its compute was {slowdown:.2f}x "
            f"the median there and it held the others up in {_held_in(share, first, last)}; "
            f"they waited {caused_s:.2f} s for it, and those steps would be {speedup:.2f}x "
            f"faster without it{_throughput_if_fixed(rates, speedup)}"
        )
        suggestion = (
            f"find what else ran on rank {suspect}'s host ({host}) around steps {first}-{last}: "
            "a checkpoint or evaluation on that rank, another job, thermal throttling (NVML "
            "samples), a garbage collection"
        )
        if clocks is not None and throttled:
            suggestion = (
                f"rank {suspect}'s GPU was throttled in steps {first}-{last} ({clocks[1]}): "
                f"look at its cooling and power on {host} (nvidia-smi -q -d PERFORMANCE)"
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
            **rates,
            **if_fixed,
            "chronic": chronic,
            **({"gpu_clocks": clocks[1], "gpu_throttled": throttled} if clocks else {}),
            "last_arrival_share": round(last_share, 4),
            "steps_last": round(share, 4),
            "collectives_matched": matched,
            "median_compute_ms": {
                r: round(v / 1e6, 3)
                for r, v in zip(*(a.tolist() for a in _by_rank_median(rank, compute)), strict=True)
            },
        },
    )


def _throughput_if_fixed(rates: dict[str, float], speedup: float) -> str:
    """``(1,200 -> 1,500 samples/s)``: the job's throughput now and without the straggler."""
    parts = [
        f"{rate_text(v)} -> {rate_text(v * speedup)} {name.removesuffix('_per_s')}/s"
        for name, v in rates.items()
    ]
    return f" ({', '.join(parts)})" if parts else ""


def _by_rank_median(rank: np.ndarray, compute: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The ranks, sorted, and the median of each one's compute ns."""
    (ranks,), inverse = groups(rank)
    return ranks, group_median(inverse, len(ranks), compute)
