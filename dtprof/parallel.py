"""One way to run work over ranks or files: in this process, in a local process pool, or on
a Dask cluster. ``map_items`` is what every caller uses.

Which pays was measured (docs/scale.md): a pool that sends each rank's tables back pickles more
than it saves, one that combines a batch of ranks in each worker pays from a few dozen ranks.
So a few ranks are read here, many by a pool of batches. On Dask, workers
open the trace by path, so the trace must sit on storage they all see (a shared file system or
the same machine); only each task's small result travels back. Dask is optional:
``pip install 'dtprof[dask]'``.

A pool's results come back through memory files (Linux's memfd): the pickle of a result
travels through the pool's pipe, its arrays' buffers (pickle protocol 5, out of band) through a
file the worker writes and this process maps. Through the pipe alone, one receiving thread
copied every byte several times into fresh memory: at 1024 ranks x 1000 steps, 2.8 GB of
tables, the read stage took 13.3 s, and 7.8 s this way (docs/scale.md).
"""

from __future__ import annotations

import gc
import itertools
import logging
import mmap
import os
import pickle
import socket
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar
from urllib.parse import urlsplit

from dtprof.errors import DtprofError

T = TypeVar("T")
CONNECT_TIMEOUT = "10s"
PROCESSES_FROM = 32  # ranks; below that, a process pool costs more than it saves
PROGRESS_AFTER_S = 1.0  # work that takes longer shows its progress on stderr


def map_items(
    fn: Callable[[Any], T],
    items: Sequence[Any],
    *,
    processes: bool = False,
    scheduler: str | None = None,
    workers: int | None = None,
    progress: bool = False,
    count: Callable[[Any], int] | None = None,
    name: Callable[[Any], str] = str,
    what: str = "ranks",
) -> list[T]:
    """``fn`` on each item, results in order: on the Dask cluster at ``scheduler`` or on
    ``workers`` local Dask processes when either is given; else in a local process pool when
    ``processes`` (and there are two CPUs and two items), else here. ``fn`` must be a
    module-level function for the pool and Dask. ``count``: how many ranks an item holds (1),
    for the progress line ``dtprof: read N/M ranks``; ``name`` names an item in the error when
    a worker process dies (the kernel's OOM killer, a signal)."""
    shown = _Progress(sum(count(i) if count else 1 for i in items), progress, what)
    if scheduler or workers:
        return _on_dask(fn, items, scheduler, workers, shown, count)
    if not processes or len(items) < 2 or (os.cpu_count() or 1) < 2:
        out = []
        for item in items:
            out.append(fn(item))
            shown.add(count(item) if count else 1)
        return out
    return _in_pool(fn, items, shown, count, name)


