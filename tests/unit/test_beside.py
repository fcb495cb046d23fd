"""Heavy items run in this process and in workers beside it (dtprof.beside)."""

from __future__ import annotations

import gc
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from dtprof import beside, cli
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
def test_objects_frozen_before_stay_frozen_and_its_own_freeze_is_undone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Workers fork with every object frozen; a freeze made before (a command's imports, see
    dtprof.cli) outlives the run, and the run's own one does not."""
    got: dict[int, int] = {}
    gc.unfreeze()
    beside.run_beside(_square, [1, 2, 3], got.__setitem__)
    assert got == {0: 1, 1: 4, 2: 9} and gc.get_freeze_count() == 0
    with cli._importing():  # not the command's own process: nothing frozen
        pass
    assert gc.isenabled() and gc.get_freeze_count() == 0
    monkeypatch.setattr(cli, "_OWN_PROCESS", True)
    monkeypatch.setattr(beside, "_command", False)
    try:
        with cli._importing():
            assert not gc.isenabled()
        assert gc.isenabled() and gc.get_freeze_count() > 0
        counted = []  # the command's run does not count its frozen objects (7 ms)
        count = gc.get_freeze_count
        monkeypatch.setattr(gc, "get_freeze_count", lambda: counted.append(1) or count())
        beside.run_beside(_square, [1, 2, 3], got.__setitem__)
        assert not counted and count() > 0
        assert len(beside._closing) == 1  # its workers' exit is waited for at the end
        beside.wait_for_workers()
        assert not beside._closing and not multiprocessing.active_children()
    finally:
        gc.unfreeze()


_RUN_AND_END = """
import os
from dtprof import beside
os.cpu_count = lambda: 2
def square(i):
    return i * i
got = {}
beside.command_owns_process()
beside.run_beside(square, [1, 2, 3], got.__setitem__)
print(sorted(got.items()), flush=True)
beside.wait_for_workers()  # as the command does before it ends
os._exit(0)
"""


def test_a_command_ending_at_once_leaves_no_worker_behind() -> None:
    """The command's process goes on while its pool's worker exits, and waits for it only
    before ``os._exit``: without that wait, the worker could outlive it, waiting for its pool's
    last word and holding the command's output open (its reader would never see the end)."""
    proc = subprocess.Popen([sys.executable, "-c", _RUN_AND_END], stdout=subprocess.PIPE, text=True)
    try:
        out, _ = proc.communicate(timeout=20)
    finally:
        for child in _children(proc.pid):
            os.kill(child, signal.SIGKILL)
        proc.kill()
        proc.wait()
    assert out.strip() == "[(0, 1), (1, 4), (2, 9)]"


def _children(pid: int) -> list[int]:
    """The other processes running this test's script: its worker, found by its command line
    (once orphaned it is re-parented, and no longer has pid as its parent)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if b"beside.run_beside(square" in cmdline and int(entry) != pid:
                found.append(int(entry))
    return found


_COUNT_NUMPY_THREADS = """
import os
from dtprof import cli
cli._OWN_PROCESS = True
before = len(os.listdir("/proc/self/task"))
with cli._importing():
    import numpy
print(len(os.listdir("/proc/self/task")) - before, os.environ.get("OPENBLAS_NUM_THREADS"))
"""


@pytest.mark.skipif(
    not os.path.isdir("/proc/self/task") or (os.cpu_count() or 1) < 2,
    reason="counts a process's threads in /proc; OpenBLAS starts none on one CPU",
)
@pytest.mark.parametrize(("user_sets", "printed"), [(None, "0 None"), ("1", "0 1")])
def test_the_command_loads_numpy_without_blas_threads_and_passes_no_setting_on(
    user_sets: str | None, printed: str
) -> None:
    """OpenBLAS would start a spinning thread per further CPU; the setting that stops it does
    not outlive the import, and one the user made is theirs."""
    env = {k: v for k, v in os.environ.items() if k not in cli.BLAS_THREAD_VARIABLES}
    if user_sets is not None:
        env["OPENBLAS_NUM_THREADS"] = user_sets
    out = subprocess.run(
        [sys.executable, "-c", _COUNT_NUMPY_THREADS],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert out.stdout.split() == printed.split(), out.stderr
