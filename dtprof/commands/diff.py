"""``dtprof diff BASE NEW``: two runs compared (dtprof.analysis.diff), in text, JSON or Markdown,
and an exit code for CI (``--fail-on-regression``)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from dtprof.commands.output import deliver

LABELS = {
    "step_ms": "step",
    "compute_ms": "compute",
    "exposed_comm_ms": "exposed communication",
    "data_ms": "data",
    "other_ms": "other (waiting, idle)",
}


def run(args: argparse.Namespace) -> int:
    """Compare two runs (recorded traces or profiler traces): step time and its split, ranks,
    throughput, memory, bandwidth and findings; exit 1 with --fail-on-regression PCT when the
    step time (or --metric) got worse by more than PCT and the change is called."""
    from dtprof.analysis import analyze_run
    from dtprof.analysis.diff import diff, regression

    base = analyze_run(args.base, progress=True)
    new = analyze_run(args.new, progress=True)
    result = diff(base, new)
    if args.fail_on_regression is not None:
        result["regression"] = regression(result, args.metric, args.fail_on_regression)
    if args.format == "json":
        out = json.dumps(result, indent=1)
    else:
        out = markdown(result) if args.format == "markdown" else text(result)
    deliver(out, args.output, "comparison")
    return 1 if result.get("regression", {}).get("failed") else 0


def _value(v: Any) -> str:
    return "-" if v is None else f"{v:.2f}" if isinstance(v, float) else str(v)


def _verdict(m: dict[str, Any]) -> str:
    if m.get("base") is None:
        return "not in both runs"
    if not m["called"]:
        return "no change called"
    return "slower" if m["change_pct"] > 0 else "faster"


def _change(v: float | None) -> str:
    return "-" if v is None else f"{v:+.1f}%"


def _metric_rows(result: dict[str, Any]) -> list[list[str]]:
    return [
        [
            LABELS[name],
            _value(m.get("base")),
            _value(m.get("new")),
            _change(m.get("change_pct")),
            _change(m.get("noise_pct")).lstrip("+"),
            "-" if m.get("p") is None else f"{m['p']:.2g}",
            _verdict(m),
        ]
        for name, m in result["metrics"].items()
    ]


GPU_LABELS = {
    "span_ms": ("span", " ms"),
    "idle_pct": ("idle", "%"),
    "compute_pct": ("compute", "%"),
    "non_compute_pct": ("non-compute", "%"),
    "comm_overlap_pct": ("overlap", "%"),
}
HEADERS = ["median ms per step", "base", "new", "change", "noise", "p", ""]


def _lines(result: dict[str, Any]) -> list[tuple[str, list[str]]]:
    """The sections after the step table, as (title, lines)."""
    sections = []
    ranks = [
        f"rank {r['rank']} {LABELS[r['metric']]}: {r['base']:.2f} -> {r['new']:.2f} ms "
        f"({_change(r['change_pct'])}, p {r['p']})"
        for r in result["ranks"]
    ]
    if ranks:
        sections.append(("ranks whose own steps changed", ranks))
    other = []
    for name, t in result["throughput"].items():
        other.append(
            f"{name}: {_value(t['base'])} -> {_value(t['new'])} ({_change(t['change_pct'])})"
        )
    for name, t in result["memory"].items():
        other.append(
            f"{name}: {_value(t['base'])} -> {_value(t['new'])} ({_change(t['change_pct'])})"
        )
    for b in result["bandwidth"]:
        other.append(
            f"{b['op']} {b['band']} (group {b['group']}): {b['time_ms']['base']:.3f} -> "
            f"{b['time_ms']['new']:.3f} ms, busbw {b['busbw_gbs']['base']:.3f} -> "
            f"{b['busbw_gbs']['new']:.3f} GB/s ({_change(b['busbw_change_pct'])})"
        )
    for g in result["gpu"]:
        figures = ", ".join(
            f"{label} {_value(g[name]['base'])} -> {_value(g[name]['new'])}{unit}"
            for name, (label, unit) in GPU_LABELS.items()
        )
        other.append(f"rank {g['rank']} GPU: {figures}")
    if other:
        sections.append(
            ("throughput, memory, bandwidth and GPU (point figures, not tested)", other)
        )
    found = result["findings"]
    changed = [
        f"appeared: {f['code']} (ranks {f['ranks']}): {f['message']}" for f in found["appeared"]
    ]
    changed += [f"went away: {f['code']} (ranks {f['ranks']})" for f in found["went_away"]]
    if changed:
        sections.append(("findings", changed))
    reg = result.get("regression")
    if reg:
        word = "FAILED" if reg["failed"] else "passed"
        sections.append(
            (
                "regression gate",
                [
                    f"{word}: {LABELS[reg['metric']]} changed {_change(reg['change_pct'])} "
                    f"(limit +{reg['limit_pct']:g}%, and the change must be called)"
                ],
            )
        )
    return sections


def _headline(result: dict[str, Any]) -> str:
    b, n = result["base"], result["new"]
    return (
        f"{b['path']} ({b['ranks']} ranks, {b['steps_compared']} steps) -> "
        f"{n['path']} ({n['ranks']} ranks, {n['steps_compared']} steps)"
    )


def text(result: dict[str, Any]) -> str:
    table = [HEADERS, *_metric_rows(result)]
    widths = [max(len(row[i]) for row in table) for i in range(len(HEADERS))]
    lines = [_headline(result), ""]
    for row in table:
        left = (0, len(row) - 1)  # the names and the verdicts
        cells = [
            c.ljust(w) if i in left else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    lines += [f"(a change is called on a {result['test']})", ""]
    for title, body in _lines(result):
        lines += [f"{title}:", *(f"  {line}" for line in body), ""]
    return "\n".join(lines).rstrip()


def markdown(result: dict[str, Any]) -> str:
    lines = [f"### dtprof diff: {_headline(result)}", ""]
    lines.append("| " + " | ".join([*HEADERS[:-1], "verdict"]) + " |")
    lines.append("|" + "---|" * len(HEADERS))
    lines += ["| " + " | ".join(row) + " |" for row in _metric_rows(result)]
    lines += ["", f"*A change is called on a {result['test']}.*", ""]
    for title, body in _lines(result):
        lines += [f"**{title[0].upper() + title[1:]}**", "", *(f"- {line}" for line in body), ""]
    return "\n".join(lines).rstrip()
