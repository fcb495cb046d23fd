"""Reports as text for a terminal and Markdown for a CI comment; JSON is Report.to_json()."""

from __future__ import annotations

from collections.abc import Sequence

from dtprof.analysis.report import Finding, Report
from dtprof.analysis.throughput import rate_text

_COLUMNS = ("rank", "steps", "step_ms", "compute_ms", "data_ms", "other_ms")
_HEADERS = ("rank", "steps", "step ms", "compute ms", "data ms", "other ms")


def _cell(value: object) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def _headline(report: Report) -> str:
    t, s = report.trace, report.summary
    median = s.get("median_step_ms")
    step = f", median step {median:.2f} ms" if median is not None else ""
    ranks = f"{len(t['ranks_analysed'])} of {t['world_size']} ranks"
    return f"{t['path']}: {ranks}, {t['steps']} steps{step}"


def _throughput(report: Report) -> list[str]:
    """The job's throughput, and its model FLOPs and MFU, where the run has them: a line each."""
    t = report.summary.get("throughput")
    if not t:
        return []
    lines = []
    rates = [
        f"{rate_text(t[key])} {unit}/s"
        for key, unit in (("samples_per_s", "samples"), ("tokens_per_s", "tokens"))
        if t.get(key) is not None
    ]
    if rates:
        lines.append(f"throughput: {', '.join(rates)} (the sum over {len(t['ranks'])} ranks)")
    if t.get("tflop_per_step") is not None:
        line = (
            f"model FLOPs: {_flop(t['tflop_per_step'] * 1e12)} per step, "
            f"{_flop(t['tflops_per_rank'] * 1e12)}/s per rank ({t['flops_from']})"
        )
        if t.get("mfu_pct") is not None:
            peak = f" of {t['peak_tflops']:g} TFLOP/s" if t.get("peak_tflops") else ""
            line += f"; MFU {t['mfu_pct']:.1f}%{peak} ({t['peak_of']})"
        lines.append(line)
    return lines


def _flop(value: float) -> str:
    """FLOP with the prefix that suits it: ``189 MFLOP``, ``47.2 TFLOP``."""
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= scale:
            return f"{value / scale:.3g} {prefix}FLOP"
    return f"{value:.3g} FLOP"


def _rank_cells(report: Report) -> list[list[str]]:
    """The per-rank table's cells, one list per rank, in _COLUMNS order."""
    return [[_cell(row.get(c)) for c in _COLUMNS] for row in report.summary.get("ranks", [])]


_GPU_COLUMNS = ("rank", "span_ms", "idle_pct", "compute_pct", "non_compute_pct", "comm_ms",
                "comm_overlap_pct")  # fmt: skip
_GPU_HEADERS = ("rank", "GPU span ms", "idle %", "compute %", "non-compute %", "comm ms",
                "overlap %")  # fmt: skip


_BW_COLUMNS = ("group", "ranks", "op", "band", "calls", "time_ms", "algbw_gbs", "busbw_gbs",
               "busbw_p10_gbs", "of_link_pct")  # fmt: skip
_BW_HEADERS = ("group", "ranks", "op", "size", "calls", "median ms", "algbw GB/s", "busbw GB/s",
               "busbw p10", "of link %")  # fmt: skip
BANDWIDTH_ROWS = 12  # in text and Markdown, the rows whose calls took longest; JSON has all


def _bandwidth(report: Report) -> tuple[list[str], list[list[str]], list[str]]:
    """(headers, the rows' cells, lines under the table) of the collectives' bandwidth, or
    nothing: the link's column only where a link is given."""
    block = report.summary.get("bandwidth") or {}
    rows = block.get("rows", [])
    if not rows:
        return [], [], []
    width = len(_BW_COLUMNS) if "link" in block else len(_BW_COLUMNS) - 1
    cells = [[_cell(row.get(c)) for c in _BW_COLUMNS[:width]] for row in rows[:BANDWIDTH_ROWS]]
    notes = [block["definitions"]]
    if "link" in block:
        notes.append(f"link: {block['link']['what']}")
    if len(rows) > BANDWIDTH_ROWS:
        notes.append(f"{len(rows) - BANDWIDTH_ROWS} more rows in --format json")
    return list(_BW_HEADERS[:width]), cells, notes


_TIMING_COLUMNS = ("rank", "kind", "name", "count", "host_ms", "gpu_ms", "launch_ms")
_TIMING_HEADERS = ("rank", "kind", "name", "count", "host ms", "GPU ms", "launch queue ms")


def _gpu_timing(report: Report) -> tuple[list[list[str]], str]:
    """The cells of the CUDA-event timing table (recorded CUDA jobs), and its definitions."""
    block = report.summary.get("gpu_timing") or {}
    cells = [[_cell(row.get(c)) for c in _TIMING_COLUMNS] for row in block.get("rows", [])]
    return cells, block.get("definitions", "")


