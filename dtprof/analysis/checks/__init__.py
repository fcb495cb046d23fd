"""The checks `analyze` runs, in order. Adding one is a module here and a line in CHECKS."""

from __future__ import annotations

from collections.abc import Callable

from dtprof.analysis.checks import (
    data_stall,
    hang,
    loss_spike,
    memory_growth,
    non_finite,
    partial_data,
    pipeline_bubble,
    poor_overlap,
    rank_stopped,
    replica_divergence,
    slow_link,
    slow_stage,
    straggler,
)
from dtprof.analysis.report import Finding
from dtprof.analysis.summarize import RunSummary

Check = Callable[[RunSummary], list[Finding]]

CHECKS: list[Check] = [
    rank_stopped.check,
    hang.check,
    non_finite.check,
    replica_divergence.check,
    straggler.check,
    data_stall.check,
    poor_overlap.check,
    pipeline_bubble.check,
    slow_stage.check,
    slow_link.check,
    loss_spike.check,
    memory_growth.check,
    partial_data.check,
]
