"""Time charts: the timeline's rank lanes and the pipeline's stage x time schedule."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from dashboard.figures import COLORS, styled


def gantt(bars: pd.DataFrame, links: pd.DataFrame, rank_rows: list[int]) -> go.Figure:
    """Per-rank lanes of phases, regions and collectives; one collective joined across ranks."""
    fig = go.Figure()
    for name, rows in bars.groupby("name", sort=False):
        fig.add_bar(
            base=rows["start_ms"],
            x=rows["end_ms"] - rows["start_ms"],
            y=rows["y"],
            orientation="h",
            width=rows["width"],
            name=str(name),
            marker_color=COLORS.get(str(rows["color"].iloc[0]), COLORS["region"]),
            customdata=rows["hover"],
            hovertemplate="%{customdata}<extra></extra>",
        )
    if not links.empty:
        xs, ys = _joined(links)
        fig.add_scatter(
            x=xs,
            y=ys,
            mode="lines",
            line={"color": "#333", "width": 1},
            name="same collective",
            hoverinfo="skip",
        )
        last = links[links["is_last"]]
        fig.add_scatter(
            x=last["t_ms"],
            y=last["y"],
            mode="markers",
            name="last to arrive",
            marker={"symbol": "diamond", "color": "#D62728", "size": 9},
            customdata=last["hover"],
            hovertemplate="%{customdata}<extra></extra>",
        )
    return _lanes(fig, rank_rows, 140, 70, "ms from the window's start")


def _joined(links: pd.DataFrame) -> tuple[list[float | None], list[float | None]]:
    """Polyline points of each collective across its ranks, separated by gaps."""
    xs: list[float | None] = []
    ys: list[float | None] = []
    for _, rows in links.sort_values("y").groupby("key", sort=False):
        xs += [*rows["t_ms"].tolist(), None]
        ys += [*rows["y"].tolist(), None]
    return xs, ys


def pipeline_chart(actions: pd.DataFrame, idle: pd.DataFrame, stages: list[int]) -> go.Figure:
    """Stage x time: each microbatch's forward and backward, idle time shaded."""
    fig = go.Figure()
    if not idle.empty:
        fig.add_bar(
            base=idle["start_ms"],
            x=idle["end_ms"] - idle["start_ms"],
            y=idle["y"],
            orientation="h",
            width=0.8,
            name="idle (bubble)",
            marker={"color": COLORS["idle"], "pattern": {"shape": "/"}},
            hovertemplate="idle %{x:.1f} ms<extra></extra>",
        )
    for name, rows in actions.groupby("name", sort=False):
        fig.add_bar(
            base=rows["start_ms"],
            x=rows["end_ms"] - rows["start_ms"],
            y=rows["y"],
            orientation="h",
            width=0.6,
            name=str(name),
            marker_color=COLORS.get(str(name), COLORS["region"]),
            text=rows["microbatch"].astype(str),
            textposition="inside",
            insidetextanchor="middle",
            customdata=rows["hover"],
            hovertemplate="%{customdata}<extra></extra>",
        )
    return _lanes(fig, stages, 160, 60, "ms from the step's start")


def _lanes(fig: go.Figure, ranks: list[int], base_px: int, lane_px: int, x_title: str) -> go.Figure:
    """One horizontal lane per rank, top to bottom, bars overlaid; at least 300 px high."""
    fig.update_yaxes(
        tickvals=list(range(len(ranks))),
        ticktext=[f"rank {r}" for r in ranks],
        autorange="reversed",
    )
    return styled(
        fig,
        "",
        height=max(base_px + lane_px * len(ranks), 300),
        barmode="overlay",
        xaxis_title=x_title,
    )
