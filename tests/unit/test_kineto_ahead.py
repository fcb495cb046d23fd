"""Scanning profiler traces ahead, while the analyzer imports its libraries."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from dtprof.analysis import analyze
from dtprof.cli import main
from dtprof.errors import DtprofError
from dtprof.trace import importer, kineto_ahead
from dtprof.trace.importer import import_kineto
from dtprof.trace.kineto import read_kineto
from tests import kinetobuild as kb
from tests.conftest import native_reader_or_skip
from tests.unit.test_kineto_native import assert_same


class FakeScanner:
    """The library's two calls that ScanAhead makes: each scan waits until the test lets it end."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.freed: list[int] = []
        self.release: dict[str, threading.Event] = {}
        self.cond = threading.Condition()

    def dtprof_kineto_scan_file(self, path: bytes) -> int:
        name = os.fsdecode(path)
        with self.cond:
            self.started.append(name)
            self.release[name] = threading.Event()
            self.cond.notify_all()
        self.release[name].wait(10)
        return 1000 + len(self.started)

    def dtprof_kineto_free(self, result: int) -> None:
        self.freed.append(result)

    def dtprof_kineto_trim(self) -> None:
        self.freed.append(0)

    def wait_started(self, count: int) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.started) >= count, 10)


def files(tmp_path: Path, n: int) -> list[Path]:
    return [tmp_path / f"rank{i}.json" for i in range(n)]


@pytest.fixture(autouse=True)
def no_scan_left() -> Iterator[None]:
    yield
    kineto_ahead.stop()


def test_scans_from_the_last_file_and_starts_none_after_a_reservation(tmp_path: Path) -> None:
    lib = FakeScanner()
    f = files(tmp_path, 4)
    ahead = kineto_ahead.ScanAhead(lib, f)  # type: ignore[arg-type]
    lib.wait_started(1)
    lib.release[str(f[3])].set()
    lib.wait_started(2)
    assert lib.started == [str(f[3]), str(f[2])]
    assert ahead.reserve(f[0])  # not scanned: a worker may take it, and it is not scanned here
    assert not ahead.reserve(f[3]) and not ahead.reserve(f[2])  # scanned, and being scanned
    threading.Timer(0.2, lib.release[str(f[2])].set).start()
    assert ahead.take(f[2]) == 1002  # waits for the scan under way
    assert ahead.take(f[3]) == 1001
    assert ahead.take(f[1]) is None  # never scanned: the caller scans it
    ahead._thread.join(10)
    assert lib.started == [str(f[3]), str(f[2])]  # nothing started after the reservation
    assert lib.freed == []  # taken results are the taker's to free


def test_the_first_take_lets_the_scan_go_on_and_the_second_stops_it(tmp_path: Path) -> None:
    lib = FakeScanner()
    f = files(tmp_path, 3)
    ahead = kineto_ahead.ScanAhead(lib, f)  # type: ignore[arg-type]
    lib.wait_started(1)
    lib.release[str(f[2])].set()
    assert ahead.take(f[2]) == 1001  # this process's first file: the thread goes on
    lib.wait_started(2)
    assert ahead.take(f[0]) is None  # a second file taken (never scanned): it stops
    lib.release[str(f[1])].set()
    ahead._thread.join(10)
    assert lib.started == [str(f[2]), str(f[1])] and ahead.take(f[1]) == 1002


