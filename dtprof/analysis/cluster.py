"""Per-rank work on a Dask cluster: an existing one by scheduler address, or a local one.

Workers open the trace by path, so the trace must sit on storage they all see (a shared file
system or the same machine); only each rank's small summary travels back. Dask is optional:
``pip install 'dtprof[dask]'``.
"""

from __future__ import annotations

import logging
import socket
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar
from urllib.parse import urlsplit

from dtprof.errors import DtprofError

T = TypeVar("T")
CONNECT_TIMEOUT = "10s"


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


def dask_map(
    fn: Callable[[Any], T],
    items: Sequence[Any],
    *,
    scheduler: str | None = None,
    workers: int | None = None,
    progress: bool = False,
    what: str = "ranks",
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
        for done, future in enumerate(as_completed(futures, loop=client.loop), 1):
            results[index[future.key]] = future.result()
            if progress and (done % 64 == 0 or done == len(futures)):
                print(f"dtprof: read {done}/{len(futures)} {what} on Dask", file=sys.stderr)
        return results
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
