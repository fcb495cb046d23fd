"""The dtprof command line: ``dtprof <command> ...``; main(argv) returns the exit code."""

from __future__ import annotations

import argparse
import gc
import sys
from collections.abc import Sequence
from typing import NoReturn

from dtprof import __version__
from dtprof.commands import analyze, build_native, own_process
from dtprof.commands import diff as diff_command
from dtprof.commands import run as run_command
from dtprof.commands.own_process import (
    choose_arrow_allocator,
    keep_freed_memory,
    no_blas_threads,
    no_huge_page_requests,
    pandas_held_back,
)
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


def _positive(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"wants a whole number of at least 1, not {value!r}")
    return int(value)


def _positive_float(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = float("nan")
    if not number > 0 or number == float("inf"):
        raise argparse.ArgumentTypeError(f"wants a number above 0, not {value!r}")
    return number


def _link(value: str) -> str:
    """A link's speed in Gb/s, or a name dtprof knows (checked here, kept as given)."""
    from dtprof.analysis.bandwidth import link_peak

    try:
        link_peak(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{value!r}: {exc}") from None
    return value


def _cmd_convert(args: argparse.Namespace) -> int:
    """Convert a folder of PyTorch profiler traces (*.json[.gz]) into a dtprof trace."""
    from dtprof.trace.kineto import scan_ahead

    scan_ahead.start(args.source, even_if_cached=True)  # read while the imports run
    try:
        with pandas_held_back():
            from dtprof.trace.importer import convert

            ranks = convert(args.source, args.output, progress=True)
    finally:
        scan_ahead.stop()
    print(f"{args.output}: {ranks} rank(s) written")
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    """Export a trace (dtprof or profiler traces) as one Perfetto / chrome://tracing timeline."""
    from dtprof.trace.chrome import export_chrome

    events = export_chrome(args.trace, args.chrome)
    print(f"{args.chrome}: {events:,} events")
    return 0


def _cmd_dashboard(args: argparse.Namespace) -> int:
    """Open the web dashboard of a trace; a running job's new steps appear as they are written."""
    from dashboard.serve import serve

    return serve(args.trace, args.host, args.port)


def _cmd_replay(args: argparse.Namespace) -> int:
    """Play a finished trace in the dashboard as if live, each finding at the step it would
    first have been raised."""
    from dashboard.serve import serve

    return serve(args.trace, args.host, args.port, speed=args.speed)


def _add_server_args(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument(
        "trace", help="trace directory written by dtprof.profile(), or PyTorch profiler traces"
    )
    cmd.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    cmd.add_argument("--port", type=int, default=8050, help="port to bind (default: 8050)")


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
    an = sub.add_parser("analyze", help=analyze.run.__doc__, description=analyze.run.__doc__)
    an.add_argument("trace", help="trace directory written by dtprof.profile(), or profiler traces")
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
    an.add_argument(
        "--peak-tflops",
        type=_positive_float,
        help="the device's peak TFLOP/s that MFU is measured against (default: dtprof's table"
        " of accelerators, docs/throughput.md)",
    )
    an.add_argument(
        "--link-gbps",
        type=_link,
        metavar="GBPS",
        help="the link speed (Gb/s a direction, or a name: nvlink4, ib-ndr, eth400, ...) that"
        " collectives' bus bandwidth is compared with (docs/report-format.md)",
    )
    dask = an.add_mutually_exclusive_group()
    dask.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="read the ranks on this Dask cluster, e.g. tcp://host:8786 (trace on shared storage)",
    )
    dask.add_argument(
        "--workers", type=_positive, metavar="N", help="read the ranks on N local Dask workers"
    )
    an.set_defaults(func=analyze.run)
    df = sub.add_parser("diff", help=diff_command.run.__doc__, description=diff_command.run.__doc__)
    df.add_argument("base", help="the run before: a trace directory or profiler traces")
    df.add_argument("new", help="the run after")
    df.add_argument("--format", choices=("text", "json", "markdown"), default="text")
    df.add_argument("-o", "--output", help="write the comparison to this file")
    df.add_argument(
        "--fail-on-regression",
        type=_positive_float,
        metavar="PCT",
        help="exit 1 when the step time (or --metric) got worse by more than PCT percent and the"
        " change is called",
    )
    df.add_argument(
        "--metric",
        choices=diff_command.LABELS,
        default="step_ms",
        help="what --fail-on-regression watches (default: step_ms)",
    )
    df.set_defaults(func=diff_command.run)
    cv = sub.add_parser("convert", help=_cmd_convert.__doc__, description=_cmd_convert.__doc__)
    cv.add_argument("source", help="folder of PyTorch profiler traces, one file per rank")
    cv.add_argument("-o", "--output", required=True, help="dtprof trace directory to write")
    cv.set_defaults(func=_cmd_convert)
    ex = sub.add_parser("export", help=_cmd_export.__doc__, description=_cmd_export.__doc__)
    ex.add_argument("trace", help="dtprof trace directory or folder of profiler traces")
    ex.add_argument("--chrome", required=True, help="output file: out.json or out.json.gz")
    ex.set_defaults(func=_cmd_export)
    db = sub.add_parser(
        "dashboard", help=_cmd_dashboard.__doc__, description=_cmd_dashboard.__doc__
    )
    _add_server_args(db)
    db.set_defaults(func=_cmd_dashboard)
    bn = sub.add_parser(
        "build-native", help=build_native.run.__doc__, description=build_native.run.__doc__
    )
    bn.add_argument("--verbose", action="store_true", help="show the compiler's output")
    bn.set_defaults(func=build_native.run)
    rn = sub.add_parser(
        "run",
        help=run_command.run.__doc__,
        description=run_command.run.__doc__,
        usage="dtprof run [options] -- COMMAND ...",
    )
    run_command.add_arguments(rn)
    rn.set_defaults(func=run_command.run, starts_a_job=True)
    rp = sub.add_parser("replay", help=_cmd_replay.__doc__, description=_cmd_replay.__doc__)
    _add_server_args(rp)
    rp.add_argument("--speed", type=float, default=1.0, help="times real time (default: 1)")
    rp.set_defaults(func=_cmd_replay)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return _dispatch(build_parser().parse_args(argv))


def run() -> NoReturn:
    """The ``dtprof`` command: main() in a process that is the command's own. What it leaves is
    frozen before the interpreter ends, so that the interpreter's last garbage collections pass
    over none of it (the hundreds of thousands of objects numpy and pyarrow make): a tenth of a
    cold ``analyze`` of profiler traces (docs/kineto.md)."""
    own_process.OWN = True
    code = main()
    gc.freeze()
    raise SystemExit(code)


def _dispatch(args: argparse.Namespace) -> int:
    try:
        if not getattr(args, "starts_a_job", False):  # the job's environment stays its own
            choose_arrow_allocator(getattr(args, "trace", None) or getattr(args, "source", None))
            no_blas_threads()
            no_huge_page_requests()
            keep_freed_memory()
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
