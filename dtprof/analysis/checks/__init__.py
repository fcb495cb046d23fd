"""The checks `analyze` runs, in order. Adding one is a module here and a line in CHECKS."""

from __future__ import annotations

from collections.abc import Callable

from dtprof.analysis.checks import straggler
from dtprof.analysis.report import Finding
from dtprof.analysis.summarize import RunSummary

Check = Callable[[RunSummary], list[Finding]]

CHECKS: list[Check] = [
    straggler.check,
]
