"""Ranks: rank x step heatmaps of step time, compute, exposed communication and waiting."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
from dash import Dash, Input, Output, html

from dashboard import figures, heatmaps, measures
from dashboard.components import graph, note, window_controls
from dashboard.links import parse_ranks, parse_steps
from dashboard.shape import Grid, grid, only_ranks, window
from dashboard.source import Snapshot

PATH = "/ranks"
TITLE = "Ranks"


def grids(
    snap: Snapshot, ranks: list[int] | None, steps: tuple[int | None, int | None]
) -> list[tuple[str, Grid]]:
    """The four metrics, in ms, binned (from the snapshot's per rank-step measures)."""
    per = only_ranks(window(measures.rank_steps(snap.data), steps), ranks)
    ms = {
        "step": per["step_ns"] / 1e6,
        "compute": per["compute_ns"] / 1e6,
        "exposed": (per["comm_ns"] - per["overlap_ns"]) / 1e6,
        "wait": per["wait_ns"] / 1e6,
    }
    return [
        ("step time (ms)", grid(per.assign(value=ms["step"]))),
        ("compute: forward + backward + optimizer (ms)", grid(per.assign(value=ms["compute"]))),
        ("exposed communication (ms)", grid(per.assign(value=ms["exposed"]))),
        ("waiting for the last rank at collectives (ms)", grid(per.assign(value=ms["wait"]))),
    ]


def culprits(snap: Snapshot) -> dict[int, str]:
    """rank -> the codes of the findings that name it."""
    marks: dict[int, list[str]] = {}
    for f in snap.findings:
        for r in f.ranks:
            marks.setdefault(r, []).append(f.code)
    return {r: f"rank {r}: " + ", ".join(codes) for r, codes in marks.items()}


def update(snap: Snapshot, ranks_text: str | None, steps_text: str | None) -> go.Figure:
    if snap.data.steps.empty:
        return figures.empty("No completed step yet.")
    gs = grids(snap, parse_ranks(ranks_text), parse_steps(steps_text))
    if all(g.z.size == 0 for _, g in gs):
        return figures.empty("No data in this window.")
    return heatmaps.heatmaps(gs, culprits(snap))


def layout(snap: Snapshot, q: dict[str, str]) -> html.Div:
    return html.Div(
        [
            window_controls("ranks", q.get("ranks", ""), q.get("steps", "")),
            note(
                "Each cell is the largest value of its ranks and steps; "
                "▸ marks ranks named by a finding."
            ),
            graph("ranks-heatmaps"),
        ]
    )


def register(app: Dash, snapshot: Any) -> None:
    @app.callback(
        Output("ranks-heatmaps", "figure"),
        Input("app-version", "data"),
        Input("ranks-ranks", "value"),
        Input("ranks-steps", "value"),
    )
    def _refresh(_v: int | None, ranks: str | None, steps: str | None) -> go.Figure:
        return update(snapshot(), ranks, steps)
