"""dtprof: profiling and diagnostics for distributed PyTorch training."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["__version__", "analyze", "load_trace", "profile"]

if TYPE_CHECKING:
    from dtprof.analysis import analyze
    from dtprof.record.profiler import profile
    from dtprof.trace.reader import load_trace


def __getattr__(name: str) -> Any:
    # Recording needs torch; reading a trace must not pay for importing it.
    if name == "profile":
        from dtprof.record.profiler import profile

        return profile
    if name == "analyze":
        from dtprof.analysis import analyze

        return analyze
    if name == "load_trace":
        from dtprof.trace.reader import load_trace

        return load_trace
    raise AttributeError(f"module 'dtprof' has no attribute {name!r}")
