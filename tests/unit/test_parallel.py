"""dtprof.parallel.map_items: in this process, or in a process pool, results in order; a worker
that dies is one error; a trace read either way gives the same report."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest

import dtprof.analysis
from dtprof.analysis import analyze
from dtprof.errors import DtprofError
from dtprof.parallel import PROCESSES_FROM, map_items

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"


def _pid(item: object) -> tuple[int, object]:
    return os.getpid(), item


def _die_on_rank_5(item: tuple[str, int]) -> str:
    name, parent = item
    if name == "rank=00005" and os.getpid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)
    return name


@pytest.fixture
def two_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 2)


@pytest.mark.usefixtures("two_cpus")
def test_items_run_here_or_in_worker_processes_in_order() -> None:
    many = [[f"rank={b * 16 + r:05d}" for r in range(16)] for b in range(4)]
    pooled = map_items(_pid, many, processes=True, count=len)
    assert [item for _, item in pooled] == many  # in order
    assert all(pid != os.getpid() for pid, _ in pooled)
    here = map_items(_pid, many, processes=False, count=len)
    assert [item for _, item in here] == many and {pid for pid, _ in here} == {os.getpid()}
    assert {pid for pid, _ in map_items(_pid, many[:1], processes=True)} == {os.getpid()}
    assert 16 < PROCESSES_FROM <= 64


@pytest.mark.usefixtures("two_cpus")
def test_a_worker_that_dies_is_one_error_naming_where_it_was() -> None:
    items = [(f"rank={r:05d}", os.getpid()) for r in range(PROCESSES_FROM)]
    with pytest.raises(DtprofError) as caught:
        map_items(_die_on_rank_5, items, processes=True, name=lambda item: item[0])
    message = str(caught.value)
    found = re.fullmatch(
        r"(rank=\d{5}): a worker process died while reading this rank or one after it "
        r"\(killed, perhaps for lack of memory\)",
        message,
    )
    assert found, message
    assert found.group(1) <= "rank=00005"  # the dead worker's rank, or one before it


@pytest.mark.usefixtures("two_cpus")
def test_ranks_summarized_in_worker_processes_give_the_same_report(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    trace = SAMPLES / "straggler-ddp"
    here = analyze(trace).to_json()  # 4 ranks: summarized in this process
    monkeypatch.setattr(dtprof.analysis, "RANKS_PER_TASK", 1)
    monkeypatch.setattr(dtprof.analysis, "PROCESSES_FROM", 1)
    pooled = analyze(trace).to_json()
    assert pooled["summary"] == here["summary"] and pooled["findings"] == here["findings"]
    assert any(f["code"] == "straggler" for f in pooled["findings"])
