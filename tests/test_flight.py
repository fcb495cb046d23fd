"""Flight Recorder dumps: a real gloo job that hangs, its dumps analysed; the safe unpickler."""

from __future__ import annotations

import hashlib
import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from dtprof.analysis import analyze
from dtprof.cli import main
from dtprof.errors import DtprofError
from dtprof.jobs import launch
from dtprof.trace import flight
from dtprof.trace.importer import trace_kind
from dtprof.trace.reader import load_trace

JOB = Path(__file__).parent / "jobs" / "fr_dump.py"


def digest(root: Path) -> dict[str, str]:
    """Every file under root with the sha256 of its bytes."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DTPROF_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def dumps(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Dumps of a 3-rank gloo job in which rank 1 skips the third all-reduce."""
    out = tmp_path_factory.mktemp("fr")
    logs = out.parent / f"{out.name}-logs"
    procs = launch.start_command([sys.executable, str(JOB), str(out)], 3, log_dir=logs)
    codes = launch.wait(procs, 90)
    assert codes == [0, 0, 0], [p.read_text()[-2000:] for p in sorted(logs.glob("*.log"))]
    return out


@pytest.mark.multiprocess
@pytest.mark.parametrize("form", ["pickle", "json"])
def test_a_hang_is_found_in_real_flight_recorder_dumps(
    dumps: Path, form: str, tmp_path: Path
) -> None:
    folder = dumps if form == "pickle" else dumps / "json"
    before = digest(folder)
    assert trace_kind(folder) == "flight"
    (hang,) = [f for f in analyze(folder).findings if f.code == "hang"]
    assert hang.ranks == [1] and hang.severity == "error"
    ev = hang.evidence
    assert (ev["group"], ev["seq"], ev["op"], ev["joined"], ev["missing"]) == (
        "0",
        3,
        "all_reduce",
        [0, 2],
        [1],
    )
    doing = ev["last_activity"][1]
    assert doing.startswith("collective all_reduce (group 0, seq 2)")
    # the pickle has Python frames: where rank 1 last called a collective, and where the
    # others are stuck; the JSON form has none
    trace = load_trace(folder)
    hangs = trace.events[trace.events["kind"] == "hang"]
    assert sorted(hangs["rank"]) == [0, 2]
    frames = json.loads(hangs["detail"].iloc[0])["stacks"][0]["frames"]
    if form == "pickle":
        assert doing.endswith("in main") and "fr_dump.py" in doing
        assert [f["function"] for f in frames][-3:] == ["main", "wrapper", "all_reduce"]
    else:
        assert "called from" not in doing and frames == []
    assert set(trace.collectives["seq"]) == {1, 2}
    # dtprof convert keeps the conversion, and analysing it gives the same finding
    out = tmp_path / "converted"
    assert main(["convert", str(folder), "-o", str(out)]) == 0
    assert [f.to_json() for f in analyze(out).findings if f.code == "hang"] == [hang.to_json()]
    assert digest(folder) == before


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
