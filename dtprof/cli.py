"""The dtprof command line: ``dtprof <command> ...``; main(argv) returns the exit code."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from dtprof import __version__
from dtprof.errors import DtprofError


def _cmd_info(args: argparse.Namespace) -> int:
    """Show what a trace holds: ranks, steps, rows per table, clock alignment."""
    from dtprof.trace.info import describe

    print(describe(args.trace))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dtprof", description="Profiling and diagnostics for distributed PyTorch training."
    )
    parser.add_argument("--version", action="version", version=f"dtprof {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="command", required=True)
    info = sub.add_parser("info", help=_cmd_info.__doc__, description=_cmd_info.__doc__)
    info.add_argument("trace", help="trace directory written by dtprof.profile()")
    info.set_defaults(func=_cmd_info)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except DtprofError as exc:
        print(f"dtprof: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `dtprof info trace | head`
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print("dtprof: interrupted", file=sys.stderr)
        return 130
