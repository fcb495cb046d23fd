"""Grid figures: rank x step heatmaps and the fingerprint grid, from binned Grids."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dashboard.figures import styled
from dashboard.shape import Grid


def heatmaps(grids: list[tuple[str, Grid]], marks: dict[int, str]) -> go.Figure:
    """Rank x step heatmaps stacked, one per metric; marked ranks get a red triangle per row."""
    fig = make_subplots(
        rows=len(grids),
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.06,
        subplot_titles=[title for title, _ in grids],
    )
    for i, (title, g) in enumerate(grids, 1):
        if g.z.size == 0:
            continue
        labels = [
            f"{a}" if a == b else f"{a}-{b}" for a, b in zip(g.rank_lo, g.rank_hi, strict=True)
        ]
        fig.add_heatmap(
            z=g.z,
            x=g.step_lo,
            y=labels,
            colorscale="Viridis",
            showscale=False,
            hovertemplate=f"{title}<br>ranks %{{y}}<br>step %{{x}}<br>%{{z:.1f}} ms<extra></extra>",
            row=i,
            col=1,
        )
        rows = [
            j
            for j, (a, b) in enumerate(zip(g.rank_lo, g.rank_hi, strict=True))
            if any(a <= r <= b for r in marks)
        ]
        if rows:
            fig.add_scatter(
                x=[g.step_lo[0]] * len(rows),
                y=[labels[j] for j in rows],
                mode="markers",
                marker={"symbol": "triangle-right", "color": "#D62728", "size": 12},
                text=[
                    ", ".join(marks[r] for r in marks if g.rank_lo[j] <= r <= g.rank_hi[j])
                    for j in rows
                ],
                hovertemplate="%{text}<extra></extra>",
                showlegend=False,
                row=i,
                col=1,
            )
        fig.update_yaxes(type="category", title_text="rank", row=i, col=1)
    fig.update_xaxes(title_text="step", row=len(grids), col=1)
    return styled(fig, "", height=max(260 * len(grids), 300))


def odd_grid(g: Grid, title: str) -> go.Figure:
    """Fingerprint mismatches: per rank and fingerprinted step, tensors that differ."""
    labels = [f"{a}" if a == b else f"{a}-{b}" for a, b in zip(g.rank_lo, g.rank_hi, strict=True)]
    fig = go.Figure(
        go.Heatmap(
            z=g.z,
            x=[str(s) for s in g.step_lo],
            y=labels,
            colorscale=[[0, "#EEF3F8"], [1, "#D62728"]],
            zmin=0,
            zmax=max(float(np.nanmax(g.z)) if g.z.size else 1.0, 1.0),
            xgap=1,
            ygap=1,
            hovertemplate="rank %{y}<br>step %{x}<br>%{z} tensor(s) differ<extra></extra>",
        )
    )
    fig.update_xaxes(type="category", title_text="fingerprinted step")
    fig.update_yaxes(type="category", title_text="rank")
    return styled(fig, title, height=max(120 + 24 * len(labels), 260))
