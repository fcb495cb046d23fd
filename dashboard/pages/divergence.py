"""Divergence: logged scalars per rank with non-finite values marked, fingerprint mismatches."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pyarrow as pa
import pyarrow.compute as pc
from dash import Dash, Input, Output, dcc, html

from dashboard import figures, heatmaps
from dashboard.components import graph, note, window_controls
from dashboard.links import parse_ranks, parse_steps
from dashboard.rundata import RunData
from dashboard.shape import band, grid, only_ranks
from dashboard.source import Snapshot
from dtprof.analysis.columns import distinct
from dtprof.analysis.fingerprints import odd_counts

PATH = "/divergence"
TITLE = "Divergence"


def scalar_names(data: RunData) -> list[str]:
    names = sorted(distinct(data.run.scalars, "name"))
    return sorted(names, key=lambda n: "loss" not in n)  # the loss first


def scalar_lines(
    data: RunData, name: str, ranks: list[int] | None, steps: tuple[int | None, int | None]
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The finite values as lines, and the non-finite ones as markers (y: that step's median)."""
    rows = only_ranks(data.window_frame("scalars", steps, equal=("name", name)), ranks)
    finite = np.isfinite(rows["value"].to_numpy(dtype=float))
    lines = band(rows[finite][["rank", "step", "value"]])
    bad = rows[~finite]
    median = rows[finite].groupby("step")["value"].median()
    y = bad["step"].map(median).fillna(median.median() if len(median) else 0.0)
    marks = pd.DataFrame(
        {
            "step": bad["step"],
            "y": y,
            "hover": "rank "
            + bad["rank"].astype(str)
            + " step "
            + bad["step"].astype(str)
            + ": "
            + bad["value"].astype(str),
        }
    )
    return lines, marks


def fingerprint_grid(data: RunData, ranks: list[int] | None) -> pd.DataFrame:
    """rank, step, value: tensors whose fingerprint differs from the majority's (0 when none)."""
    fp = data.run.fingerprints
    if ranks is not None and fp.num_rows:
        fp = fp.filter(pc.is_in(fp.column("rank"), pa.array(ranks, fp.schema.field("rank").type)))
    return odd_counts(fp).to_pandas().rename(columns={"tensors": "value"})


def update(
    snap: Snapshot, name: str | None, ranks_text: str | None, steps_text: str | None
) -> list[go.Figure]:
    data = snap.data
    names = scalar_names(data)
    ranks = parse_ranks(ranks_text)
    if not names:
        scalar_fig = figures.empty("No scalars logged (prof.log(loss=...) records them).")
    else:
        chosen = name if name in names else names[0]
        lines, marks = scalar_lines(data, chosen, ranks, parse_steps(steps_text))
        scalar_fig = figures.lines(lines, f"{chosen} per rank", chosen, marks)
    fp = fingerprint_grid(data, ranks)
    if fp.empty:
        fp_fig = figures.empty(
            "No parameter fingerprints (profile(fingerprint_every=N) records them)."
        )
    else:
        fp_fig = heatmaps.odd_grid(
            grid(fp, max_steps=200), "Parameter fingerprints: tensors differing from the majority"
        )
    return [scalar_fig, fp_fig]


def layout(snap: Snapshot, q: dict[str, str]) -> html.Div:
    names = scalar_names(snap.data)
    pick = dcc.Dropdown(
        id="divergence-scalar",
        options=names,
        value=names[0] if names else None,
        clearable=False,
        style={"width": "220px"},
    )
    return html.Div(
        [
            window_controls("divergence", q.get("ranks", ""), q.get("steps", ""), pick),
            note(
                "✕ marks NaN or Inf values. Replicas that agree have identical fingerprints; "
                "a red cell is a rank that drifted."
            ),
            graph("divergence-scalars"),
            graph("divergence-fingerprints"),
        ]
    )


def register(app: Dash, snapshot: Any) -> None:
    @app.callback(
        Output("divergence-scalars", "figure"),
        Output("divergence-fingerprints", "figure"),
        Input("app-version", "data"),
        Input("divergence-scalar", "value"),
        Input("divergence-ranks", "value"),
        Input("divergence-steps", "value"),
    )
    def _refresh(
        _v: int | None, name: str | None, ranks: str | None, steps: str | None
    ) -> list[go.Figure]:
        return update(snapshot(), name, ranks, steps)
