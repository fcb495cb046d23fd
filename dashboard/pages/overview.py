"""Overview: the run's headline, where a step goes, and every finding by severity."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from dash import Dash, Input, Output, html

from dashboard import figures
from dashboard.components import finding_card, graph, note
from dashboard.rundata import RunData
from dashboard.shape import MAX_RANK_BINS, MAX_STEP_BINS, rank_bins
from dashboard.source import Snapshot
from dtprof.analysis.report import Report, severity_rank

PATH = "/"
TITLE = "Overview"


def headline(data: RunData) -> dict[str, Any]:
    """Ranks, steps, median step time and its split, from the per-step table."""
    steps = data.steps
    out: dict[str, Any] = {"ranks": len(data.ranks), "steps": int(steps["step"].nunique())}
    if steps.empty:
        return out
    per = steps.groupby("rank")[["step_ns", "compute_ns", "data_ns"]].median() / 1e6
    step_ms = float(per["step_ns"].median())
    out["step_ms"] = step_ms
    for name in ("compute_ns", "data_ns"):
        value = per[name].median()
        out[name.replace("_ns", "_share")] = None if pd.isna(value) else float(value) / step_ms
    return out


def step_band(steps: pd.DataFrame, max_bins: int = MAX_STEP_BINS) -> pd.DataFrame:
    """step, min_ms, median_ms, max_ms across ranks; long runs binned (min of min, max of max)."""
    per = steps.groupby("step")["step_ns"].agg(["min", "median", "max"]) / 1e6
    if len(per) > max_bins:
        which = np.arange(len(per)) * max_bins // len(per)
        per = (
            per.groupby(which)
            .agg({"min": "min", "median": "median", "max": "max"})
            .set_index(per.index.to_numpy()[np.unique(which, return_index=True)[1]])
        )
    per.columns = ["min_ms", "median_ms", "max_ms"]
    return per.rename_axis("step").reset_index()


def time_split(steps: pd.DataFrame, max_bins: int = MAX_RANK_BINS) -> pd.DataFrame:
    """label, compute_ms, data_ms, other_ms: per rank medians, ranks binned by the mean."""
    per = steps.groupby("rank")[["step_ns", "compute_ns", "data_ns"]].median() / 1e6
    per = per.fillna({"compute_ns": 0.0, "data_ns": 0.0})
    per["other_ns"] = (per["step_ns"] - per["compute_ns"] - per["data_ns"]).clip(lower=0)
    per = per.reset_index()
    per["label"] = rank_bins(per["rank"], max_bins)
    out = per.groupby("label", sort=False)[["compute_ns", "data_ns", "other_ns"]].mean()
    out.columns = ["compute_ms", "data_ms", "other_ms"]
    return out.reset_index()


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
