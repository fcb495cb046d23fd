"""Root cause first: a finding that follows from another is marked ``caused_by`` it.

Each rule names a cause, a consequence and the evidence that ties them: the same ranks, the
steps in order, a figure of the consequence that the cause explains. A finding keeps its own
severity (a hang is still a hang) but the reports list it under its cause, so that the user
starts from the rank that failed first and not from the noise it made.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from dtprof.analysis.report import Finding

Rule = Callable[[Finding, Finding], bool]

SLOW_STAGE_SHARE = 0.1  # of a bubble's idle time, on slower stages: the slow stage's doing
ONSET_STEPS = 2  # a leak and a stall on one rank that start this close are one thing


def _peer_lost(cause: Finding, then: Finding) -> bool:
    """Ranks that raised when a collective failed, after this rank stopped."""
    return cause.severity == "error" and set(cause.ranks) <= set(then.evidence.get("after", []))


def _waited_for_stopped(cause: Finding, then: Finding) -> bool:
    """A hang whose missing ranks are ranks that stopped."""
    return cause.severity == "error" and set(then.ranks) <= set(cause.ranks)


def _spike_near_non_finite(cause: Finding, then: Finding) -> bool:
    """A loss that shot up just before (or while) values went non-finite."""
    return (
        then.first_step is not None
        and cause.first_step is not None
        and then.first_step >= cause.first_step - 5
    )


def _diverged_after_non_finite(cause: Finding, then: Finding) -> bool:
    return (
        then.first_step is not None
        and cause.first_step is not None
        and then.first_step >= cause.first_step
    )


def _bubble_of_slow_stage(cause: Finding, then: Finding) -> bool:
    split = then.evidence.get("idle_split") or {}
    return float(split.get("slow_stage", 0.0)) >= SLOW_STAGE_SHARE


def _stall_of_leak(cause: Finding, then: Finding) -> bool:
    """A rank's data phase that stalls from where its memory began to grow: the loader that
    leaks spends its time making what it keeps."""
    return (
        set(then.ranks) <= set(cause.ranks)
        and cause.first_step is not None
        and then.first_step is not None
        and abs(then.first_step - cause.first_step) <= ONSET_STEPS
    )


def _slowed_by_leak(cause: Finding, then: Finding) -> bool:
    """A rank slow from where its memory began to grow, or later: a growing heap slows what runs
    beside it (the allocator, the collector over what is kept, page faults)."""
    return (
        set(then.ranks) <= set(cause.ranks)
        and cause.first_step is not None
        and then.first_step is not None
        and then.first_step >= cause.first_step
    )


# (cause code, consequence code, the rule that ties a pair), tried in this order
RULES: list[tuple[str, str, Rule]] = [
    ("rank-stopped", "rank-stopped", _peer_lost),
    ("rank-stopped", "hang", _waited_for_stopped),
    ("non-finite", "loss-spike", _spike_near_non_finite),
    ("non-finite", "replica-divergence", _diverged_after_non_finite),
    ("slow-stage", "pipeline-bubble", _bubble_of_slow_stage),
    ("memory-growth", "data-stall", _stall_of_leak),
    ("memory-growth", "straggler", _slowed_by_leak),
]


def link(findings: list[Finding]) -> list[Finding]:
    """The findings, each consequence with ``caused_by`` set to its first cause's code and
    ranks (a finding that is itself a consequence causes nothing)."""
    out = list(findings)
    for i, then in enumerate(out):
        for cause_code, then_code, rule in RULES:
            if then.code != then_code:
                continue
            cause = next(
                (
                    c
                    for c in out
                    if c.code == cause_code and c is not then and c.caused_by is None
                    if rule(c, then)
                ),
                None,
            )
            if cause is not None:
                out[i] = replace(then, caused_by={"code": cause.code, "ranks": list(cause.ranks)})
                break
    return out
