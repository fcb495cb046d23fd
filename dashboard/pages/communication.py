"""Communication: overlap and exposed communication per rank, arrival skew, bytes per op and
the collectives' bus bandwidth per group, op and size (dtprof.analysis.bandwidth)."""

from __future__ import annotations

from typing import Any

import pandas as pd
import plotly.graph_objects as go
from dash import Dash, Input, Output, html

from dashboard import figures, measures
from dashboard.components import graph, note, window_controls
from dashboard.links import parse_ranks, parse_steps
from dashboard.rundata import RunData
from dashboard.shape import MAX_POINTS, only_ranks, rank_bars, window
from dashboard.source import Snapshot
from dtprof.analysis.bandwidth import bandwidth_rows
from dtprof.analysis.measures import rank_overlap

PATH = "/communication"
TITLE = "Communication"


Window = tuple[int | None, int | None]


def overlap(data: RunData, ranks: list[int] | None, steps: Window = (None, None)) -> pd.DataFrame:
    """label, overlap_fraction, exposed_fraction per rank (ranks binned by the mean)."""
    per = rank_overlap(only_ranks(window(measures.rank_steps(data), steps), ranks))
    return rank_bars(per, ["overlap_fraction", "exposed_fraction"])


def skew(data: RunData, steps: Window = (None, None), max_points: int = MAX_POINTS) -> pd.DataFrame:
    """step, frac (position inside the step), skew_ms, op, hover: the largest skews kept."""
    s = window(measures.arrival_skew(data), steps).copy()
    if s.empty:
        return s.assign(frac=[], skew_ms=[], hover=[])
    s["frac"] = s.groupby("step").cumcount() / s.groupby("step")["seq"].transform("size")
    s = s.nlargest(max_points, "skew_ns") if len(s) > max_points else s
    s["skew_ms"] = s["skew_ns"] / 1e6
    s["hover"] = (
        s["op"].astype(str)
        + " #"
        + s["seq"].astype(str)
        + " (group "
        + s["group"].astype(str)
        + ") step "
        + s["step"].astype(str)
        + ": rank "
        + s["last_rank"].astype(str)
        + " last, "
        + s["skew_ms"].round(2).astype(str)
        + " ms after the first"
    )
    return s


def ops(data: RunData, steps: Window = (None, None)) -> pd.DataFrame:
    """op, calls, bytes, mib_per_step (per rank)."""
    o = window(measures.op_records(data), steps).groupby("op")[["calls", "bytes"]].sum()
    rank_steps = max(len(window(data.steps, steps)), 1)
    return o.assign(mib_per_step=o["bytes"] / rank_steps / 2**20).reset_index()


def bandwidth(data: RunData, steps: Window = (None, None)) -> pd.DataFrame:
    """The report's bandwidth rows over the steps shown, with label and hover."""
    b = pd.DataFrame(bandwidth_rows(data.run.matched, steps, data.run.collectives))
    if b.empty:  # no collective matched in the steps shown: the columns the figure reads
        return pd.DataFrame({"label": [], "busbw_gbs": [], "hover": []})
    b["label"] = b["op"] + " " + b["band"] + " (group " + b["group"] + ")"
    b["hover"] = (
        b["label"]
        + ": "
        + b["calls"].astype(str)
        + " calls, median "
        + b["time_ms"].round(3).astype(str)
        + " ms, algbw "
        + b["algbw_gbs"].round(3).astype(str)
        + " GB/s, busbw "
        + b["busbw_gbs"].round(3).astype(str)
        + " GB/s (p10 "
        + b["busbw_p10_gbs"].round(3).astype(str)
        + ")"
    )
    return b


def update(snap: Snapshot, ranks_text: str | None, steps_text: str | None) -> list[go.Figure]:
    data = snap.data
    if not data.run.collectives.num_rows:
        msg = figures.empty("No collective recorded in this window.")
        return [msg, msg, msg]
    steps = parse_steps(steps_text)
    per = overlap(data, parse_ranks(ranks_text), steps)
    s = skew(data, steps)
    o = ops(data, steps)
    bw = bandwidth(data, steps)
    unmatched = "No collective matched on every member."
    return [
        figures.overlap_bars(per) if not per.empty else figures.empty(unmatched),
        figures.arrival_skew(s) if not s.empty else figures.empty(unmatched),
        figures.op_bandwidth(o, bw),
    ]


def layout(snap: Snapshot, q: dict[str, str]) -> html.Div:
    return html.Div(
        [
            window_controls("communication", q.get("ranks", ""), q.get("steps", "")),
            note(
                "A transfer counts from the moment the last member entered: waiting for a late "
                "rank shows as arrival skew, not as exposed communication, nor in the bus "
                "bandwidth (as nccl-tests defines it: docs/report-format.md)."
            ),
            graph("communication-overlap"),
            graph("communication-skew"),
            graph("communication-ops"),
        ]
    )


def register(app: Dash, snapshot: Any) -> None:
    @app.callback(
        Output("communication-overlap", "figure"),
        Output("communication-skew", "figure"),
        Output("communication-ops", "figure"),
        Input("app-version", "data"),
        Input("communication-ranks", "value"),
        Input("communication-steps", "value"),
    )
    def _refresh(_v: int | None, ranks: str | None, steps: str | None) -> list[go.Figure]:
        return update(snapshot(), ranks, steps)
