"""Heavy items run in this process and in workers beside it (dtprof.beside)."""

from __future__ import annotations

import gc
import multiprocessing
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from dtprof import beside
from dtprof.errors import DtprofError


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + 10
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.01)


def _item(item: tuple[Path, int]) -> tuple[int, int]:
    """Item 0, in the worker, holds on until item 1 is done; item 3, this process's first,
    until the worker has item 0. (pid, item) back."""
    folder, i = item
    if i == 0:
        (folder / "worker-started").touch()
        _wait_for(folder / "1.done")
    if i == 3:
        _wait_for(folder / "worker-started")
    (folder / f"{i}.done").touch()
    return os.getpid(), i


def _fail_on_two(i: int) -> int:
    if i == 2:
        raise ValueError("item 2 is bad")
    return i


@pytest.fixture
def two_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 2)  # one worker beside this process


@pytest.mark.usefixtures("two_cpus")
def test_an_item_waiting_for_a_busy_worker_is_taken_back(tmp_path: Path) -> None:
    """The worker is handed items 0 and 1 (one waiting); this process runs 3 and 2, then takes
    1 back while the worker is still on 0, which holds on until 1 is done."""
    got: dict[int, int] = {}
    beside.run_beside(_item, [(tmp_path, i) for i in range(4)], lambda i, r: got.update({i: r[0]}))
    here = os.getpid()
    assert sorted(got) == [0, 1, 2, 3]
    assert got[0] != here
    assert got[1] == got[2] == got[3] == here


@pytest.mark.usefixtures("two_cpus")
def test_items_kept_here_never_go_to_a_worker_and_errors_come_out() -> None:
    # a lock cannot be pickled: handed to a worker, its item would fail
    items: list[Any] = [threading.Lock() for _ in range(3)] + [3, 4, 5]
    got: dict[int, int] = {}
    beside.run_beside(_pid, items, got.__setitem__, keep=lambda i: i < 3)
    assert sorted(got) == list(range(6))
    assert all(got[i] == os.getpid() for i in range(3))
    with pytest.raises(ValueError, match="item 2 is bad"):
        beside.run_beside(_fail_on_two, list(range(4)), lambda i, r: None)


def _pid(item: Any) -> int:
    return os.getpid()


def test_one_cpu_runs_everything_here_from_the_last(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    order: list[int] = []
    beside.run_beside(_pid, list(range(4)), lambda i, _: order.append(i))
    assert order == [3, 2, 1, 0]
    assert beside.workers_for(8) == 0


def _die_in_a_worker(item: tuple[Path, int, int]) -> int:
    """Item 0 kills the worker that runs it; item 1, here, waits until that has begun."""
    folder, i, parent = item
    if i == 0 and os.getpid() != parent:
        (folder / "worker-started").touch()
        os.kill(os.getpid(), signal.SIGKILL)
    if i == 1:
        _wait_for(folder / "worker-started")
    return i


@pytest.mark.usefixtures("two_cpus")
def test_a_worker_that_dies_is_one_error_naming_its_item(tmp_path: Path) -> None:
    items = [(tmp_path, i, os.getpid()) for i in range(2)]
    names = ["first.json", "second.json"]  # the second, taken back, is read here
    with pytest.raises(DtprofError, match=r"^first\.json: a worker process died while reading"):
        beside.run_beside(_die_in_a_worker, items, lambda i, r: None, name=names.__getitem__)


def _square(i: int) -> int:
    return i * i


@pytest.mark.usefixtures("two_cpus")
def test_objects_frozen_before_stay_frozen_and_its_own_freeze_is_undone() -> None:
    """Workers fork with every object frozen; a freeze made before outlives the run, and the
    run's own one does not."""
    got: dict[int, int] = {}
    gc.unfreeze()
    beside.run_beside(_square, [1, 2, 3], got.__setitem__)
    assert got == {0: 1, 1: 4, 2: 9} and gc.get_freeze_count() == 0
    gc.freeze()
    try:
        beside.run_beside(_square, [1, 2, 3], got.__setitem__)
        assert gc.get_freeze_count() > 0  # still frozen (a few objects freed since)
        assert not multiprocessing.active_children()  # the pool's workers are gone
    finally:
        gc.unfreeze()
