"""partial-data: hooks that raised and were switched off, so later data of that kind is absent.

Rule: every rank whose metadata lists ``disabled_hooks`` (or whose trace has ``hook-error``
events) is named, with each hook and the step from which its data is missing. Info: the rest of
the trace is sound, but a check that needs the missing data (phases for straggler, overlap and
data-stall; collectives for hang and straggler) sees less of the run after that step.
"""

from __future__ import annotations

import json

import pyarrow as pa

from dtprof.analysis.columns import rows, sort_order, values
from dtprof.analysis.report import Finding
from dtprof.analysis.summarize import RunSummary


def _switched_off(run: RunSummary) -> dict[int, dict[str, int | None]]:
    """Per rank: hook -> the step it was switched off at (None when no event says)."""
    off: dict[int, dict[str, int | None]] = {}
    for rank in run.ranks:
        hooks = run.meta[rank].disabled_hooks
        if hooks:
            off[rank] = {str(h): None for h in hooks}
    for rank, step, detail in _hook_errors(run.events):
        try:
            hook = str(json.loads(detail).get("hook"))
        except (ValueError, AttributeError):
            continue
        per = off.setdefault(int(rank), {})
        if per.get(hook) is None:
            per[hook] = int(step)
    return off


def _hook_errors(events: pa.Table) -> list[tuple[int, int, str]]:
    """(rank, step, detail) of the hook-error events, in the order of their times."""
    if not events.num_rows:
        return []
    errors = rows(events, values(events, "kind") == "hook-error")
    errors = errors.take(sort_order(errors, "ts_ns"))
    return list(zip(*(values(errors, c) for c in ("rank", "step", "detail")), strict=True))


def check(run: RunSummary) -> list[Finding]:
    off = _switched_off(run)
    if not off:
        return []
    steps = [s for per in off.values() for s in per.values() if s is not None]
    hooks = sorted({h for per in off.values() for h in per})
    where = "; ".join(
        f"rank {r}: "
        + ", ".join(f"{h} from step {s}" if s is not None else h for h, s in sorted(per.items()))
        for r, per in sorted(off.items())
    )
    return [
        Finding(
            code="partial-data",
            severity="info",
            ranks=sorted(off),
            first_step=min(steps) if steps else None,
            last_step=None,
            message=(
                f"data is partial: recording hook(s) {', '.join(hooks)} raised and were "
                f"switched off while training went on ({where})"
            ),
            suggestion=(
                "read the hook-error events (dtprof info, or trace.events) for the exception; "
                "findings after those steps rest on less data"
            ),
            evidence={
                "hooks": {int(r): sorted(per) for r, per in off.items()},
                "from_step": {int(r): per for r, per in off.items()},
            },
        )
    ]
