"""data-stall: steps in which a rank waited for its input while the others waited for it.

Rule: a rank's data phase (from the end of a step to its next forward) stalls in a step when it
is longer than 10% of the median step and more than 5x the median data phase of all ranks.
Reported for a rank with stalls in at least 2 analysed steps that together cost at least 3% of
its time (scheduling jitter on a busy host makes the odd short one); the first 10% of steps, at
least 2, are skipped. A warning; an error when stalls take more than 10% of the rank's time.
"""

from __future__ import annotations

from itertools import pairwise

import numpy as np

from dtprof.analysis.columns import group_sum, groups, nan_median, rows, values, warmup_steps
from dtprof.analysis.report import Finding
from dtprof.analysis.summarize import RunSummary

STEP_SHARE = 0.10
OVER_MEDIAN = 5.0
MIN_STALLS = 2
MIN_SHARE = 0.03
ERROR_SHARE = 0.10


def check(run: RunSummary) -> list[Finding]:
    steps = run.steps
    if not steps.num_rows or np.isnan(values(steps, "data_ns", np.float64)).all():
        return []
    steps = rows(steps, values(steps, "step") >= warmup_steps(values(steps, "step")))
    step, rank = values(steps, "step"), values(steps, "rank")
    step_ns, data_ns = values(steps, "step_ns", np.float64), values(steps, "data_ns", np.float64)
    median_step = nan_median(step_ns)
    median_data = nan_median(data_ns)
    bar = max(STEP_SHARE * median_step, OVER_MEDIAN * median_data)
    (ranks,), inverse = groups(rank)
    time_ns = group_sum(inverse, len(ranks), step_ns)
    # the stalls by rank, each rank's in the steps' order
    stalls = np.flatnonzero(data_ns > bar)
    stalls = stalls[np.argsort(inverse[stalls], kind="stable")]
    at = inverse[stalls]
    cuts = np.r_[0, np.flatnonzero(np.diff(at)) + 1, len(at)]
    findings = []
    for lo, hi in pairwise(cuts.tolist()):
        if hi - lo < MIN_STALLS:
            continue
        mine = stalls[lo:hi]
        r = int(ranks[at[lo]])
        stall_steps = sorted(step[mine].tolist())
        stall_ns = data_ns[mine]
        lost_s = float((stall_ns - median_data).sum()) / 1e9
        share = lost_s * 1e9 / float(time_ns[at[lo]])
        if share < MIN_SHARE:
            continue
        gaps = np.diff(stall_steps)
        period = int(gaps[0]) if len(gaps) and (gaps == gaps[0]).all() else None
        every = f", every {period} steps" if period else ""
        findings.append(
            Finding(
                code="data-stall",
                severity="error" if share > ERROR_SHARE else "warning",
                ranks=[r],
                first_step=stall_steps[0],
                last_step=stall_steps[-1],
                message=(
                    f"rank {r} waited for its input in {len(stall_steps)} steps{every} "
                    f"(median {nan_median(stall_ns) / 1e6:.1f} ms against "
                    f"{median_data / 1e6:.2f} ms usually), {share:.0%} of its time; the other "
                    "ranks waited for it at the next collective"
                ),
                suggestion=(
                    "give its data loader more workers or prefetching (num_workers, "
                    "prefetch_factor, pin_memory), and look for slow storage or "
                    "uneven sample sizes on that rank"
                ),
                evidence={
                    "stall_steps": stall_steps,
                    "stall_ms_median": round(nan_median(stall_ns) / 1e6, 3),
                    "data_ms_median": round(median_data / 1e6, 3),
                    "period_steps": period,
                    "lost_s": round(lost_s, 6),
                    "share_of_time": round(share, 4),
                },
            )
        )
    return findings
