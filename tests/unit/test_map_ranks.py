"""How a trace's ranks are summarized: beside this process for a few (summarize_folders), in a
process pool for many (analysis.map_ranks)."""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from dtprof.analysis import PROCESSES_FROM, analyze, map_ranks
from dtprof.errors import DtprofError

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
def test_the_ranks_an_item_holds_choose_processes_not_the_items() -> None:
    """Batches of 16 ranks: four of them are 64 ranks, read in worker processes (in threads
    they would take turns on the GIL); one of them is 16, read here."""
    many = [[f"rank={b * 16 + r:05d}" for r in range(16)] for b in range(4)]
    got = map_ranks(_pid, many, count=len)
    assert [item for _, item in got] == many  # in order
    assert all(pid != os.getpid() for pid, _ in got)
    assert {pid for pid, _ in map_ranks(_pid, many[:1], count=len)} == {os.getpid()}
    assert 16 < PROCESSES_FROM <= 64


@pytest.mark.usefixtures("two_cpus")
def test_a_worker_that_dies_is_one_error_naming_where_it_was() -> None:
    items = [(f"rank={r:05d}", os.getpid()) for r in range(PROCESSES_FROM)]
    with pytest.raises(DtprofError) as caught:
        map_ranks(_die_on_rank_5, items, name=lambda item: item[0])
    message = str(caught.value)
    found = re.fullmatch(
        r"(rank=\d{5}): a worker process died while reading this rank or one after it "
        r"\(killed, perhaps for lack of memory\)",
        message,
    )
    assert found, message
    assert found.group(1) <= "rank=00005"  # the dead worker's rank, or one before it


@pytest.mark.usefixtures("two_cpus")
def test_a_few_ranks_holding_enough_are_summarized_beside_with_the_same_report(
    summarize_beside: Callable[[], list[int]],
) -> None:
    trace = SAMPLES / "straggler-ddp"
    here = analyze(trace).to_json()  # a small trace: summarized in this process
    beside = summarize_beside()
    there = analyze(trace).to_json()
    assert beside == [4]
    assert there["summary"] == here["summary"] and there["findings"] == here["findings"]
    assert any(f["code"] == "straggler" for f in there["findings"])
