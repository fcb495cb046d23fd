"""Small layout pieces the pages share: window controls, graphs, finding cards."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
from dash import dcc, html

from dashboard.figures import SEVERITY_COLORS
from dashboard.links import finding_href
from dtprof.analysis.report import Finding

GRAPH_CONFIG: Any = {"displaylogo": False, "responsive": True}


def graph(id_: str, figure: go.Figure | None = None) -> dcc.Graph:
    return dcc.Graph(id=id_, figure=figure or go.Figure(), config=GRAPH_CONFIG)


def text_input(id_: str, label: str, value: str, placeholder: str) -> html.Label:
    return html.Label(
        [
            html.Span(label, className="control-label"),
            dcc.Input(
                id=id_,
                value=value,
                placeholder=placeholder,
                debounce=True,
                type="text",
                style={"width": "150px"},
            ),
        ],
        className="control",
    )


def window_controls(page: str, ranks: str, steps: str, *extra: Any) -> html.Div:
    """Rank subset and step window inputs, ids ``<page>-ranks`` and ``<page>-steps``."""
    return html.Div(
        [
            text_input(f"{page}-ranks", "ranks", ranks, "all, or e.g. 0-7,12"),
            text_input(f"{page}-steps", "steps", steps, "all, or A:B (B excluded)"),
            *extra,
        ],
        className="controls",
    )


def note(text: str, id_: str | None = None) -> html.P:
    return html.P(text, id=id_ or "", className="note") if id_ else html.P(text, className="note")


def finding_card(f: Finding) -> dcc.Link:
    """One finding: severity, code, where; the whole card links to the page that shows it."""
    where = ", ".join(str(r) for r in f.ranks[:8]) + (" ..." if len(f.ranks) > 8 else "")
    steps = "" if f.first_step is None else f" · steps {f.first_step}-{f.last_step}"
    return dcc.Link(
        html.Div(
            [
                html.Span(
                    f.severity, className="badge", style={"background": SEVERITY_COLORS[f.severity]}
                ),
                html.B(f" {f.code} "),
                html.Span(f"rank {where}{steps}", className="where"),
                html.Div(f.message, className="message"),
                html.Div(f"→ {f.suggestion}", className="suggestion"),
            ],
            className=f"finding finding-{f.severity}",
        ),
        href=finding_href(f),
        className="finding-link",
    )
