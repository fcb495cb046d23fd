"""Pipeline schedules: the idle time their shape implies, shared by the checks and the
dashboard."""

from __future__ import annotations


def schedule_bubble(schedule: str, stages: int, microbatches: int, per_rank: int) -> float:
    """The share of a step a pipeline schedule leaves each stage idle, by its own shape: for p
    stages, m microbatches and v stages per rank, (p-1)/(m+p-1) for GPipe and 1F1B,
    (p-1)/(v*m+p-1) for interleaved schedules, about a third of that for zero-bubble ones."""
    p, m, v = stages // max(per_rank, 1), microbatches, max(per_rank, 1)
    if p <= 1:
        return 0.0
    if "ZeroBubble" in schedule or "ZBV" in schedule or "DualPipe" in schedule:
        return (p - 1) / (3 * (v * m + p - 1))
    if v > 1:
        return (p - 1) / (v * m + p - 1)
    return (p - 1) / (m + p - 1)
