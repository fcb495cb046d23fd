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
from dtprof.parallel import map_items
from dtprof.trace.kineto import convert, scan_ahead
from dtprof.trace.kineto.cache import cached
from dtprof.trace.kineto.convert import import_kineto
from dtprof.trace.kineto.read import read_kineto
from tests import kinetobuild as kb
from tests.conftest import native_reader_or_skip
from tests.unit.test_kineto_native import assert_same


class FakeScanner:
    """The native module's call that ScanAhead makes: each scan waits until the test lets it
    end."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.release: dict[str, threading.Event] = {}
        self.cond = threading.Condition()

    def scan_file(self, name: str) -> str:
        with self.cond:
            self.started.append(name)
            self.release[name] = threading.Event()
            self.cond.notify_all()
        self.release[name].wait(10)
        return f"scan of {Path(name).name}"

    def wait_started(self, count: int) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.started) >= count, 10)


def files(tmp_path: Path, n: int) -> list[Path]:
    return [tmp_path / f"rank{i}.json" for i in range(n)]


@pytest.fixture(autouse=True)
def no_scan_left() -> Iterator[None]:
    yield
    scan_ahead.stop()


def test_scans_in_order_and_hands_each_over_once(tmp_path: Path) -> None:
    module = FakeScanner()
    f = files(tmp_path, 3)
    ahead = scan_ahead.ScanAhead(module, f)  # type: ignore[arg-type]
    module.wait_started(1)
    module.release[str(f[0])].set()
    assert ahead.take(f[0]) == "scan of rank0.json"  # waits while it is being scanned
    assert ahead.take(f[0]) is None  # once
    module.wait_started(2)
    assert module.started == [str(f[0]), str(f[1])]
    module.release[str(f[1])].set()
    assert ahead.take(f[2]) is None  # not reached: this process scans it, the thread skips it
    ahead._thread.join(10)
    assert module.started == [str(f[0]), str(f[1])]
    assert ahead.take(f[1]) == "scan of rank1.json"


def test_stays_at_most_so_many_scans_ahead(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scan_ahead, "WAITING_AT_MOST", 2)
    module = FakeScanner()
    f = files(tmp_path, 5)
    for path in f:
        module.release[str(path)] = threading.Event()
    ahead = scan_ahead.ScanAhead(module, f)  # type: ignore[arg-type]
    for k in range(2):
        module.wait_started(k + 1)
        module.release[str(f[k])].set()
    with ahead._cond:  # two scans waiting to be taken: the thread waits too
        assert ahead._cond.wait_for(lambda: len(ahead._scanned) == 2, 10)
    assert len(module.started) == 2
    assert ahead.take(f[0]) is not None  # room for one more
    module.wait_started(3)
    ahead.close()  # the scan under way is dropped when it ends; nothing more is started
    module.release[str(f[2])].set()
    ahead._thread.join(10)
    assert len(module.started) == 3 and ahead._scanned == {} and ahead.take(f[1]) is None


def test_files_scanned_ahead_read_as_the_native_reader_reads_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    native_reader_or_skip()
    monkeypatch.setattr(os, "cpu_count", lambda: 1)  # this process reads every file
    folder = tmp_path / "k"
    paths = [kb.write(folder, f"rank{r}.json", kb.trace(r, world=3)) for r in range(2)]
    paths.append(kb.write(folder, "rank2.json.gz", kb.trace(2, world=3, relative=True)))
    ahead = scan_ahead.start(folder)
    assert ahead is not None and scan_ahead.running() is ahead
    ahead._thread.join(10)
    assert len(ahead._scanned) == 3  # the gzipped file too
    for path in paths:
        native = read_kineto(path)
        assert native.reader == "native"
        assert_same(native, read_kineto(path, native=False))
    assert ahead._scanned == {}


def test_on_two_cpus_the_importer_reads_every_file_alone_beside_the_scan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    native_reader_or_skip()
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    folder = kb.ranks(tmp_path / "k", 4)
    plain = import_kineto(folder, tmp_path / "plain")
    ahead = scan_ahead.start(folder)
    assert ahead is not None
    taken: list[Path] = []
    take = ahead.take
    monkeypatch.setattr(ahead, "take", lambda path: taken.append(path) or take(path))
    processes = []

    def here(*args: object, **kwargs: object) -> object:
        processes.append(kwargs["processes"])
        return map_items(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(convert, "map_items", here)
    metas = import_kineto(folder, tmp_path / "ahead")
    assert processes == [False]  # no worker process
    assert [os.path.abspath(p) for p in taken] == [
        os.path.abspath(folder / f"rank{r}.json") for r in range(4)
    ]
    assert ahead._scanned == {}
    assert [m for m, _ in metas] == [m for m, _ in plain]


def test_with_more_cpus_the_files_are_read_by_a_pool_without_a_scan_ahead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 3)
    folder = kb.ranks(tmp_path / "k", 4)
    assert scan_ahead.start(folder) is None
    plain = import_kineto(folder, tmp_path / "plain")
    assert [m.rank for m, _ in plain] == [0, 1, 2, 3]
    assert sorted(p.name for p in (tmp_path / "plain").iterdir()) == [
        f"rank={r:05d}" for r in range(4)
    ]


def test_alone_a_failed_write_is_one_error_naming_the_file_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    native_reader_or_skip()
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    folder = kb.ranks(tmp_path / "k", 2)
    assert scan_ahead.start(folder) is not None

    def full(folder: Path, tables: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(convert, "_write_tables", full)
    out = tmp_path / "out"
    with pytest.raises(DtprofError, match=r"rank0\.json: cannot write its conversion \(OSError"):
        import_kineto(folder, out)
    assert list(tmp_path.iterdir()) == [folder]  # neither the conversion nor its draft


def test_analyze_puts_the_cache_in_place_after_analysing_or_says_why_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    native_reader_or_skip()
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setenv("DTPROF_CACHE_DIR", str(tmp_path / "cache"))
    folder = kb.ranks(tmp_path / "k", 2)
    write = convert._write_tables

    def full(folder: Path, tables: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(convert, "_write_tables", full)
    assert main(["analyze", str(folder)]) == 2
    assert "cannot write its conversion (OSError" in capsys.readouterr().err
    assert not any((tmp_path / "cache" / "kineto").iterdir())  # neither it nor its draft
    monkeypatch.setattr(convert, "_write_tables", write)
    assert main(["analyze", str(folder)]) == 0
    assert cached(folder) is not None


def test_start_only_for_profiler_traces_to_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    native_reader_or_skip()
    monkeypatch.setenv("DTPROF_CACHE_DIR", str(tmp_path / "cache"))
    folder = tmp_path / "k"
    for r in range(2):
        kb.write(folder, f"rank{r}.json", kb.trace(r))
    assert scan_ahead.start(tmp_path / "missing") is None
    (tmp_path / "empty").mkdir()
    assert scan_ahead.start(tmp_path / "empty") is None
    monkeypatch.setenv("DTPROF_NATIVE", "0")
    assert scan_ahead.start(folder) is None
    monkeypatch.delenv("DTPROF_NATIVE")
    for cpus, reads_alone in ((1, True), (2, True), (3, False), (16, False)):
        monkeypatch.setattr(os, "cpu_count", lambda cpus=cpus: cpus)
        ahead = scan_ahead.start(folder)
        assert (ahead is not None) == reads_alone
        if ahead is not None:
            assert ahead._order == [str(folder / f"rank{r}.json") for r in range(2)]
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert scan_ahead.start(folder / "rank0.json") is not None  # one file
    scan_ahead.stop()
    assert scan_ahead.running() is None
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert main(["analyze", str(folder)]) == 0
    assert scan_ahead.running() is None  # the command stops what it started
    assert scan_ahead.start(folder) is None  # converted: the cache is read instead
    assert scan_ahead.start(folder, even_if_cached=True) is not None  # dtprof convert
    converted = next((tmp_path / "cache" / "kineto").iterdir())
    assert scan_ahead.start(converted) is None  # a dtprof trace


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
