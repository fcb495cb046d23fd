"""Ranks: rank x step heatmaps of step time, compute, exposed communication and waiting."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import plotly.graph_objects as go
from dash import Dash, Input, Output, html

from dashboard import figures, measures
from dashboard.components import graph, note, window_controls
from dashboard.links import format_steps, parse_ranks, parse_steps
from dashboard.shape import Grid, grid, only_ranks, window
from dashboard.source import Snapshot

PATH = "/ranks"
TITLE = "Ranks"
MAX_RANK_STEPS = 200_000  # rank x step cells swept for communication by default


def default_steps(snap: Snapshot) -> tuple[int | None, int | None]:
    """All steps, or the last ones when the run is too large to sweep at once."""
    steps = snap.data.steps
    if steps.empty:
        return None, None
    span = MAX_RANK_STEPS // max(len(snap.data.ranks), 1)
    last = int(steps["step"].max())
    return (None, None) if steps["step"].nunique() <= span else (last + 1 - span, None)


def grids(
    snap: Snapshot, ranks: list[int] | None, steps: tuple[int | None, int | None]
) -> list[tuple[str, Grid]]:
    """The four metrics, in ms, binned."""
    run = snap.data.run
    cut = replace(
        run,
        steps=only_ranks(window(run.steps, steps), ranks),
        phases=only_ranks(window(run.phases, steps), ranks),
        collectives=window(run.collectives, steps),  # every member: needed to match
    )
    per = cut.steps
    comm = only_ranks(measures.transfers(cut), ranks)
    exp = measures.exposed(comm, cut.phases)
    exp["value"] = (exp["comm_ns"] - exp["overlap_ns"]) / 1e6
    wait = only_ranks(measures.waiting(cut), ranks)
    return [
        ("step time (ms)", grid(per.assign(value=per["step_ns"] / 1e6))),
        (
            "compute: forward + backward + optimizer (ms)",
            grid(per.assign(value=per["compute_ns"] / 1e6)),
        ),
        ("exposed communication (ms)", grid(exp)),
        (
            "waiting for the last rank at collectives (ms)",
            grid(wait.assign(value=wait["wait_ns"] / 1e6)),
        ),
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
    steps = parse_steps(steps_text) if steps_text else default_steps(snap)
    gs = grids(snap, parse_ranks(ranks_text), steps)
    if all(g.z.size == 0 for _, g in gs):
        return figures.empty("No data in this window.")
    return figures.heatmaps(gs, culprits(snap))


def layout(snap: Snapshot, q: dict[str, str]) -> html.Div:
    first, last = default_steps(snap)
    steps = q.get("steps") or ("" if first is None else format_steps(first, last))
    return html.Div(
        [
            window_controls("ranks", q.get("ranks", ""), steps),
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
