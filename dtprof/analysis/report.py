"""Finding and Report: what analysis concludes, and their JSON form (docs/report-format.md)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

REPORT_SCHEMA = "dtprof.report/1"
SEVERITIES = ("info", "warning", "error")


def severity_rank(severity: str) -> int:
    """0 for info, 1 for warning, 2 for error."""
    return SEVERITIES.index(severity)


@dataclass(frozen=True)
class Finding:
    """One thing wrong (or worth knowing): where, when, why, what it costs, what to try."""

    code: str
    severity: str
    ranks: list[int]
    first_step: int | None
    last_step: int | None
    message: str
    suggestion: str
    evidence: dict[str, Any] = field(default_factory=dict)
    caused_by: dict[str, Any] | None = None  # {"code", "ranks"} of the finding it follows from

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES}, not {self.severity!r}")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Report:
    """The whole analysis of one trace: what was analysed, per-rank summary, findings."""

    trace: dict[str, Any]
    summary: dict[str, Any]
    findings: list[Finding]

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": REPORT_SCHEMA,
            "trace": self.trace,
            "summary": self.summary,
            "findings": [f.to_json() for f in self.sorted_findings()],
        }

    def sorted_findings(self) -> list[Finding]:
        """Most severe first, then by code and first rank."""
        return sorted(
            self.findings,
            key=lambda f: (-severity_rank(f.severity), f.code, f.ranks[:1], f.first_step or 0),
        )

    def by_cause(self) -> list[tuple[Finding, list[Finding]]]:
        """The findings that follow from no other (sorted_findings' order), each with the
        findings caused by it."""
        ordered = self.sorted_findings()
        roots = [f for f in ordered if f.caused_by is None]
        under: dict[int, list[Finding]] = {id(f): [] for f in roots}
        for f in ordered:
            if f.caused_by is None:
                continue
            cause = next(
                (
                    r
                    for r in roots
                    if r.code == f.caused_by["code"] and r.ranks == f.caused_by["ranks"]
                ),
                None,
            )
            if cause is None:  # its cause is not in this report: shown on its own
                roots.append(f)
                under[id(f)] = []
            else:
                under[id(cause)].append(f)
        return [(f, under[id(f)]) for f in roots]

    def worst(self) -> str | None:
        """The most severe severity among the findings, or None."""
        if not self.findings:
            return None
        return max((f.severity for f in self.findings), key=severity_rank)