def _text_table(title: str, headers: Sequence[str], cells: list[list[str]], note: str) -> list[str]:
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers)]
    lines = [title, "  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    return [*lines, f"({note})", ""]


def _markdown_table(
    title: str, headers: Sequence[str], cells: list[list[str]], note: str
) -> list[str]:
    lines = [title, "", "| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(row) + " |" for row in cells]
    return [*lines, "", f"*{note}.*", ""]


GPU_TIMING_TITLE = "timed on the GPU (CUDA events), medians per rank:"
BANDWIDTH_TITLE = "collective bandwidth (the calls that took longest in all first):"

NO_STEPS = "no training steps (no ProfilerStep#N): the GPU figures cover the whole trace"


def _gpu_cells(report: Report) -> list[list[str]]:
    """Per-rank GPU figures (imported profiler traces only), in _GPU_COLUMNS order."""
    gpu = report.summary.get("gpu") or {}
    return [[_cell(row.get(c)) for c in _GPU_COLUMNS] for row in gpu.get("ranks", [])]


def _where(f: Finding) -> str:
    return f"ranks {', '.join(map(str, f.ranks))}, steps {f.first_step}-{f.last_step}"


def text(report: Report) -> str:
    """Headline, per-rank table, then findings by severity with evidence and a suggestion."""
    lines = [_headline(report), ""]
    if _throughput(report):
        lines += [*_throughput(report), ""]
    if _rank_cells(report):
        widths = [max(len(h), 8) for h in _HEADERS]
        lines.append("  ".join(h.rjust(w) for h, w in zip(_HEADERS, widths, strict=True)))
        for cells in _rank_cells(report):
            lines.append("  ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True)))
        lines.append("")
    elif _gpu_cells(report):
        lines += [NO_STEPS, ""]
    headers, cells_of_bw, notes = _bandwidth(report)
    if cells_of_bw:
        lines += _text_table(BANDWIDTH_TITLE, headers, cells_of_bw, "; ".join(notes))
    if _gpu_cells(report):
        gw = [max(len(h), 8) for h in _GPU_HEADERS]
        lines.append("  ".join(h.rjust(w) for h, w in zip(_GPU_HEADERS, gw, strict=True)))
        for cells in _gpu_cells(report):
            lines.append("  ".join(c.rjust(w) for c, w in zip(cells, gw, strict=True)))
        lines += [f"({report.summary['gpu']['definitions']})", ""]
    timing, note = _gpu_timing(report)
    if timing:
        lines += _text_table(GPU_TIMING_TITLE, _TIMING_HEADERS, timing, note)
    grouped = report.by_cause()
    if not grouped:
        lines.append("no findings")
    for cause, consequences in grouped:
        lines += _text_finding(cause, "")
        for f in consequences:
            lines += _text_finding(f, f"    caused by the {cause.code} above: ")
    return "\n".join(lines)


def _text_finding(f: Finding, lead: str) -> list[str]:
    pad = " " * 4 if lead else ""
    lines = [f"{lead}{f.severity.upper()} {f.code} ({_where(f)}): {f.message}"]
    lines.append(f"{pad}    try: {f.suggestion}")
    evidence = ", ".join(f"{k}={v}" for k, v in f.evidence.items() if not isinstance(v, dict))
    if evidence:
        lines.append(f"{pad}    evidence: {evidence}")
    return lines


def markdown(report: Report) -> str:
    """The same as text(), as Markdown."""
    lines = [f"### dtprof: {_headline(report)}", ""]
    for line in _throughput(report):  # a paragraph each
        lines += [line, ""]
    if _rank_cells(report):
        lines.append("| " + " | ".join(_HEADERS) + " |")
        lines.append("|" + "---|" * len(_HEADERS))
        for cells in _rank_cells(report):
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    elif _gpu_cells(report):
        lines += [NO_STEPS, ""]
    headers, cells_of_bw, notes = _bandwidth(report)
    if cells_of_bw:
        lines += _markdown_table(
            BANDWIDTH_TITLE.capitalize(), headers, cells_of_bw, "; ".join(notes)
        )
    if _gpu_cells(report):
        lines.append("| " + " | ".join(_GPU_HEADERS) + " |")
        lines.append("|" + "---|" * len(_GPU_HEADERS))
        lines += ["| " + " | ".join(cells) + " |" for cells in _gpu_cells(report)]
        lines += ["", f"*{report.summary['gpu']['definitions']}.*", ""]
    timing, note = _gpu_timing(report)
    if timing:
        lines += _markdown_table(GPU_TIMING_TITLE.capitalize(), _TIMING_HEADERS, timing, note)
    grouped = report.by_cause()
    if not grouped:
        lines.append("No findings.")
    for cause, consequences in grouped:
        lines.append(f"- {_markdown_finding(cause)}")
        lines += [f"  - caused by it: {_markdown_finding(f)}" for f in consequences]
    return "\n".join(lines)


def _markdown_finding(f: Finding) -> str:
    return f"**{f.severity}** `{f.code}` {_where(f)}: {f.message}. *Try:* {f.suggestion}."
