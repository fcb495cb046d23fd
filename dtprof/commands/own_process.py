"""What a ``dtprof`` command does differently when the process is its own (``dtprof.cli.run``,
not ``main()`` called from a user's program): it leaves pandas unimported where no DataFrame is
made, and reads profiler traces with Arrow's leaner allocator. Each is measured in
docs/kineto.md; both only ever apply before what they affect is imported."""

from __future__ import annotations

import contextlib
import os
import platform
import sys
from collections.abc import Iterator
from typing import Any

OWN = False  # set by dtprof.cli.run(): the command has this process to itself


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
