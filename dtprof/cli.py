"""The dtprof command line: ``dtprof <command> ...``; main(argv) returns the exit code."""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import platform
import sys
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn

from dtprof import __version__
from dtprof.beside import command_owns_process, wait_for_workers
from dtprof.errors import DtprofError

_OWN_PROCESS = False  # set by run(): the command has this process to itself


@contextlib.contextmanager
def _importing() -> Iterator[None]:
    """The heavy imports of a command (numpy, pyarrow, pandas, Dash) without the cyclic garbage
    collector: they make about half a million objects and no garbage, and the collector went
    over them about 160 times (some 50 ms of a cold ``analyze``). In the ``dtprof`` command's
    own process, what they made is then frozen (``gc.freeze``): never scanned again, and left
    untouched in forked workers. (main() called in a longer-lived process freezes nothing.)"""
    if not _OWN_PROCESS:
        yield
        return
    enabled = gc.isenabled()
    gc.disable()
    try:
        with _one_blas_thread():
            yield
    finally:
        gc.freeze()
        command_owns_process()
        if enabled:
            gc.enable()


@contextlib.contextmanager
def _pandas_held_back() -> Iterator[None]:
    """A command that makes no DataFrame, run with pandas held back from import. pyarrow
    imports pandas, where it is installed, on its first conversion of a Python value (to tell
    pandas objects apart): about 0.13 s of a CPU, a fifth of a cold ``analyze``, for commands
    that hand it none. Held back, pyarrow carries on without it. Only in the command's own
    process (and the workers it forks); afterwards pandas imports as usual, and pyarrow's
    ``to_pandas`` finds it."""
    if not _OWN_PROCESS or "pandas" in sys.modules:
        yield
        return
    held_back = _HoldBack("pandas")
    sys.meta_path.insert(0, held_back)
    try:
        yield
    finally:
        sys.meta_path.remove(held_back)


class _HoldBack:
    """An import finder before all others that fails the import of one package."""

    def __init__(self, name: str) -> None:
        self.name = name

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> None:
        if fullname == self.name or fullname.startswith(self.name + "."):
            raise ModuleNotFoundError(f"{fullname} held back", name=fullname)


BLAS_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")


@contextlib.contextmanager
def _one_blas_thread() -> Iterator[None]:
    """numpy's first import with OpenBLAS told to start no threads of its own. Left to itself it
    starts one per further CPU, and each spins for a while waiting for work that dtprof never
    gives it (it multiplies no matrices): about 0.12 s of a CPU after a bare ``import numpy``,
    taken from the command's own work. The setting is read when the library loads, so it is
    removed again at once: processes the command starts (a training job) do not inherit it.
    A thread count the user set is kept."""
    if "numpy" in sys.modules or any(os.environ.get(v) for v in BLAS_THREAD_VARIABLES):
        yield
        return
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    try:
        yield
    finally:
        os.environ.pop("OPENBLAS_NUM_THREADS", None)


def _cmd_info(args: argparse.Namespace) -> int:
    """Show what a trace holds: ranks, steps, rows per table, clock alignment."""
    with _importing():
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


def _cmd_analyze(args: argparse.Namespace) -> int:
    """Find stragglers and other problems in a trace; exit 1 if any is at --fail-on or above."""
    import json

    from dtprof.trace import kineto_ahead

    on_dask = bool(args.scheduler or args.workers)
    if not on_dask:  # profiler traces: read while the imports run
        kineto_ahead.start(args.trace)
    try:
        # Dask's own modules may want pandas
        with contextlib.nullcontext() if on_dask else _pandas_held_back():
            with _importing():
                from dtprof.analysis import analyze
                from dtprof.analysis.render import markdown, text
                from dtprof.analysis.report import severity_rank

            report = analyze(
                args.trace,
                steps=args.steps,
                ranks=args.ranks,
                progress=True,
                scheduler=args.scheduler,
                workers=args.workers,
            )
    finally:
        kineto_ahead.stop()
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


def _cmd_convert(args: argparse.Namespace) -> int:
    """Convert a folder of PyTorch profiler traces (*.json[.gz]) into a dtprof trace."""
    from dtprof.trace import kineto_ahead

    kineto_ahead.start(args.source, even_if_cached=True)  # read while the imports run
    try:
        with _pandas_held_back():
            with _importing():
                from dtprof.trace.importer import convert

            ranks = convert(args.source, args.output, progress=True)
    finally:
        kineto_ahead.stop()
    print(f"{args.output}: {ranks} rank(s) written")
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    """Export a trace (dtprof or profiler traces) as one Perfetto / chrome://tracing timeline."""
    with _importing():
        from dtprof.trace.chrome import export_chrome

    events = export_chrome(args.trace, args.chrome)
    print(f"{args.chrome}: {events:,} events")
    return 0


def _cmd_dashboard(args: argparse.Namespace) -> int:
    """Open the web dashboard of a trace; a running job's new steps appear as they are written."""
    with _importing():
        from dashboard.serve import serve

    return serve(args.trace, args.host, args.port)