def _in_pool(
    fn: Callable[[Any], T],
    items: Sequence[Any],
    shown: _Progress,
    count: Callable[[Any], int] | None,
    name: Callable[[Any], str],
) -> list[T]:
    from concurrent.futures import BrokenExecutor, ProcessPoolExecutor

    workers = min(os.cpu_count() or 1, len(items))
    chunk = max(1, min(4, len(items) // (2 * workers)))  # never so few chunks a worker idles
    out: list[T] = []
    # what the forked workers inherit is never collected there: a dead process group left in
    # a cycle (a finished job in a notebook), say, whose destructor waits for threads they lack
    gc.freeze()
    try:
        with ProcessPoolExecutor(workers) as pool:
            packed = pool.map(_run_packed, itertools.repeat(fn), items, chunksize=chunk)
            for item, result in zip(items, packed, strict=True):
                out.append(unpack(result))
                shown.add(count(item) if count else 1)
    except BrokenExecutor:  # a worker died
        # the pool fails every item not finished: the dead worker's is the first of them or one
        # after it, and map() hands results in order, so that is as near as it can name it
        raise DtprofError(
            f"{name(items[len(out)])}: a worker process died while reading this rank or one "
            "after it (killed, perhaps for lack of memory)"
        ) from None
    finally:
        gc.unfreeze()
    return out


# where a result's buffers are: the worker's pid, its memory file, each buffer's offset and length
Shipped = tuple[int, int, list[tuple[int, int]]]
ALIGN = 64  # bytes: where each buffer starts in a memory file (Arrow's alignment)
_RESULT_FILES: list[int] = []  # a worker's memory files, open until it exits: the parent opens them


def _run_packed(fn: Callable[[Any], T], item: Any) -> tuple[Any, Shipped | None]:
    """In a pool's worker: fn(item), packed for the way back."""
    return pack(fn(item))


def pack(result: Any) -> tuple[Any, Shipped | None]:
    """In a pool's worker: (the pickle of ``result``, where its buffers are), its buffers written
    to a memory file that stays open while this process lives; or (result, None), to travel
    whole through the pipe, where the result has no buffers to speak of or the system no memory
    files."""
    if not hasattr(os, "memfd_create"):
        return result, None
    buffers: list[memoryview] = []
    payload = pickle.dumps(result, protocol=5, buffer_callback=lambda b: buffers.append(b.raw()))
    spans, size = [], 0
    for buffer in buffers:
        size = -(-size // ALIGN) * ALIGN
        spans.append((size, buffer.nbytes))
        size += buffer.nbytes
    if size == 0:
        return result, None
    fd = -1
    try:
        fd = os.memfd_create("dtprof-result")
        for (at, length), buffer in zip(spans, buffers, strict=True):
            done = 0
            while done < length:
                done += os.pwrite(fd, buffer[done:], at + done)
    except OSError:  # no room for it, or no file descriptor left: the pipe
        if fd >= 0:
            os.close(fd)
        return result, None
    _RESULT_FILES.append(fd)
    return payload, (os.getpid(), fd, spans)


def unpack(packed: tuple[Any, Shipped | None]) -> Any:
    """The result that pack() packed in a worker that is still running: its buffers mapped from
    the worker's memory file (copy-on-write, so they are this process's to change)."""
    result, shipped = packed
    if shipped is None:
        return result
    pid, fd, spans = shipped
    try:
        with open(f"/proc/{pid}/fd/{fd}", "rb") as file:
            memory = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_COPY)
    except OSError as exc:
        raise DtprofError(f"cannot open the results of worker process {pid} ({exc})") from None
    view = memoryview(memory)
    return pickle.loads(result, buffers=[view[at : at + length] for at, length in spans])


class _Progress:
    """``dtprof: read N/M ranks`` on stderr once the work is slow: every sixteenth of them (at
    most every 64), and the last."""

    def __init__(self, total: int, on: bool, what: str) -> None:
        self.total, self.on, self.what = total, on, what
        self.started, self.done, self.shown = time.monotonic(), 0, 0

    def add(self, ranks: int = 1) -> None:
        self.done += ranks
        late = time.monotonic() - self.started > PROGRESS_AFTER_S
        every = max(1, min(64, self.total // 16))  # a line for each of a few heavy items
        if self.on and late and (self.done - self.shown >= every or self.done == self.total):
            print(f"dtprof: read {self.done}/{self.total} {self.what}", file=sys.stderr, flush=True)
            self.shown = self.done


def _reachable(scheduler: str) -> None:
    """Fail at once, not after Dask's connect timeout, when nothing listens at a tcp address."""
    parsed = urlsplit(scheduler if "://" in scheduler else f"tcp://{scheduler}")
    if parsed.scheme != "tcp" or parsed.hostname is None or parsed.port is None:
        return
    try:
        socket.create_connection((parsed.hostname, parsed.port), timeout=10).close()
    except OSError as exc:
        raise DtprofError(
            f"{scheduler}: cannot reach the Dask scheduler ({exc.strerror or exc})"
        ) from None


def _on_dask(
    fn: Callable[[Any], T],
    items: Sequence[Any],
    scheduler: str | None,
    workers: int | None,
    shown: _Progress,
    count: Callable[[Any], int] | None,
) -> list[T]:
    """fn over items on the cluster at `scheduler`, or on `workers` local processes; in order."""
    try:
        from dask.distributed import Client, LocalCluster, as_completed
    except ImportError as exc:
        raise DtprofError(
            f"--scheduler and --workers need Dask distributed ({exc}): pip install 'dtprof[dask]'"
        ) from None
    cluster = None
    if scheduler is not None:
        _reachable(scheduler)
    try:
        if scheduler is not None:
            client = Client(scheduler, timeout=CONNECT_TIMEOUT, set_as_default=False)
        else:
            cluster = LocalCluster(
                n_workers=workers or 1,
                threads_per_worker=1,
                processes=True,
                dashboard_address=None,
                silence_logs=logging.CRITICAL,
            )
            client = Client(cluster, set_as_default=False)
    except OSError as exc:
        raise DtprofError(f"{scheduler}: cannot reach the Dask scheduler ({exc})") from None
    try:
        futures = client.map(fn, list(items), pure=False)
        index = {f.key: i for i, f in enumerate(futures)}
        results: list[Any] = [None] * len(futures)
        for future in as_completed(futures, loop=client.loop):
            i = index[future.key]
            results[i] = future.result()
            shown.add(count(items[i]) if count else 1)
        return results
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
