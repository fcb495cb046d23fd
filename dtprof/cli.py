"""The dtprof command line: ``dtprof <command> ...``; main(argv) returns the exit code."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn

from dtprof import __version__
from dtprof.errors import DtprofError


def _cmd_info(args: argparse.Namespace) -> int:
    """Show what a trace holds: ranks, steps, rows per table, clock alignment."""
    from dtprof.trace.info import describe

    print(describe(args.trace))
    return 0


def _steps(value: str) -> tuple[int | None, int | None]:
    first, sep, last = value.partition(":")
    try:
        if not sep:
            raise ValueError
        return (int(first) if first else None, int(last) if last else None)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--steps wants A:B (either may be empty), not {value!r}"
        ) from None


def _ranks(value: str) -> list[int]:
    ranks: list[int] = []
    try:
        for part in value.split(","):
            lo, sep, hi = part.partition("-")
            ranks += list(range(int(lo), int(hi) + 1)) if sep else [int(lo)]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--ranks wants a list like 0,3,8-15, not {value!r}"
        ) from None
    return ranks


def _cmd_analyze(args: argparse.Namespace) -> int:
    """Find stragglers and other problems in a trace; exit 1 if any is at --fail-on or above."""
    import json

    from dtprof.analysis import analyze
    from dtprof.analysis.render import markdown, text
    from dtprof.analysis.report import severity_rank

    report = analyze(args.trace, steps=args.steps, ranks=args.ranks, progress=True)
    if args.format == "json":
        out = json.dumps(report.to_json(), indent=1)
    else:
        out = markdown(report) if args.format == "markdown" else text(report)
    if args.output:
        try:
            with open(args.output, "w") as f:
                f.write(out + "\n")
        except OSError as exc:
            raise DtprofError(f"{args.output}: cannot write the report ({exc.strerror})") from None
    else:
        print(out)
    worst = report.worst()
    return 1 if worst and severity_rank(worst) >= severity_rank(args.fail_on) else 0


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line on stderr and exit code 2, like every other user error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"dtprof: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="dtprof", description="Profiling and diagnostics for distributed PyTorch training."
    )
    parser.add_argument("--version", action="version", version=f"dtprof {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="command", required=True)
    info = sub.add_parser("info", help=_cmd_info.__doc__, description=_cmd_info.__doc__)
    info.add_argument("trace", help="trace directory written by dtprof.profile()")
    info.set_defaults(func=_cmd_info)
    an = sub.add_parser("analyze", help=_cmd_analyze.__doc__, description=_cmd_analyze.__doc__)
    an.add_argument("trace", help="trace directory written by dtprof.profile()")
    an.add_argument("--format", choices=("text", "json", "markdown"), default="text")
    an.add_argument("-o", "--output", help="write the report to this file")
    an.add_argument(
        "--fail-on",
        choices=("info", "warning", "error"),
        default="error",
        help="exit 1 when a finding is at least this severe (default: error)",
    )
    an.add_argument("--steps", type=_steps, help="analyse steps A (included) to B (excluded)")
    an.add_argument("--ranks", type=_ranks, help="analyse these ranks only, e.g. 0,3,8-15")
    an.set_defaults(func=_cmd_analyze)
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
