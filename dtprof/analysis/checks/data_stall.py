"""data-stall: steps in which a rank waited for its input while the others waited for it.

Rule: a rank's data phase (from the end of a step to its next forward) stalls in a step when it
is longer than 10% of the median step and more than 5x the median data phase of all ranks.
Reported for a rank with stalls in at least 2 analysed steps that together cost at least 1% of
its time (scheduling jitter on a busy host makes the odd short one); the first 10% of steps, at
least 2, are skipped. A warning; an error when stalls take more than 10% of the rank's time.
"""

from __future__ import annotations

import numpy as np

from dtprof.analysis.checks.straggler import warmup_steps
from dtprof.analysis.report import Finding
from dtprof.analysis.summarize import RunSummary

STEP_SHARE = 0.10
OVER_MEDIAN = 5.0
MIN_STALLS = 2
MIN_SHARE = 0.01
ERROR_SHARE = 0.10


def check(run: RunSummary) -> list[Finding]:
    steps = run.steps
    if steps.empty or steps["data_ns"].isna().all():
        return []
    steps = steps[steps["step"] >= warmup_steps(steps["step"])]
    median_step = float(steps["step_ns"].median())
    median_data = float(steps["data_ns"].median())
    bar = max(STEP_SHARE * median_step, OVER_MEDIAN * median_data)
    stalls = steps[steps["data_ns"] > bar]
    findings = []
    for rank, rows in stalls.groupby("rank"):
        if len(rows) < MIN_STALLS:
            continue
        stall_steps = sorted(int(s) for s in rows["step"])
        lost_s = float((rows["data_ns"] - median_data).sum()) / 1e9
        share = lost_s * 1e9 / float(steps.loc[steps["rank"] == rank, "step_ns"].sum())
        if share < MIN_SHARE:
            continue
        gaps = np.diff(stall_steps)
        period = int(gaps[0]) if len(gaps) and (gaps == gaps[0]).all() else None
        every = f", every {period} steps" if period else ""
        findings.append(
            Finding(
                code="data-stall",
                severity="error" if share > ERROR_SHARE else "warning",
                ranks=[int(rank)],
                first_step=stall_steps[0],
                last_step=stall_steps[-1],
                message=(
                    f"rank {rank} waited for its input in {len(stall_steps)} steps{every} "
                    f"(median {rows['data_ns'].median() / 1e6:.1f} ms against "
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
                    "stall_ms_median": round(float(rows["data_ns"].median()) / 1e6, 3),
                    "data_ms_median": round(median_data / 1e6, 3),
                    "period_steps": period,
                    "lost_s": round(lost_s, 6),
                    "share_of_time": round(share, 4),
                },
            )
        )
    return findings
