"""Timeline: per-rank lanes of phases, regions and collectives for a window of steps.

Each collective is joined across the ranks shown, and the last of all ranks to arrive stands out.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from dash import Dash, Input, Output, html

from dashboard import figures, measures, timecharts
from dashboard.components import graph, note, window_controls
from dashboard.links import format_ranks, format_steps, parse_ranks, parse_steps
from dashboard.rundata import RunData
from dashboard.shape import only_ranks, window
from dashboard.source import Snapshot

PATH = "/timeline"
TITLE = "Timeline"
DEFAULT_RANKS = 8
DEFAULT_STEPS = 3
MAX_BARS = 20_000


def default_window(data: RunData) -> tuple[list[int], tuple[int, int]]:
    last = max(data.last_step, 0)
    return data.ranks[:DEFAULT_RANKS], (max(last + 1 - DEFAULT_STEPS, 0), last + 1)


def bars(
    data: RunData, ranks: list[int], steps: tuple[int | None, int | None]
) -> tuple[pd.DataFrame, pd.DataFrame, float]:
    """Bars (y, name, color, start_ms, end_ms, width, hover) and collective links (key, y,
    t_ms, is_last, hover), times in ms from the window's first step start; and that start."""
    row = {r: i for i, r in enumerate(ranks)}
    spans = data.rows.spans(ranks, steps)
    coll_all = _plain(data.window_frame("collectives", steps))
    coll = only_ranks(coll_all, ranks)
    in_steps = only_ranks(window(data.steps, steps), ranks)
    t0 = float(in_steps["start_ns"].min()) if not in_steps.empty else float(spans["start_ns"].min())
    lanes = spans.assign(
        y=spans["rank"].map(row)
        - 0.12
        + spans["kind"].eq("region") * (spans["depth"].fillna(0).astype(float) * 0.1 - 0.12),
        color=np.where(spans["kind"].eq("region"), "region", spans["name"]),
        width=np.where(spans["kind"].eq("region"), 0.12, 0.34),
        name=np.where(
            spans["kind"].eq("region"), "region " + spans["name"].astype(str), spans["name"]
        ),
    )
    p2p = coll["peer"].notna()
    colls = coll.assign(
        y=coll["rank"].map(row) + 0.25,
        color=np.where(p2p, "p2p", "collective"),
        width=0.16,
        name=np.where(p2p, "p2p", "collective"),
        kind="collective",
    )
    frame = pd.concat([lanes, colls], ignore_index=True)
    frame["start_ms"] = (frame["start_ns"] - t0) / 1e6
    frame["end_ms"] = (frame["end_ns"] - t0) / 1e6
    label = frame["op"].fillna(frame["name"]) if "op" in frame else frame["name"]
    frame["hover"] = (
        "rank "
        + frame["rank"].astype(str)
        + " · "
        + label.astype(str)
        + " · step "
        + frame["step"].astype(str)
        + " · "
        + (frame["end_ms"] - frame["start_ms"]).round(2).astype(str)
        + " ms"
    )
    cols = ["y", "name", "color", "start_ms", "end_ms", "width", "hover"]
    links = _links(window(measures.arrival_skew(data), steps), coll, row, t0)
    return frame[cols].head(MAX_BARS), links, t0


def _plain(df: pd.DataFrame) -> pd.DataFrame:
    """Categorical columns (the analysis' collectives) as plain strings, to mix with others."""
    cats = df.select_dtypes("category").columns
    return df.astype(dict.fromkeys(cats, object)) if len(cats) else df


def _links(
    arrivals: pd.DataFrame, coll: pd.DataFrame, row: dict[int, int], t0: float
) -> pd.DataFrame:
    """Entry points of each complete group collective on the shown ranks, the last to arrive
    of all ranks marked (arrivals: measures.arrival_skew)."""
    groupwise = coll[coll["peer"].isna()][["rank", "group", "seq", "op", "start_ns"]]
    g = groupwise.merge(arrivals[["group", "seq", "skew_ns", "last_rank"]], on=["group", "seq"])
    if g.empty:
        return pd.DataFrame(columns=["key", "y", "t_ms", "is_last", "hover"])
    return pd.DataFrame(
        {
            "key": g["group"].astype(str) + ":" + g["seq"].astype(str),
            "y": g["rank"].map(row) + 0.25,
            "t_ms": (g["start_ns"] - t0) / 1e6,
            "is_last": (g["rank"] == g["last_rank"]).to_numpy(),
            "hover": "rank "
            + g["rank"].astype(str)
            + " entered "
            + g["op"].astype(str)
            + " #"
            + g["seq"].astype(str)
            + " last; the others waited up to "
            + (g["skew_ns"] / 1e6).round(2).astype(str)
            + " ms",
        }
    )


def update(snap: Snapshot, ranks_text: str | None, steps_text: str | None) -> go.Figure:
    data = snap.data
    if data.steps.empty:
        return figures.empty("No completed step yet.")
    ranks_default, steps_default = default_window(data)
    ranks = [r for r in (parse_ranks(ranks_text) or ranks_default) if r in set(data.ranks)]
    steps = parse_steps(steps_text) if steps_text else steps_default
    frame, links, _t0 = bars(data, ranks, steps)
    if frame.empty:
        return figures.empty("Nothing recorded in this window.")
    return timecharts.gantt(frame, links, ranks)


def layout(snap: Snapshot, q: dict[str, str]) -> html.Div:
    ranks, (first, last) = default_window(snap.data)
    return html.Div(
        [
            window_controls(
                "timeline",
                q.get("ranks") or format_ranks(ranks),
                q.get("steps") or format_steps(first, last),
            ),
            note(
                "Lines join one collective across ranks; ◆ marks the rank that entered it last, "
                "the one the others waited for."
            ),
            graph("timeline-gantt"),
        ]
    )


def register(app: Dash, snapshot: Any) -> None:
    @app.callback(
        Output("timeline-gantt", "figure"),
        Input("app-version", "data"),
        Input("timeline-ranks", "value"),
        Input("timeline-steps", "value"),
    )
    def _refresh(_v: int | None, ranks: str | None, steps: str | None) -> go.Figure:
        return update(snapshot(), ranks, steps)