def test_scanning_every_file_goes_on_after_takes_and_stays_a_few_files_ahead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kineto_ahead, "WAITING_AT_MOST", 2)
    lib = FakeScanner()
    f = files(tmp_path, 5)
    ahead = kineto_ahead.ScanAhead(lib, f, every=True)  # type: ignore[arg-type]
    lib.wait_started(1)
    assert ahead.next_of(f[::-1]) == 1  # nothing scanned: one not being scanned, read here
    assert ahead.next_of([f[4]]) == 0  # or the one being scanned, the only one left
    lib.release[str(f[4])].set()
    lib.wait_started(2)
    lib.release[str(f[3])].set()
    with ahead._cond:
        assert ahead._cond.wait_for(lambda: len(ahead._scanned) == 2, 10)
    assert ahead.next_of([f[4], f[2], f[3]]) == 0  # the first one scanned already
    assert ahead.next_of([f[2], f[3]]) == 1
    ahead._thread.join(0.2)
    assert lib.started == [str(f[4]), str(f[3])]  # two waiting: it waits for room
    assert ahead.take(f[4]) == 1001 and ahead.take(f[2]) is None  # a second take: it goes on
    lib.wait_started(3)
    assert lib.started[2] == str(f[1])  # f[2] was taken, to be scanned by the taker
    lib.release[str(f[1])].set()
    with ahead._cond:
        assert ahead._cond.wait_for(lambda: len(ahead._scanned) == 2, 10)
    ahead._thread.join(0.2)
    assert len(lib.started) == 3  # two waiting again
    assert ahead.take(f[3]) == 1002
    lib.wait_started(4)
    lib.release[str(f[0])].set()
    ahead._thread.join(10)
    assert not ahead._thread.is_alive()
    assert [ahead.take(p) for p in (f[1], f[0])] == [1003, 1004]
    assert lib.freed == []


def test_the_first_workers_file_is_inherited_by_the_worker_forked_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lib = FakeScanner()
    f = files(tmp_path, 4)
    ahead = kineto_ahead.ScanAhead(lib, f[2:], handed=f[0])  # type: ignore[arg-type]
    monkeypatch.setattr(kineto_ahead, "_current", ahead)
    for k, name in enumerate((f[3], f[2], f[0])):  # this process's share, then the handed file
        lib.wait_started(k + 1)
        lib.release[str(name)].set()
    ahead._thread.join(10)
    assert lib.started == [str(f[3]), str(f[2]), str(f[0])]
    assert ahead.take(f[3]) == 1001  # this process's first file, converted before the fork
    assert ahead.reserve(f[0])  # scanned, but for the worker: handed over, not kept here
    assert not ahead.reserve(f[2])  # scanned for this process: kept here
    pid = os.fork()
    if pid == 0:  # the worker: the handed file's scan once; this process's scans freed
        ok = lib.freed == [1002, 0] and ahead.take(f[0]) == 1003 and ahead.take(f[0]) is None
        os._exit(0 if ok else 1)
    assert os.waitpid(pid, 0)[1] == 0
    pid = os.fork()
    if pid == 0:  # another worker starting on another file: the inherited scan is freed
        ok = ahead.take(f[1]) is None and lib.freed == [1002, 0, 1003] and ahead.take(f[0]) is None
        os._exit(0 if ok else 1)
    assert os.waitpid(pid, 0)[1] == 0
    assert lib.freed == []
    assert ahead.take(f[2]) == 1002 and lib.freed == [1003]  # its own copy freed once forked
    ahead.close()
    assert lib.freed == [1003]


def test_close_frees_what_was_not_taken_and_a_forked_child_takes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lib = FakeScanner()
    f = files(tmp_path, 3)
    ahead = kineto_ahead.ScanAhead(lib, f)  # type: ignore[arg-type]
    monkeypatch.setattr(kineto_ahead, "_current", ahead)
    lib.wait_started(1)
    lib.release[str(f[2])].set()
    lib.wait_started(2)
    pid = os.fork()
    if pid == 0:  # the child inherits the scans, not the thread: it frees them, scans itself
        freed = lib.freed == [1001, 0] and ahead._scanned == {}
        os._exit(0 if freed and ahead.take(f[2]) is None and ahead.reserve(f[2]) else 1)
    assert os.waitpid(pid, 0)[1] == 0
    ahead.close()
    assert lib.freed == [1001]  # scanned, never taken (the child's freeing was its own)
    lib.release[str(f[1])].set()  # the scan under way at close is freed when it ends
    ahead._thread.join(10)
    assert lib.freed == [1001, 1002] and lib.started == [str(f[2]), str(f[1])]
    assert ahead.take(f[1]) is None


