"""Flight Recorder dumps: hand-made ones read and checked; the safe unpickler (real dumps of a
hanging job: tests/jobs/test_flight_dumps.py)."""

from __future__ import annotations

import pickle
import subprocess
from pathlib import Path

import pytest

from dtprof.analysis import analyze
from dtprof.errors import DtprofError
from dtprof.trace import flight


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DTPROF_CACHE_DIR", str(tmp_path / "cache"))


def _write(path: Path, dump: dict) -> Path:
    path.write_bytes(pickle.dumps(dump))
    return path


def _entry(seq: int, state: str, op: str = "all_reduce", **extra: object) -> dict:
    return {
        "collective_seq_id": seq,
        "p2p_seq_id": 0,
        "is_p2p": False,
        "process_group": ("1", "default_pg"),
        "profiling_name": f"nccl:{op}",
        "input_sizes": [[1024, 2]],
        "input_dtypes": ["BFloat16"],
        "state": state,
        "retired": state == "completed",
        "time_created_ns": 1_000_000 * seq,
        "time_discovered_completed_ns": 1_000_000 * seq + 500 if state == "completed" else None,
        **extra,
    }


def test_nccl_states_decide_and_sizes_mismatch_is_named(tmp_path: Path) -> None:
    config = {"1": {"name": "1", "desc": "default_pg", "ranks": "[0, 1, 2]"}}
    for rank, last in ((0, "all_reduce"), (1, "all_gather"), (2, "all_reduce")):
        _write(
            tmp_path / f"nccl_trace_rank_{rank}",
            {
                "version": "2.10",
                "pg_config": config,
                "entries": [_entry(1, "completed"), _entry(2, "completed", last)],
            },
        )
    (hang,) = [f for f in analyze(tmp_path).findings if f.code == "hang"]
    assert hang.ranks == [1] and hang.evidence["calls"] == {
        0: "all_reduce of 4096 bytes",
        1: "all_gather of 4096 bytes",
        2: "all_reduce of 4096 bytes",
    }


def test_the_unpickler_refuses_anything_but_plain_data(tmp_path: Path) -> None:
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (subprocess.call, (["touch", str(marker)],))

    bad = _write(tmp_path / "fr_rank_0", {"entries": [Evil()]})
    with pytest.raises(DtprofError, match=r"fr_rank_0: .*refused to load subprocess\.call"):
        flight.read_dump(bad)
    assert not marker.exists()


def test_dumps_need_a_rank_in_their_name_and_one_file_per_rank(tmp_path: Path) -> None:
    dump = {"entries": [_entry(1, "completed")]}
    (tmp_path / "a").mkdir()
    _write(tmp_path / "a" / "fr_rank_0", dump)
    _write(tmp_path / "a" / "fr_rank_00", dump)
    with pytest.raises(DtprofError, match="rank 0 again"):
        analyze(tmp_path / "a")
    (tmp_path / "b").mkdir()
    _write(tmp_path / "b" / "dump", dump)
    with pytest.raises(DtprofError, match="no rank at the end of the file name"):
        analyze(tmp_path / "b")
