"""Pure figure functions: small shaped frames in, plotly figures out; nothing is computed here.

Charts over steps and ranks live here; grids (heatmaps) in dashboard.heatmaps, time charts
(the timeline, the pipeline schedule) in dashboard.timecharts, with this module's colors.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

COLORS = {
    "forward": "#4C78A8",
    "backward": "#F58518",
    "backward_input": "#F58518",
    "backward_weight": "#FFBF79",
    "optimizer": "#54A24B",
    "data": "#B279A2",
    "region": "#72B7B2",
    "collective": "#E45756",
    "p2p": "#9D755D",
    "idle": "rgba(160,160,160,0.35)",
}
SEVERITY_COLORS = {"error": "#D62728", "warning": "#FF7F0E", "info": "#1F77B4"}


def styled(fig: go.Figure, title: str, height: int = 340, **kw: object) -> go.Figure:
    fig.update_layout(
        title={"text": title, "x": 0.01, "font": {"size": 15}},
        template="plotly_white",
        height=height,
        margin={"l": 60, "r": 20, "t": 45, "b": 40},
        legend={"orientation": "h", "y": -0.18},
        **kw,
    )
    return fig


def empty(message: str, height: int = 240) -> go.Figure:
    """A blank figure that says why there is nothing to draw."""
    fig = go.Figure()
    fig.add_annotation(text=message, showarrow=False, font={"size": 14, "color": "#666"})
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return styled(fig, "", height=height)


def step_time_band(band: pd.DataFrame) -> go.Figure:
    """Step time over steps: the min-max range across ranks, and the median."""
    fig = go.Figure()
    x = band["step"]
    fig.add_scatter(x=x, y=band["min_ms"], mode="lines", line={"width": 0}, showlegend=False)
    fig.add_scatter(
        x=x,
        y=band["max_ms"],
        mode="lines",
        line={"width": 0},
        fill="tonexty",
        fillcolor="rgba(76,120,168,0.25)",
        name="min-max over ranks",
    )
    fig.add_scatter(
        x=x,
        y=band["median_ms"],
        mode="lines",
        name="median rank",
        line={"color": COLORS["forward"]},
    )
    return styled(fig, "Step time", xaxis_title="step", yaxis_title="ms")


def time_split(split: pd.DataFrame) -> go.Figure:
    """Per rank (or rank bin): median compute, data and other time of a step, stacked."""
    fig = go.Figure()
    for col, name, color in (
        ("compute_ms", "compute", COLORS["forward"]),
        ("data_ms", "data", COLORS["data"]),
        ("other_ms", "communication, waiting, other", COLORS["collective"]),
    ):
        fig.add_bar(x=split["label"], y=split[col], name=name, marker_color=color)
    return styled(
        fig,
        "Where a step goes (median per rank)",
        barmode="stack",
        xaxis={"title": "rank", "type": "category"},
        yaxis_title="ms",
    )


def overlap_bars(per_rank: pd.DataFrame) -> go.Figure:
    """Per rank: share of communication overlapped by compute, and exposed share of the step."""
    fig = go.Figure()
    fig.add_bar(
        x=per_rank["label"],
        y=per_rank["overlap_fraction"],
        name="overlapped / communication",
        marker_color=COLORS["optimizer"],
    )
    fig.add_bar(
        x=per_rank["label"],
        y=per_rank["exposed_fraction"],
        name="exposed / step",
        marker_color=COLORS["collective"],
    )
    return styled(
        fig,
        "Overlap and exposed communication",
        barmode="group",
        xaxis={"title": "rank", "type": "category"},
        yaxis={"tickformat": ".0%", "range": [0, 1]},
    )


def arrival_skew(skew: pd.DataFrame) -> go.Figure:
    """Arrival skew (last entry minus first) of each matched collective, by op."""
    fig = go.Figure()
    for op, rows in skew.groupby("op"):
        fig.add_scatter(
            x=rows["step"] + rows["frac"],
            y=rows["skew_ms"],
            mode="markers",
            name=str(op),
            customdata=rows["hover"],
            hovertemplate="%{customdata}<extra></extra>",
        )
    return styled(fig, "Arrival skew per collective", xaxis_title="step", yaxis_title="ms")


def op_bandwidth(ops: pd.DataFrame, bandwidth: pd.DataFrame) -> go.Figure:
    """Bytes per op, and the bus bandwidth per group, op and message size."""
    fig = make_subplots(
        rows=1,
        cols=2,
        subplot_titles=["MiB per rank and step", "bus bandwidth GB/s (median), per group and size"],
    )
    fig.add_bar(
        x=ops["op"],
        y=ops["mib_per_step"],
        marker_color=COLORS["forward"],
        showlegend=False,
        row=1,
        col=1,
    )
    fig.add_bar(
        x=bandwidth["label"],
        y=bandwidth["busbw_gbs"],
        marker_color=COLORS["collective"],
        showlegend=False,
        customdata=bandwidth["hover"],
        hovertemplate="%{customdata}<extra></extra>",
        row=1,
        col=2,
    )
    return styled(fig, "")


def bubble_vs_theory(per_rank: pd.DataFrame, theory: float | None) -> go.Figure:
    """Measured idle share per rank against the schedule's theoretical bubble."""
    fig = go.Figure()
    fig.add_bar(
        x=per_rank["label"],
        y=per_rank["idle_fraction"],
        name="measured idle",
        marker_color=COLORS["idle"].replace("0.35", "0.9"),
    )
    if theory is not None:
        fig.add_hline(
            y=theory,
            line={"color": "#D62728", "dash": "dash"},
            annotation_text=f"theory {theory:.0%}",
        )
    return styled(
        fig,
        "Idle share of the step, measured against theory",
        xaxis={"title": "rank", "type": "category"},
        yaxis={"tickformat": ".0%"},
    )


def lines(
    series: pd.DataFrame, title: str, y_title: str, markers: pd.DataFrame | None = None
) -> go.Figure:
    """One line per label over steps; optional red x markers (e.g. non-finite values)."""
    fig = go.Figure()
    for label, rows in series.groupby("label", sort=False):
        band = str(label).startswith(("min ", "max "))
        fig.add_scatter(
            x=rows["step"],
            y=rows["value"],
            mode="lines",
            name=str(label),
            line={"width": 1 if band else 1.6, "dash": "dot" if band else "solid"},
        )
    if markers is not None and not markers.empty:
        fig.add_scatter(
            x=markers["step"],
            y=markers["y"],
            mode="markers",
            name="non-finite",
            marker={"symbol": "x", "color": "#D62728", "size": 11},
            customdata=markers["hover"],
            hovertemplate="%{customdata}<extra></extra>",
        )
    return styled(fig, title, xaxis_title="step", yaxis_title=y_title)


def metric_panels(series: pd.DataFrame) -> go.Figure:
    """NVML samples: one panel per metric, one line per label over seconds."""
    metrics = list(dict.fromkeys(series["metric"]))
    fig = make_subplots(rows=len(metrics), cols=1, shared_xaxes=True, subplot_titles=metrics)
    for i, metric in enumerate(metrics, 1):
        rows = series[series["metric"] == metric]
        for label, part in rows.groupby("label", sort=False):
            fig.add_scatter(
                x=part["t_s"],
                y=part["value"],
                mode="lines",
                name=str(label),
                showlegend=i == 1,
                row=i,
                col=1,
            )
    return styled(fig, "GPU samples (NVML)", height=max(200 * len(metrics), 300))
