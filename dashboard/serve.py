"""Start the dashboard for ``dtprof dashboard`` and ``dtprof replay``: print the URL, then serve."""

from __future__ import annotations

import ipaddress
import logging
import sys

from dashboard.app import Source, create_app
from dashboard.replay import ReplaySource
from dashboard.source import LiveSource
from dtprof.errors import DtprofError
from dtprof.trace.importer import resolve


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve(trace: str, host: str, port: int, speed: float | None = None) -> int:
    """Follow (or, with ``speed``, replay) a trace and serve its dashboard until interrupted."""
    if not 0 < port < 65536:
        raise DtprofError(f"--port {port}: not a TCP port")
    if speed is not None and speed <= 0:
        raise DtprofError(f"--speed {speed:g}: must be above 0")
    trace = str(resolve(trace, progress=True))  # a profiler folder: its (cached) conversion
    source: Source = LiveSource(trace) if speed is None else ReplaySource(trace, speed=speed)
    app = create_app(trace, source=source)
    if not is_loopback(host):
        print(
            f"dtprof: warning: serving on {host}: anyone who can reach this machine on port "
            f"{port} can read this trace's dashboard (there is no authentication)",
            file=sys.stderr,
        )
    shown = f"[{host}]" if ":" in host else host
    what = "replaying" if speed is not None else "following"
    print(f"dtprof: {what} {trace} at http://{shown}:{port}/ (Ctrl-C stops)", flush=True)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request
    try:
        app.run(host=host, port=port, debug=False)
    except OSError as exc:
        raise DtprofError(f"cannot serve on {host}:{port} ({exc.strerror or exc})") from None
    return 0
