"""dtprof.parallel.map_items: in this process, or in a process pool, results in order, their
arrays back through memory files; a worker that dies is one error; a trace read either way gives
the same report."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import dtprof.analysis
from dtprof.analysis import analyze
from dtprof.errors import DtprofError
from dtprof.parallel import PROCESSES_FROM, map_items, pack, unpack

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"


def _pid(item: object) -> tuple[int, object]:
    return os.getpid(), item


def _arrays(n: int) -> dict[str, object]:
    return {
        "pid": os.getpid(),
        "numbers": np.arange(n, dtype=np.int64) * 3,
        "table": pa.table({"rank": pa.array([n] * n, pa.int32()), "op": ["all_reduce"] * n}),
    }


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


@pytest.mark.usefixtures("two_cpus")
def test_arrays_come_back_from_workers_whole_and_this_process_may_change_them() -> None:
    sizes = [0, 1, 100_000, 7, 250_000]
    pooled = map_items(_arrays, sizes, processes=True)
    assert all(r["pid"] != os.getpid() for r in pooled)
    for n, result in zip(sizes, pooled, strict=True):
        assert np.array_equal(result["numbers"], np.arange(n) * 3)
        assert result["table"].equals(_arrays(n)["table"])
        result["numbers"][:] = -1  # its own copy: the worker's file stays as it was
    assert np.array_equal(pooled[2]["numbers"], np.full(100_000, -1))


def test_a_result_packs_its_buffers_into_a_memory_file_where_the_system_has_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    result = _arrays(1000)
    payload, shipped = pack(result)
    if hasattr(os, "memfd_create"):
        assert shipped is not None and isinstance(payload, bytes)
        pid, _, spans = shipped
        assert pid == os.getpid() and all(at % 64 == 0 for at, _ in spans)
        assert len(payload) < 2_000  # the 8 kB of numbers and the table's columns travel apart
    back = unpack((payload, shipped))
    assert np.array_equal(back["numbers"], result["numbers"])
    assert back["table"].equals(result["table"])
    if shipped is not None:
        os.close(shipped[1])  # a worker closes its files when it ends: this process goes on
    assert pack({"no": "buffers"}) == ({"no": "buffers"}, None)

    def no_file_left(name: str) -> int:
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(os, "memfd_create", no_file_left, raising=False)
    assert pack(result) == (result, None)  # out of file descriptors: the pipe
    monkeypatch.delattr(os, "memfd_create", raising=False)
    assert pack(result) == (result, None)  # elsewhere: the whole result through the pipe
