"""Pipeline: stage x time of one step's microbatch actions, idle time shaded, against theory."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from dash import Dash, Input, Output, dcc, html

from dashboard import figures, timecharts
from dashboard.components import graph, note, text_input
from dashboard.rundata import RunData
from dashboard.shape import rank_bars
from dashboard.source import Snapshot
from dtprof.analysis.columns import rows, values, warmup_steps
from dtprof.analysis.pipeline import idle_gaps, idle_share_by_rank, schedule_bubble
from dtprof.trace.meta import Pipeline

PATH = "/pipeline"
TITLE = "Pipeline"


def schedule_info(data: RunData) -> Pipeline | None:
    return next((m.pipeline for m in data.run.meta.values() if m.pipeline), None)


def step_chart(data: RunData, step: int) -> tuple[pd.DataFrame, pd.DataFrame, list[int]]:
    """The actions and idle gaps of one step, ms from its start, y = the rank's row."""
    actions, all_steps = data.frame("actions"), data.steps
    acts = actions[actions["step"] == step]
    steps = all_steps[all_steps["step"] == step]
    ranks = sorted(int(r) for r in acts["rank"].unique())
    row = {r: i for i, r in enumerate(ranks)}
    t0 = float(steps["start_ns"].min()) if not steps.empty else float(acts["start_ns"].min())
    run_steps = data.run.steps
    idle = idle_gaps(
        rows(data.run.actions, values(data.run.actions, "step") == step),
        rows(run_steps, values(run_steps, "step") == step),
    ).to_pandas()
    acts = acts.assign(
        y=acts["rank"].map(row),
        start_ms=(acts["start_ns"] - t0) / 1e6,
        end_ms=(acts["end_ns"] - t0) / 1e6,
    )
    acts["hover"] = (
        "rank "
        + acts["rank"].astype(str)
        + " stage "
        + acts["stage"].astype(str)
        + " · "
        + acts["name"].astype(str)
        + " microbatch "
        + acts["microbatch"].astype(str)
        + " · "
        + (acts["end_ms"] - acts["start_ms"]).round(2).astype(str)
        + " ms"
    )
    idle = idle.assign(
        y=idle["rank"].map(row),
        start_ms=(idle["start_ns"] - t0) / 1e6,
        end_ms=(idle["end_ns"] - t0) / 1e6,
    )
    return acts, idle, ranks


def idle_share(data: RunData) -> pd.DataFrame:
    """label, idle_fraction per rank (binned) over the steps after warm-up."""
    steps, actions = data.run.steps, data.run.actions
    skip = warmup_steps(values(steps, "step"))
    ranks, share = idle_share_by_rank(
        rows(actions, values(actions, "step") >= skip), rows(steps, values(steps, "step") >= skip)
    )
    return rank_bars(pd.DataFrame({"rank": ranks, "idle_fraction": share}), ["idle_fraction"])


def update(snap: Snapshot, step_text: str | None) -> list[go.Figure]:
    data = snap.data
    info = schedule_info(data)
    if info is None or not data.run.actions.num_rows:
        msg = figures.empty(
            "No pipeline schedule in this trace (profile(pipeline=schedule) records one)."
        )
        return [msg, msg]
    steps = np.unique(values(data.run.actions, "step"))
    try:
        step = int(step_text) if step_text else int(steps[len(steps) // 2])
    except ValueError:
        step = int(steps[len(steps) // 2])
    acts, idle, ranks = step_chart(data, step)
    chart = (
        timecharts.pipeline_chart(acts, idle, ranks)
        if not acts.empty
        else figures.empty(f"No action in step {step}.")
    )
    chart.update_layout(
        title={
            "text": f"{info.schedule}: {info.stages} stages, "
            f"{info.microbatches} microbatches · step {step}"
        }
    )
    expected = schedule_bubble(
        info.schedule,
        info.stages,
        info.microbatches,
        info.virtual_stages_per_rank,
    )
    return [chart, figures.bubble_vs_theory(idle_share(data), expected)]


def layout(snap: Snapshot, q: dict[str, str]) -> html.Div:
    return html.Div(
        [
            html.Div(
                [text_input("pipeline-step", "step", q.get("step", ""), "a step, e.g. 10")],
                className="controls",
            ),
            note(
                "Bars are microbatch actions (the number is the microbatch); "
                "hatched grey is idle time inside the step."
            ),
            graph("pipeline-chart"),
            graph("pipeline-theory"),
            dcc.Markdown(
                "Theory for p stages and m microbatches: (p−1)/(m+p−1) for GPipe and 1F1B, "
                "(p−1)/(v·m+p−1) with v stages per rank.",
                className="note",
            ),
        ]
    )


def register(app: Dash, snapshot: Any) -> None:
    @app.callback(
        Output("pipeline-chart", "figure"),
        Output("pipeline-theory", "figure"),
        Input("app-version", "data"),
        Input("pipeline-step", "value"),
    )
    def _refresh(_v: int | None, step: str | None) -> list[go.Figure]:
        return update(snapshot(), step)