def test_files_scanned_ahead_read_as_the_native_reader_reads_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    native_reader_or_skip()
    monkeypatch.setattr(os, "cpu_count", lambda: 1)  # one process: every file is its share
    folder = tmp_path / "k"
    paths = [kb.write(folder, f"rank{r}.json", kb.trace(r, world=3)) for r in range(2)]
    paths.append(kb.write(folder, "rank2.json.gz", kb.trace(2, world=3, relative=True)))
    ahead = kineto_ahead.start(folder)
    assert ahead is not None and kineto_ahead.current() is ahead
    ahead._thread.join(10)
    assert len(ahead._scanned) == 3  # the gzipped file too: it is found gzipped, then inflated
    for path in paths:
        native = read_kineto(path)
        assert native.reader == "native"
        assert_same(native, read_kineto(path, native=False))
    assert ahead._scanned == {}


def test_the_importer_keeps_files_scanned_ahead_for_its_own_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    native_reader_or_skip()
    monkeypatch.setattr(os, "cpu_count", lambda: 3)  # two worker processes beside this one
    folder = kb.ranks(tmp_path / "k", 4)
    plain = import_kineto(folder, tmp_path / "plain")
    ahead = kineto_ahead.start(folder)
    assert ahead is not None and not ahead.every
    ahead._thread.join(10)  # this process's share and the worker's first file: nothing more
    scanned = set(ahead._scanned)
    assert scanned == {os.path.abspath(folder / f"rank{r}.json") for r in (0, 2, 3)}  # 4 / 3
    taken: list[Path] = []
    take = ahead.take
    monkeypatch.setattr(ahead, "take", lambda path: taken.append(path) or take(path))
    metas = import_kineto(folder, tmp_path / "ahead")
    # every file scanned ahead for this process was taken here, and the first file was handed
    # to the worker; this process may also have taken back a file still waiting for the worker
    # (on a busy machine), which it then scans itself
    mine = {os.path.abspath(folder / f"rank{r}.json") for r in (2, 3)}
    assert ahead._scanned == {} and mine <= {os.path.abspath(p) for p in taken}
    assert os.path.abspath(taken[0]) == os.path.abspath(folder / "rank3.json")  # before the fork
    assert [m for m, _ in metas] == [m for m, _ in plain]


def test_on_two_cpus_the_importer_reads_every_file_alone_beside_the_scan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    native_reader_or_skip()
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    folder = kb.ranks(tmp_path / "k", 4)
    plain = import_kineto(folder, tmp_path / "plain")
    ahead = kineto_ahead.start(folder)
    assert ahead is not None and ahead.every
    taken: list[Path] = []
    take = ahead.take
    monkeypatch.setattr(ahead, "take", lambda path: taken.append(path) or take(path))

    def no_worker(*args: object, **kwargs: object) -> None:
        raise AssertionError("a worker process was started")

    monkeypatch.setattr(importer, "run_beside", no_worker)
    metas = import_kineto(folder, tmp_path / "ahead")
    assert sorted(map(os.path.abspath, taken)) == [
        os.path.abspath(folder / f"rank{r}.json") for r in range(4)
    ]
    assert ahead._scanned == {}
    assert [m for m, _ in metas] == [m for m, _ in plain]