def _cmd_replay(args: argparse.Namespace) -> int:
    """Play a finished trace in the dashboard as if live, each finding at the step it would
    first have been raised."""
    with _importing():
        from dashboard.serve import serve

    return serve(args.trace, args.host, args.port, speed=args.speed)


def _cmd_build_native(args: argparse.Namespace) -> int:
    """Build dtprof's native libraries into its cache: the profiler-trace reader (a C++
    compiler needed) and, where torch is installed, the kernel that records DDP's buckets at
    about no cost (once per torch build; ninja needed too)."""
    from dtprof.trace import kineto_native

    built = _build("profiler-trace reader", kineto_native.build, args.verbose)
    kineto_native.forget()
    try:
        from dtprof.record import native
    except ImportError as exc:  # no torch here
        print(f"dtprof: no DDP bucket kernel: it needs torch ({exc})")
        return 0 if built else 2
    print("dtprof: building the DDP bucket kernel (10-30 s) ...", file=sys.stderr, flush=True)
    built &= _build("DDP bucket kernel", native.build, args.verbose)
    return 0 if built else 2


def _build(what: str, build: Any, verbose: bool) -> bool:
    """Run one native build; its failure is one line on stderr, and False."""
    import time

    started = time.monotonic()
    try:
        path = build(verbose=verbose)
    except DtprofError as exc:
        print(f"dtprof: error: {exc}", file=sys.stderr)
        return False
    print(f"dtprof: {what} built in {time.monotonic() - started:.1f} s: {path}")
    return True


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
    an = sub.add_parser("analyze", help=_cmd_analyze.__doc__, description=_cmd_analyze.__doc__)
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
    dask = an.add_mutually_exclusive_group()
    dask.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="read the ranks on this Dask cluster, e.g. tcp://host:8786 (trace on shared storage)",
    )
    dask.add_argument(
        "--workers", type=_positive, metavar="N", help="read the ranks on N local Dask workers"
    )
    an.set_defaults(func=_cmd_analyze)
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
        "build-native", help=_cmd_build_native.__doc__, description=_cmd_build_native.__doc__
    )
    bn.add_argument("--verbose", action="store_true", help="show the compiler's output")
    bn.set_defaults(func=_cmd_build_native)
    rp = sub.add_parser("replay", help=_cmd_replay.__doc__, description=_cmd_replay.__doc__)
    _add_server_args(rp)
    rp.add_argument("--speed", type=float, default=1.0, help="times real time (default: 1)")
    rp.set_defaults(func=_cmd_replay)
    return parser


def _lean_arrow_allocator(source: str | None) -> None:
    """Have Arrow allocate from jemalloc when this command reads PyTorch profiler traces.

    Arrow's default allocator, mimalloc, keeps what each thread freed for that thread: importing
    profiler traces then peaks about a quarter higher than with jemalloc at the same speed
    (docs/kineto.md). On dtprof's own traces mimalloc stays: there it is 10-15% faster
    (benchmarks/analyze_scale.py). The choice is Arrow's environment variable, read when Arrow
    first allocates: so only before pyarrow is imported, only where its wheels always carry
    jemalloc (Linux on x86-64), and never over the user's own choice. It reaches the workers.
    """
    if source is None or "pyarrow" in sys.modules:
        return
    if sys.platform != "linux" or platform.machine() != "x86_64":
        return
    from dtprof.trace.layout import has_rank_dirs  # imports only os

    try:
        if os.path.isdir(source) and has_rank_dirs(source):
            return  # a dtprof trace
    except OSError:
        return  # the command says what is wrong with the path
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "jemalloc")


def main(argv: Sequence[str] | None = None) -> int:
    return _dispatch(build_parser().parse_args(argv))


ONE_SHOT = frozenset({"info", "analyze", "convert", "export"})  # commands that run and end


def run() -> NoReturn:
    """The ``dtprof`` command: main(), then, after a one-shot command, out at once.

    When such a command returns, its output is written, its files are renamed into place and
    its pools are shut down (their workers' exit is waited for here). Tearing down an
    interpreter that holds pandas, pyarrow and numpy would then take about 0.1 s more (a
    twentieth of a cold analyze of profiler traces) and change nothing the user sees, so the
    process ends without it. Under a tracer, a profiler or coverage it ends the usual way, so
    that their exit handlers save what they gathered.
    """
    global _OWN_PROCESS
    _OWN_PROCESS = True
    args = build_parser().parse_args()
    code = _dispatch(args)
    traced = sys.gettrace() or sys.getprofile() or "coverage" in sys.modules
    if args.command not in ONE_SHOT or traced:
        raise SystemExit(code)
    for stream in (sys.stdout, sys.stderr):
        # a closed pipe (`dtprof analyze t | head -1`) has nothing more to take
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    wait_for_workers()
    os._exit(code)


def _dispatch(args: argparse.Namespace) -> int:
    try:
        _lean_arrow_allocator(getattr(args, "trace", None) or getattr(args, "source", None))
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
