"""Flight Recorder dumps of a real 3-rank gloo job that hangs, analysed and converted."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

from dtprof.analysis import analyze
from dtprof.cli import main
from dtprof.jobs import launch
from dtprof.trace.importer import trace_kind
from dtprof.trace.reader import load_trace

pytestmark = pytest.mark.multiprocess

JOB = Path(__file__).parent / "workers" / "fr_dump.py"


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
