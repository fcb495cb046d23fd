"""Fuzzing every reader with hypothesis: broken bytes in a trace, profiler JSON and Flight
Recorder dumps give a result or a DtprofError, nothing else (a bounded number of cases)."""

from __future__ import annotations

import json
import pickle
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dtprof.analysis import analyze
from dtprof.errors import DtprofError
from dtprof.trace.follow import TraceFollower
from dtprof.trace.reader import load_trace
from tests import kinetobuild
from tests.tracebuild import fr_entry

SAMPLE = Path(__file__).parents[2] / "sample_traces" / "healthy-ddp"
FUZZ = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,  # the same cases in every run: a failure is reproducible
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
FILES = [
    "rank=00001/meta.json",
    "rank=00001/inflight.json",
    "rank=00001/steps/part-000000.parquet",
    "rank=00001/collectives/part-000000.parquet",
    "rank=00001/spans/part-000000.parquet",
    "rank=00001/groups/part-000000.parquet",
]


@contextmanager
def _workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as tmp:
        yield Path(tmp)


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DTPROF_CACHE_DIR", str(tmp_path / "cache"))


def _mutate(data: bytes, how: str, at: float, noise: bytes) -> bytes:
    i = int(at * len(data))
    if how == "truncate":
        return data[:i]
    if how == "overwrite":
        return data[:i] + noise + data[i + len(noise) :]
    return noise


def _reads_or_refuses(path: Path, follow: bool = False) -> None:
    try:
        analyze(path)
        load_trace(path)
        if follow:
            TraceFollower(path).poll()
    except DtprofError as exc:
        assert "\n" not in str(exc)


@FUZZ
@given(
    file=st.sampled_from(FILES),
    how=st.sampled_from(["truncate", "overwrite", "replace"]),
    at=st.floats(0, 1),
    noise=st.binary(min_size=1, max_size=64),
)
def test_a_damaged_dtprof_trace(file: str, how: str, at: float, noise: bytes) -> None:
    with _workdir() as tmp:
        trace = tmp / "t"
        for rank in ("rank=00000", "rank=00001"):
            shutil.copytree(SAMPLE / rank, trace / rank)
        target = trace / file
        target.write_bytes(_mutate(target.read_bytes(), how, at, noise))
        _reads_or_refuses(trace, follow=True)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
META_KEYS = ["rank", "world_size", "clock", "schema_version", "status", "steps", "pipeline"]


@FUZZ
@given(key=st.sampled_from(META_KEYS), value=JSON)
def test_meta_json_with_any_value_in_a_field(key: str, value: object) -> None:
    with _workdir() as tmp:
        trace = tmp / "t"
        for rank in ("rank=00000", "rank=00001"):
            shutil.copytree(SAMPLE / rank, trace / rank)
        file = trace / "rank=00001" / "meta.json"
        meta = json.loads(file.read_text())
        meta[key] = value
        file.write_text(json.dumps(meta))
        _reads_or_refuses(trace, follow=True)


@FUZZ
@given(
    how=st.sampled_from(["truncate", "overwrite", "replace", "event"]),
    at=st.floats(0, 1),
    noise=st.binary(min_size=1, max_size=64),
    event=st.dictionaries(
        st.sampled_from(["ph", "ts", "dur", "name", "cat", "pid", "tid", "args", "id"]), JSON
    ),
)
def test_a_damaged_profiler_trace(how: str, at: float, noise: bytes, event: dict) -> None:
    with _workdir() as tmp:
        doc = kinetobuild.trace(0, steps=2)
        if how == "event":
            doc["traceEvents"].insert(int(at * len(doc["traceEvents"])), event)
        (tmp / "k").mkdir()
        file = tmp / "k" / "rank0.json"
        file.write_text(json.dumps(doc))  # stdlib: big integers and NaN pass through
        if how != "event":
            file.write_bytes(_mutate(file.read_bytes(), how, at, noise))
        _reads_or_refuses(file.parent)


@FUZZ
@given(
    where=st.sampled_from(["dump", "entry", "pg_config", "pg_status", "frames"]),
    key=st.sampled_from(
        [
            "entries",
            "process_group",
            "input_sizes",
            "collective_seq_id",
            "ranks",
            "last_completed_collective",
            "profiling_name",
            "line",
        ]
    ),
    value=JSON,
    as_json=st.booleans(),
)
def test_a_flight_recorder_dump_with_any_value_anywhere(
    where: str, key: str, value: object, as_json: bool
) -> None:
    dump: dict = {
        "version": "2.10",
        "pg_config": {"": {"name": "", "desc": "", "ranks": "[0, 1]"}},
        "pg_status": {"0": {"last_completed_collective": 1}},
        "entries": [fr_entry(1, frames=[]), fr_entry(2, frames=[])],
    }
    target = {
        "dump": dump,
        "entry": dump["entries"][1],
        "pg_config": dump["pg_config"][""],
        "pg_status": dump["pg_status"]["0"],
        "frames": {},
    }[where]
    if where == "frames":
        dump["entries"][1]["frames"] = [target]
    target[key] = value
    with _workdir() as tmp:
        folder = tmp / "fr"
        folder.mkdir()
        for rank in (0, 1):
            if as_json:
                try:
                    data = json.dumps(dump).encode()
                except ValueError:
                    return
            else:
                data = pickle.dumps(dump)
            (folder / f"fr_rank_{rank}").write_bytes(data)
        _reads_or_refuses(folder)


@FUZZ
@given(
    how=st.sampled_from(["truncate", "overwrite", "replace"]),
    at=st.floats(0, 1),
    noise=st.binary(min_size=1, max_size=64),
)
def test_a_damaged_flight_recorder_pickle(how: str, at: float, noise: bytes) -> None:
    dump = {"version": "2.10", "entries": [fr_entry(s, frames=[]) for s in (1, 2, 3)]}
    with _workdir() as tmp:
        folder = tmp / "fr"
        folder.mkdir()
        data = pickle.dumps(dump, protocol=4)
        (folder / "fr_rank_0").write_bytes(data)
        (folder / "fr_rank_1").write_bytes(b"\x80\x04" + _mutate(data[2:], how, at, noise))
        _reads_or_refuses(folder)