def test_alone_a_failed_write_is_one_error_naming_the_file_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    native_reader_or_skip()
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    folder = kb.ranks(tmp_path / "k", 2)
    assert kineto_ahead.start(folder) is not None

    def full(folder: Path, tables: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(importer, "_write_tables", full)
    out = tmp_path / "out"
    with pytest.raises(DtprofError, match=r"rank\d\.json: cannot write its conversion \(OSError"):
        import_kineto(folder, out)
    assert list(tmp_path.iterdir()) == [folder]  # neither the conversion nor its draft


def test_analyze_puts_the_cache_in_place_after_analysing_or_says_why_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    native_reader_or_skip()
    monkeypatch.setattr(os, "cpu_count", lambda: 2)  # the conversion written beside the analysis
    monkeypatch.setenv("DTPROF_CACHE_DIR", str(tmp_path / "cache"))
    folder = kb.ranks(tmp_path / "k", 2)
    write = importer._write_tables

    def full(folder: Path, tables: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(importer, "_write_tables", full)
    assert main(["analyze", str(folder)]) == 2
    assert "cannot write its conversion (OSError" in capsys.readouterr().err
    assert not any((tmp_path / "cache" / "kineto").iterdir())  # neither it nor its draft
    monkeypatch.setattr(importer, "_write_tables", write)
    assert main(["analyze", str(folder)]) == 0
    assert kineto_ahead.cached(folder) is not None


def test_start_only_for_profiler_traces_to_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    native_reader_or_skip()
    monkeypatch.setenv("DTPROF_CACHE_DIR", str(tmp_path / "cache"))
    folder = tmp_path / "k"
    for r in range(2):
        kb.write(folder, f"rank{r}.json", kb.trace(r))
    assert kineto_ahead.start(tmp_path / "missing") is None
    (tmp_path / "empty").mkdir()
    assert kineto_ahead.start(tmp_path / "empty") is None
    monkeypatch.setenv("DTPROF_NATIVE", "0")
    assert kineto_ahead.start(folder) is None
    monkeypatch.delenv("DTPROF_NATIVE")
    with monkeypatch.context() as m:
        m.setenv("DTPROF_NATIVE_DIR", str(tmp_path / "not-built"))
        assert kineto_ahead.start(folder) is None  # the importer builds it, and says so
    more = tmp_path / "more"
    for r in range(4):
        kb.write(more, f"rank{r}.json", kb.trace(r))
    last_first = [str(more / f"rank{r}.json") for r in (3, 2, 1, 0)]
    for cpus, share in ((1, 4), (2, 4), (3, 2), (16, 1)):  # files over CPUs: this process's
        monkeypatch.setattr(os, "cpu_count", lambda cpus=cpus: cpus)
        ahead = kineto_ahead.start(more)
        assert ahead is not None and ahead._order[:share] == last_first[:share]
        alone = cpus <= 2  # no worker: every file is this process's, scanned whatever it takes
        handed = [] if alone else [str(more / "rank0.json")]  # with workers: their first
        assert ahead._order[share:] == handed and ahead._handed == (handed or [None])[0]
        assert ahead.every == alone
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    ahead = kineto_ahead.start(folder)  # two files: one worker at most, so none
    two = [str(folder / f"rank{r}.json") for r in (1, 0)]
    assert ahead is not None and ahead.every and ahead._order == two
    assert kineto_ahead.start(folder / "rank0.json") is not None  # one file
    kineto_ahead.stop()
    assert kineto_ahead.current() is None
    assert main(["analyze", str(folder)]) == 0
    assert kineto_ahead.current() is None  # the command stops what it started
    assert kineto_ahead.start(folder) is None  # converted: the cache is read instead
    assert kineto_ahead.start(folder, even_if_cached=True) is not None  # dtprof convert
    converted = next((tmp_path / "cache" / "kineto").iterdir())
    assert kineto_ahead.start(converted) is None  # a dtprof trace


def test_analyze_reports_the_same_with_the_scan_ahead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    native_reader_or_skip()
    folder = tmp_path / "k"
    for r in range(3):
        kb.write(folder, f"rank{r}.json", kb.trace(r, world=3, compute_us=200 + 100 * r))
    monkeypatch.setenv("DTPROF_CACHE_DIR", str(tmp_path / "c1"))
    plain = json.loads(json.dumps(analyze(folder).to_json()))
    monkeypatch.setenv("DTPROF_CACHE_DIR", str(tmp_path / "c2"))
    assert main(["analyze", str(folder), "--format", "json"]) in (0, 1)
    ahead = json.loads(capsys.readouterr().out)
    assert ahead["findings"] == plain["findings"] and ahead["summary"] == plain["summary"]
