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

    def worst(self) -> str | None:
        """The most severe severity among the findings, or None."""
        if not self.findings:
            return None
        return max((f.severity for f in self.findings), key=severity_rank)
