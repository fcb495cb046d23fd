"""create_app(trace_dir): the Dash app, a thin shell (header, navigation, router) over the pages.

The trace is read once, then followed: a background thread polls it and publishes snapshots;
a ``dcc.Interval`` in the page asks every ``poll_s`` seconds whether there is a new one, and
the pages redraw from it. Nothing is served but the app itself: no file of the trace directory
(or any other) is exposed, and no pickle is loaded.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

from dash import Dash, Input, Output, dcc, html, no_update
from dash.exceptions import DependencyException

from dashboard.links import query
from dashboard.pages import communication, divergence, memory, overview, pipeline, ranks, timeline
from dashboard.source import LiveSource, Snapshot

PAGES: list[ModuleType] = [overview, ranks, timeline, communication, pipeline, memory, divergence]
STYLE = Path(__file__).with_name("style.css")


class Source(Protocol):
    """What the app needs of a data source: LiveSource and ReplaySource are two."""

    mode: str

    def snapshot(self) -> Snapshot: ...

    def refresh(self) -> bool: ...

    def start(self) -> None: ...


def create_app(
    trace_dir: str | os.PathLike[str],
    *,
    source: Source | None = None,
    poll_s: float = 1.5,
    start: bool = True,
) -> Dash:
    """The dashboard of one trace directory; ``source`` replaces the live follower (replay)."""
    source = source or LiveSource(trace_dir, poll_s=poll_s)
    if start:
        source.start()
    app = Dash(
        __name__,
        title=f"dtprof · {Path(trace_dir).resolve().name}",
        assets_folder=str(Path(__file__).with_name("no-assets")),  # serve no folder of files
        serve_locally=True,
        suppress_callback_exceptions=True,  # each page's controls exist only on that page
        update_title="",  # no "Updating..." title flicker at every poll
    )
    app.index_string = app.index_string.replace(
        "{%css%}", "{%css%}<style>" + STYLE.read_text() + "</style>"
    )
    app.layout = shell(str(trace_dir), source.mode, poll_s)
    register(app, source)
    app.server.config["DTPROF_SOURCE"] = source
    # a request for a script that is not one of Dash's (an unknown package, a path that leaves
    # it) is refused by Dash with an exception: answer 404 rather than 500 and a logged traceback
    app.server.register_error_handler(DependencyException, lambda _exc: ("not found", 404))
    return app


def shell(trace: str, mode: str, poll_s: float) -> html.Div:
    return html.Div(
        [
            dcc.Location(id="app-url"),
            dcc.Interval(id="app-interval", interval=int(poll_s * 1000)),
            dcc.Store(id="app-version", data=0),
            html.Header(
                [
                    html.Span("dtprof", className="brand"),
                    html.Span(trace, className="trace"),
                    html.Span(mode, className=f"mode mode-{mode}"),
                    html.Span("", id="app-status", className="status"),
                ]
            ),
            html.Nav(id="app-nav"),
            html.Main(id="app-page"),
        ]
    )


def nav(path: str) -> list[Any]:
    return [
        dcc.Link(p.TITLE, href=p.PATH, className="active" if path == p.PATH else "") for p in PAGES
    ]


def route(snap: Snapshot, path: str | None, search: str | None) -> tuple[list[Any], Any]:
    """The navigation and the page for a location; unknown paths get the overview."""
    page = next((p for p in PAGES if (path or "/") == p.PATH), overview)
    return nav(page.PATH), page.layout(snap, query(search))


def tick(snap: Snapshot, seen: int | None) -> tuple[Any, str]:
    """The new version when the snapshot changed (else no update), and the status line."""
    return (snap.version if snap.version != seen else no_update), snap.status


def register(app: Dash, source: Source) -> None:
    @app.callback(
        Output("app-version", "data"),
        Output("app-status", "children"),
        Input("app-interval", "n_intervals"),
        Input("app-version", "data"),
    )
    def _tick(_n: int | None, seen: int | None) -> tuple[Any, str]:
        return tick(source.snapshot(), seen)

    @app.callback(
        Output("app-nav", "children"),
        Output("app-page", "children"),
        Input("app-url", "pathname"),
        Input("app-url", "search"),
    )
    def _route(path: str | None, search: str | None) -> tuple[list[Any], Any]:
        return route(source.snapshot(), path, search)

    for page in PAGES:
        page.register(app, source.snapshot)
