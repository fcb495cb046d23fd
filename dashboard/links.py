"""Addresses inside the dashboard: a page and its window, and the page that shows a finding."""

from __future__ import annotations

from urllib.parse import parse_qs, urlencode

from dtprof.analysis.report import Finding

MAX_LINK_RANKS = 8  # a finding about more ranks opens on its first few
TIMELINE_STEPS = 3  # steps a timeline link shows: enough to see the pattern, few bars

# which page shows each finding best
PAGE_OF = {
    "straggler": "/timeline",
    "data-stall": "/timeline",
    "hang": "/timeline",
    "rank-stopped": "/timeline",
    "poor-overlap": "/communication",
    "pipeline-bubble": "/pipeline",
    "non-finite": "/divergence",
    "replica-divergence": "/divergence",
    "loss-spike": "/divergence",
    "memory-growth": "/memory",
}


def parse_ranks(text: str | None) -> list[int] | None:
    """``0,3,8-15`` to a sorted list; None when empty or not a rank list."""
    if not text or not text.strip():
        return None
    ranks: set[int] = set()
    try:
        for part in text.replace(" ", "").split(","):
            lo, sep, hi = part.partition("-")
            ranks.update(range(int(lo), int(hi) + 1) if sep else [int(lo)])
    except ValueError:
        return None
    return sorted(r for r in ranks if r >= 0)


def format_ranks(ranks: list[int]) -> str:
    """The inverse of parse_ranks, runs folded: [0, 1, 2, 5] -> ``0-2,5``."""
    out: list[str] = []
    for r in sorted(set(ranks)):
        if out and "-" in out[-1] and int(out[-1].split("-")[1]) == r - 1:
            out[-1] = f"{out[-1].split('-')[0]}-{r}"
        elif out and "-" not in out[-1] and int(out[-1]) == r - 1:
            out[-1] = f"{out[-1]}-{r}"
        else:
            out.append(str(r))
    return ",".join(out)


def parse_steps(text: str | None) -> tuple[int | None, int | None]:
    """``A:B`` (A included, B excluded, either may be empty) or ``A``; (None, None) otherwise."""
    if not text or not text.strip():
        return None, None
    first, sep, last = text.strip().partition(":")
    try:
        lo = int(first) if first else None
        hi = (int(last) if last else None) if sep else (lo + 1 if lo is not None else None)
    except ValueError:
        return None, None
    return lo, hi


def format_steps(first: int | None, last: int | None) -> str:
    return f"{'' if first is None else first}:{'' if last is None else last}"


def query(search: str | None) -> dict[str, str]:
    """A location's ``?a=1&b=2`` as a dict of the first value of each key."""
    return {k: v[0] for k, v in parse_qs((search or "").lstrip("?")).items() if v}


def href(page: str, **params: str) -> str:
    given = {k: v for k, v in params.items() if v}
    return f"{page}?{urlencode(given)}" if given else page


def finding_href(finding: Finding) -> str:
    """The page, ranks and steps that show a finding."""
    page = PAGE_OF.get(finding.code, "/ranks")
    shown = finding.ranks[:MAX_LINK_RANKS]
    if finding.code in ("straggler", "data-stall") and shown:
        # the culprit with a few neighbours: the ranks that wait for it, side by side
        shown = sorted({*shown, *range(max(shown[0] - 2, 0), shown[0] + 3)})
    ranks = format_ranks(shown)
    first = finding.first_step
    if page == "/timeline":
        stalls = finding.evidence.get("stall_steps") if finding.code == "data-stall" else None
        if stalls:
            first = int(stalls[0]) - 1  # the stall and the steps around it
        elif finding.code in ("hang", "rank-stopped"):
            first = max((finding.first_step or 1) - 2, 0)
        first = first or 0
        return href(page, ranks=ranks, steps=format_steps(first, first + TIMELINE_STEPS))
    if page == "/pipeline":
        return href(page, step=str(finding.first_step or 0))
    return href(page, ranks=ranks, steps=format_steps(finding.first_step, None))
