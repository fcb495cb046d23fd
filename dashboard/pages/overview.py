"""Overview: the run's headline, where a step goes, and every finding by severity."""

from __future__ import annotations

from typing import Any

import pandas as pd
from dash import Dash, Input, Output, html

from dashboard import figures
from dashboard.components import finding_card, graph, note
from dashboard.rundata import RunData
from dashboard.shape import MAX_RANK_BINS, MAX_STEP_BINS, rank_bars, step_bars
from dashboard.source import Snapshot
from dtprof.analysis import measures
from dtprof.analysis.report import Report, severity_rank
from dtprof.analysis.throughput import rate_text, throughput

PATH = "/"
TITLE = "Overview"


def headline(data: RunData) -> dict[str, Any]:
    """Ranks, steps, median step time and its split (measures.typical_step)."""
    steps = data.steps
    out: dict[str, Any] = {"ranks": len(data.ranks), "steps": int(steps["step"].nunique())}
    if steps.empty:
        return out
    step_ns, shares = measures.typical_step(steps)
    return out | {"step_ms": step_ns / 1e6} | shares


def step_band(steps: pd.DataFrame, max_bins: int = MAX_STEP_BINS) -> pd.DataFrame:
    """step, min_ms, median_ms, max_ms across ranks; long runs binned (min of min, max of max)."""
    spread = measures.step_spread(steps)
    ms = spread[["min_ns", "median_ns", "max_ns"]] / 1e6
    ms.columns = ["min_ms", "median_ms", "max_ms"]
    return step_bars(pd.concat([spread[["step"]], ms], axis=1), max_bins)


def time_split(steps: pd.DataFrame, max_bins: int = MAX_RANK_BINS) -> pd.DataFrame:
    """label, compute_ms, data_ms, other_ms: per rank medians, ranks binned by the mean."""
    per = measures.rank_medians(steps)
    ms = pd.DataFrame(
        {
            "rank": per["rank"],
            "compute_ms": per["compute_ns"].fillna(0.0) / 1e6,
            "data_ms": per["data_ns"].fillna(0.0) / 1e6,
        }
    )
    ms["other_ms"] = (per["step_ns"] / 1e6 - ms["compute_ms"] - ms["data_ms"]).clip(lower=0)
    return rank_bars(ms, ["compute_ms", "data_ms", "other_ms"], max_bins)


def rates(data: RunData) -> dict[str, Any] | None:
    """The run's throughput and MFU (dtprof.analysis.throughput), made once per run."""
    return data.cached("throughput", lambda: throughput(data.run))  # type: ignore[no-any-return]


def _rate_cards(rate: dict[str, Any] | None) -> list[tuple[str, str]]:
    """(label, value) of the throughput cards: those the run has."""
    if not rate:
        return []
    cards = [
        (unit, rate_text(rate[key]))
        for key, unit in (("samples_per_s", "samples/s"), ("tokens_per_s", "tokens/s"))
        if rate.get(key) is not None
    ]
    if rate.get("mfu_pct") is not None:
        cards.append(("MFU", f"{rate['mfu_pct']:.1f}%"))
    elif rate.get("tflops_per_rank") is not None:
        cards.append(("TFLOP/s per rank", f"{rate['tflops_per_rank']:.3g}"))
    return cards


def _cards(head: dict[str, Any], snap: Snapshot) -> html.Div:
    def card(label: str, value: str) -> html.Div:
        return html.Div(
            [html.Div(value, className="card-value"), html.Div(label)], className="card"
        )

    def share(key: str) -> str:
        value = head.get(key)
        return "-" if value is None else f"{value:.0%}"

    worst = max((f.severity for f in snap.findings), key=severity_rank, default=None)
    return html.Div(
        [
            card("ranks", str(head["ranks"])),
            card("steps", str(head["steps"])),
            card("median step", f"{head['step_ms']:.1f} ms" if "step_ms" in head else "-"),
            card("compute", share("compute_share")),
            card("data", share("data_share")),
            *(card(label, value) for label, value in _rate_cards(rates(snap.data))),
            card("findings", f"{len(snap.findings)}" + (f" ({worst} worst)" if worst else "")),
        ],
        className="cards",
    )


def update(snap: Snapshot) -> list[Any]:
    """The page's whole body for one snapshot: cards, findings, charts."""
    data = snap.data
    head = headline(data)
    grouped = Report({}, {}, list(snap.findings)).by_cause()
    if grouped:
        listing: list[Any] = []
        for cause, consequences in grouped:
            listing.append(finding_card(cause))
            if consequences:
                listing.append(
                    html.Div(
                        [html.Div(f"caused by the {cause.code} above", className="note")]
                        + [finding_card(f) for f in consequences],
                        className="consequences",
                    )
                )
    elif snap.complete:
        listing = [note("No findings: no straggler, stall, divergence or bubble was detected.")]
    else:
        listing = [note("Findings appear once the whole trace is read.")]
    charts: list[Any]
    if data.steps.empty:
        charts = [note("No completed step yet.")]
    else:
        charts = [
            graph("overview-step-time", figures.step_time_band(step_band(data.steps))),
            graph("overview-split", figures.time_split(time_split(data.steps))),
        ]
    return [
        _cards(head, snap),
        html.H3("Findings"),
        html.Div(listing, id="overview-findings"),
        html.Div(charts, className="charts"),
    ]


def layout(snap: Snapshot, q: dict[str, str]) -> html.Div:
    return html.Div(update(snap), id="overview-body")


def register(app: Dash, snapshot: Any) -> None:
    @app.callback(Output("overview-body", "children"), Input("app-version", "data"))
    def _refresh(_version: int | None) -> list[Any]:
        return update(snapshot())
