"""Run a function over a few heavy items in this process and in worker processes beside it.

For work in the tens to hundreds of milliseconds an item, over a handful of items (a
profiler trace's files, its converted ranks): this process works too (one process fewer to
start), taking items from the last; the workers take them from the first. Each worker has one
item waiting beside the one it runs, so that it goes on at once; when this process runs out
of items it takes back a waiting one that no worker has started (each side claims an item
under one shared lock) rather than wait for the workers to get through what they hold.
"""

from __future__ import annotations

import gc
import os
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from dtprof.errors import DtprofError

if TYPE_CHECKING:
    from concurrent.futures import Future

T = TypeVar("T")
R = TypeVar("R")


def workers_for(items: int) -> int:
    """Worker processes beside this one for so many items: one a further CPU, one an item."""
    return max(min(items, os.cpu_count() or 1) - 1, 0)


def run_beside(
    fn: Callable[[T], R],
    items: list[T],
    done: Callable[[int, R], None],
    *,
    keep: Callable[[int], bool] | None = None,
    name: Callable[[int], str] = lambda i: f"item {i}",
    first_here: bool = False,
) -> None:
    """``done(i, fn(items[i]))`` for every item, in this process, in the order results come.

    ``fn`` must be a module-level function (workers get it by pickling); ``keep(i)`` True: an
    item only this process runs (asked when it would go to a worker). ``first_here``: this
    process runs one item before the workers fork, so that they inherit what that first item
    warmed up (the libraries' first calls) and what was prepared for them meanwhile. An
    exception in ``fn`` comes out here, the first one raised; a worker that dies (the kernel's
    OOM killer, a signal) is a DtprofError naming its item by ``name(i)``.
    """
    queue = deque(range(len(items)))
    extra = workers_for(len(items))
    if first_here and extra > 0:  # one item here before the workers fork
        i = queue.pop()
        done(i, fn(items[i]))
    if extra <= 0:
        while queue:
            i = queue.pop()
            done(i, fn(items[i]))
        return
    # imported here: the scan ahead imports this module for workers_for, before anything heavy
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
    from concurrent.futures.process import BrokenProcessPool

    claims = multiprocessing.Array("b", len(items))  # 1: a process has the item

    def for_worker() -> int | None:
        for k, i in enumerate(queue):
            if keep is None or not keep(i):
                del queue[k]
                return i
        return None

    taken: set[int] = set()  # items taken back from the workers

    def take_back(running: dict[Future[Any], int]) -> int | None:
        for i in reversed(running.values()):  # the last handed out is the likeliest waiting
            if _claim(claims, i):
                taken.add(i)
                return i
        return None

    def died(i: int, running: dict[Future[Any], int]) -> DtprofError:
        # every future of a broken pool fails: blame an item a worker had started
        started = [j for j in (i, *running.values()) if claims[j] and j not in taken]
        return DtprofError(
            f"{name(started[0] if started else i)}: a worker process died while reading it "
            "(killed, perhaps for lack of memory)"
        )

    # A forked worker inherits this process's garbage: collected there, an object such as a
    # torch process group runs a destructor that waits for threads the worker does not have,
    # and the worker hangs. Objects frozen when a worker forks are never collected in it.
    # (Objects frozen before stay so after.)
    frozen_before = gc.get_freeze_count() > 0
    gc.freeze()
    try:
        pool = ProcessPoolExecutor(extra, initializer=_share_claims, initargs=(claims,))
        try:
            running: dict[Future[Any], int] = {}
            while queue or running:
                while len(running) < 2 * extra and (given := for_worker()) is not None:
                    running[pool.submit(_claimed, fn, given, items[given])] = given
                mine = queue.pop() if queue else take_back(running)
                if mine is not None:
                    done(mine, fn(items[mine]))
                timeout = 0 if mine is not None else None
                ready, _ = wait(running, timeout=timeout, return_when=FIRST_COMPLETED)
                for fut in ready:
                    i = running.pop(fut)
                    try:
                        ran, result = fut.result()
                    except BrokenProcessPool:
                        raise died(i, running) from None
                    if ran:  # else taken back by this process
                        done(i, result)
        finally:
            pool.shutdown(cancel_futures=True)
    finally:
        if not frozen_before:
            gc.unfreeze()


_claims: Any = None  # in a worker: the claims of run_beside's items, shared with the others


def _share_claims(claims: Any) -> None:
    global _claims
    _claims = claims


def _claim(claims: Any, i: int) -> bool:
    """Take item i unless a process already has it."""
    with claims.get_lock():
        if claims[i]:
            return False
        claims[i] = 1
        return True


def _claimed(fn: Callable[[T], R], i: int, item: T) -> tuple[bool, R | None]:
    """(True, fn(item)) in a worker, or (False, None) when the process that handed the item
    out took it back first."""
    return (True, fn(item)) if _claim(_claims, i) else (False, None)
