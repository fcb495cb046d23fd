"""What a ``dtprof`` command does differently when the process is its own (``dtprof.cli.run``,
not ``main()`` called from a user's program): it loads numpy without OpenBLAS's spinning threads,
leaves pandas unimported where no DataFrame is made, and reads profiler traces with Arrow's
leaner allocator. Each is measured in docs/kineto.md; each only ever applies before what it
affects is imported, and none reaches a job that ``dtprof run`` starts."""

from __future__ import annotations

import contextlib
import os
import platform
import sys
from collections.abc import Iterator
from typing import Any

OWN = False  # set by dtprof.cli.run(): the command has this process to itself


BLAS_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")


def no_blas_threads() -> None:
    """Have OpenBLAS start no threads of its own when numpy loads, in the command's own process
    and the worker processes it starts. Left to itself OpenBLAS starts a thread per further CPU
    when numpy loads, and each spins, waiting for work, for about 60 ms of a CPU (numpy issue
    29193: 1.3 s of CPU for a bare ``import numpy`` on a many-core machine). dtprof multiplies
    no matrices: on a 2-CPU machine the spin takes the second CPU from the profiler-trace scan
    of a cold ``analyze``. Set before numpy is imported, never over a thread count the user set,
    and never for ``dtprof run``, whose job keeps its environment."""
    if not OWN or "numpy" in sys.modules or any(os.environ.get(v) for v in BLAS_THREAD_VARIABLES):
        return
    os.environ["OPENBLAS_NUM_THREADS"] = "1"


@contextlib.contextmanager
def pandas_held_back() -> Iterator[None]:
    """A command that makes no DataFrame, run with pandas held back from import. pyarrow
    imports pandas, where it is installed, on its first conversion of a Python value (to tell
    pandas objects apart): a large share of a short ``analyze`` (docs/kineto.md), for commands
    that hand it none. Held back, pyarrow carries on without it; afterwards pandas
    imports as usual, and pyarrow's ``to_pandas`` finds it."""
    if not OWN or "pandas" in sys.modules:
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


def lean_arrow_allocator(source: str | None) -> None:
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
