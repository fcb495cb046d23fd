"""Pure figure functions: small shaped frames in, plotly figures out; nothing is computed here."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dashboard.shape import Grid

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


def _layout(fig: go.Figure, title: str, height: int = 340, **kw: object) -> go.Figure:
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
    return _layout(fig, "", height=height)


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
    return _layout(fig, "Step time", xaxis_title="step", yaxis_title="ms")


def time_split(split: pd.DataFrame) -> go.Figure:
    """Per rank (or rank bin): median compute, data and other time of a step, stacked."""
    fig = go.Figure()
    for col, name, color in (
        ("compute_ms", "compute", COLORS["forward"]),
        ("data_ms", "data", COLORS["data"]),
        ("other_ms", "communication, waiting, other", COLORS["collective"]),
    ):
        fig.add_bar(x=split["label"], y=split[col], name=name, marker_color=color)
    return _layout(
        fig,
        "Where a step goes (median per rank)",
        barmode="stack",
        xaxis={"title": "rank", "type": "category"},
        yaxis_title="ms",
    )


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
    return _layout(fig, "", height=max(260 * len(grids), 300))


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
    fig.update_yaxes(
        tickvals=list(range(len(rank_rows))),
        ticktext=[f"rank {r}" for r in rank_rows],
        autorange="reversed",
    )
    return _layout(
        fig,
        "",
        height=max(140 + 70 * len(rank_rows), 300),
        barmode="overlay",
        xaxis_title="ms from the window's start",
    )


def _joined(links: pd.DataFrame) -> tuple[list[float | None], list[float | None]]:
    """Polyline points of each collective across its ranks, separated by gaps."""
    xs: list[float | None] = []
    ys: list[float | None] = []
    for _, rows in links.sort_values("y").groupby("key", sort=False):
        xs += [*rows["t_ms"].tolist(), None]
        ys += [*rows["y"].tolist(), None]
    return xs, ys


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
    return _layout(
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
    return _layout(fig, "Arrival skew per collective", xaxis_title="step", yaxis_title="ms")


def op_bandwidth(ops: pd.DataFrame) -> go.Figure:
    """Bytes and effective bandwidth per op."""
    fig = make_subplots(
        rows=1, cols=2, subplot_titles=["MiB per rank and step", "effective GB/s (median)"]
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
        x=ops["op"],
        y=ops["gbps"],
        marker_color=COLORS["collective"],
        showlegend=False,
        customdata=ops["hover"],
        hovertemplate="%{customdata}<extra></extra>",
        row=1,
        col=2,
    )
    return _layout(fig, "")


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
    fig.update_yaxes(
        tickvals=list(range(len(stages))),
        ticktext=[f"rank {s}" for s in stages],
        autorange="reversed",
    )
    return _layout(
        fig,
        "",
        height=max(160 + 60 * len(stages), 300),
        barmode="overlay",
        xaxis_title="ms from the step's start",
    )


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
    return _layout(
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
    return _layout(fig, title, xaxis_title="step", yaxis_title=y_title)


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
    return _layout(fig, "GPU samples (NVML)", height=max(200 * len(metrics), 300))


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
    return _layout(fig, title, height=max(120 + 24 * len(labels), 260))
