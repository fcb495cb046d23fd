"""Memory & GPU: memory per rank over steps, and NVML samples when the trace has them."""

from __future__ import annotations

from typing import Any

import pandas as pd
import plotly.graph_objects as go
from dash import Dash, Input, Output, dcc, html

from dashboard import figures
from dashboard.components import graph, note, window_controls
from dashboard.growing_rank import NVML_PREFIX
from dashboard.links import parse_ranks, parse_steps
from dashboard.rundata import RunData
from dashboard.shape import band, only_ranks
from dashboard.source import Snapshot
from dtprof.analysis.columns import distinct

PATH = "/memory"
TITLE = "Memory & GPU"


def memory_metrics(data: RunData) -> list[str]:
    return sorted(distinct(data.run.memory, "metric"))


def memory_lines(
    data: RunData, metric: str, ranks: list[int] | None, steps: tuple[int | None, int | None]
) -> pd.DataFrame:
    rows = only_ranks(data.window_frame("memory", steps, equal=("metric", metric)), ranks)
    return band(rows.assign(value=rows["value"] / 2**30))


def nvml_lines(data: RunData, ranks: list[int] | None) -> pd.DataFrame:
    """metric, label, t_s, value: NVML samples per rank, or banded over many ranks (per second)."""
    s = data.samples
    s = only_ranks(s[s["metric"].astype(str).str.startswith(NVML_PREFIX)], ranks)
    if s.empty:
        return pd.DataFrame(columns=["metric", "label", "t_s", "value"])
    t0 = s["ts_ns"].min()
    parts = []
    for metric, rows in s.groupby("metric"):
        sec = ((rows["ts_ns"] - t0) // 10**9).astype("int64")
        lines = band(rows.assign(step=sec)[["rank", "step", "value"]])
        parts.append(lines.rename(columns={"step": "t_s"}).assign(metric=metric))
    return pd.concat(parts, ignore_index=True)


def update(
    snap: Snapshot, metric: str | None, ranks_text: str | None, steps_text: str | None
) -> list[go.Figure]:
    data = snap.data
    metrics = memory_metrics(data)
    ranks = parse_ranks(ranks_text)
    if not metrics:
        mem_fig = figures.empty("No memory readings in this trace.")
    else:
        chosen = metric if metric in metrics else metrics[0]
        lines = memory_lines(data, chosen, ranks, parse_steps(steps_text))
        mem_fig = (
            figures.lines(lines, f"{chosen} per rank", "GiB")
            if not lines.empty
            else figures.empty("No readings in this window.")
        )
    nvml = nvml_lines(data, ranks)
    if nvml.empty:
        gpu_fig = figures.empty(
            "No NVML samples: recorded on CPU, or NVML was not available (meta.json nvml)."
        )
    else:
        gpu_fig = figures.metric_panels(nvml)
    return [mem_fig, gpu_fig]


def layout(snap: Snapshot, q: dict[str, str]) -> html.Div:
    metrics = memory_metrics(snap.data)
    pick = dcc.Dropdown(
        id="memory-metric",
        options=metrics,
        value=metrics[0] if metrics else None,
        clearable=False,
        style={"width": "260px"},
    )
    return html.Div(
        [
            window_controls("memory", q.get("ranks", ""), q.get("steps", ""), pick),
            note(
                "Above 8 ranks: the min, median and max over ranks, "
                "and the ranks furthest from the median."
            ),
            graph("memory-lines"),
            graph("memory-gpu"),
        ]
    )


def register(app: Dash, snapshot: Any) -> None:
    @app.callback(
        Output("memory-lines", "figure"),
        Output("memory-gpu", "figure"),
        Input("app-version", "data"),
        Input("memory-metric", "value"),
        Input("memory-ranks", "value"),
        Input("memory-steps", "value"),
    )
    def _refresh(
        _v: int | None, metric: str | None, ranks: str | None, steps: str | None
    ) -> list[go.Figure]:
        return update(snapshot(), metric, ranks, steps)
