"""What a ``dtprof`` command does differently when the process is its own (``dtprof.cli.run``,
not ``main()`` called from a user's program): it loads numpy without OpenBLAS's spinning threads
and without its requests for huge pages, has glibc keep the memory it frees, leaves pandas
unimported where no DataFrame is made, and chooses Arrow's allocator for the trace it reads.
Each is measured in docs/kineto.md or docs/scale.md; each only ever applies before what it
affects, and none reaches a job that ``dtprof run`` starts."""

from __future__ import annotations

import contextlib
import ctypes
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


def no_huge_page_requests() -> None:
    """Have numpy leave the kernel to choose the pages of its arrays, in the command's own
    process and its workers. numpy asks for transparent huge pages for each array of 4 MB or
    more (``madvise(MADV_HUGEPAGE)``); where the kernel's THP defragmentation is "madvise" (a
    common default), each first touch of such an array may compact memory to find 2 MB pages
    before it goes on. Matching 41 M collectives across 1024 ranks took 8.3 s with the requests
    and 3.8 s without, the whole analysis 23.1 s and 19.9 s (docs/scale.md). Set before numpy is
    imported (``NUMPY_MADVISE_HUGEPAGE=0``), never over the user's own setting, never for
    ``dtprof run``."""
    if not OWN or "numpy" in sys.modules or "NUMPY_MADVISE_HUGEPAGE" in os.environ:
        return
    os.environ["NUMPY_MADVISE_HUGEPAGE"] = "0"


M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc's mallopt parameters (malloc.h)


def keep_freed_memory() -> None:
    """Have glibc's malloc keep the memory this command frees, for its next allocations, instead
    of handing it back to the system at once. Left to itself glibc maps each array over 32 MB on
    its own and unmaps it when freed, so every large array lands on pages never touched; the
    kernel zeroes each one, and a virtual machine's host may first have to back it (here about
    2 s a GB, against about 0.1 s for memory freed a moment before). An analysis of a thousand
    ranks makes arrays of hundreds of MB by the dozen: about a tenth of its time here
    (docs/scale.md). The process's resident memory then stays near its peak until the command
    ends (the analysis still hands back the per-rank parts it has combined). Only glibc (not
    musl or macOS), and inherited by the worker processes forked from this one."""
    if not OWN or sys.platform != "linux":
        return
    with contextlib.suppress(OSError, AttributeError):  # not glibc: its own ways stay
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(M_MMAP_MAX, 0)  # large blocks from the heap, kept there once freed
        libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1)  # the heap's top given back only past 2 GB


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


def choose_arrow_allocator(source: str | None) -> None:
    """Choose Arrow's allocator for the trace this command reads: jemalloc for PyTorch profiler
    traces, and in the command's own process glibc's malloc (Arrow's "system" pool) for dtprof
    traces.

    Arrow's default allocator, mimalloc, keeps what each thread freed for that thread: importing
    profiler traces then peaks about a quarter higher than with jemalloc at the same speed
    (docs/kineto.md). On dtprof traces the analysis concatenates and computes tables by the
    gigabyte: from glibc's heap, which keep_freed_memory() has keep what it frees, Arrow's
    allocations land on memory already touched (docs/scale.md). The choice is Arrow's
    environment variable, read when Arrow first allocates: so only before pyarrow is imported,
    only where its wheels always carry jemalloc (Linux on x86-64), and never over the user's own
    choice. It reaches the workers.
    """
    if source is None or "pyarrow" in sys.modules:
        return
    if sys.platform != "linux" or platform.machine() != "x86_64":
        return
    from dtprof.trace.layout import has_rank_dirs  # imports only os

    try:
        dtprof_trace = os.path.isdir(source) and has_rank_dirs(source)
    except OSError:
        return  # the command says what is wrong with the path
    if not dtprof_trace:
        os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "jemalloc")
    elif OWN:
        os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
