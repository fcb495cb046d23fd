"""Importing PyTorch profiler (Kineto) traces: mapping, ranks, HTA figures, CLI, bad input."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

import dtprof
from dtprof.analysis import analyze
from dtprof.cli import main
from dtprof.trace.importer import trace_kind
from dtprof.trace.kineto import events as kineto_events
from dtprof.trace.kineto.mapping import rank_tables
from dtprof.trace.kineto.read import read_kineto
from dtprof.trace.kineto.scan_ahead import cached
from tests import kinetobuild as kb

REFERENCE = Path(__file__).resolve().parents[3] / "shared" / "reference_traces"
if not REFERENCE.is_dir():
    REFERENCE = Path("/work/shared/reference_traces")
TOLERANCE_POINTS = 1.0


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test converts into its own cache folder."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("DTPROF_CACHE_DIR", str(folder))
    return folder


def two_ranks(folder: Path, suffix: str = ".json", **kw: Any) -> Path:
    for rank in (0, 1):
        kb.write(folder, f"worker{rank}{suffix}", kb.trace(rank, **kw))
    return folder


def gpu_rows(path: Path) -> dict[int, dict[str, Any]]:
    summary = analyze(path).to_json()["summary"]
    return {row["rank"]: row for row in summary["gpu"]["ranks"]}


def test_detects_both_kinds(tmp_path: Path) -> None:
    assert trace_kind(two_ranks(tmp_path / "k")) == "kineto"
    assert trace_kind(tmp_path / "k" / "worker0.json") == "kineto"
    assert trace_kind(Path(__file__).resolve().parents[2] / "sample_traces" / "healthy-ddp") == (
        "dtprof"
    )


@pytest.mark.parametrize("relative", [False, True])
def test_both_timestamp_conventions_become_the_same_ns(tmp_path: Path, relative: bool) -> None:
    trace = dtprof.load_trace(two_ranks(tmp_path / "k", relative=relative))
    steps = trace.steps[trace.steps["rank"] == 0].sort_values("step")
    origin = kb.BASE_NS if relative else kb.ABS_T0_US * 1000
    assert steps["start_ns"].tolist() == [origin + s * kb.STEP_US * 1000 for s in range(3)]
    kernels = trace.kernels[trace.kernels["rank"] == 0]
    assert kernels["category"].value_counts().to_dict() == {
        "compute": 3,
        "communication": 3,
        "memory": 3,
    }
    assert set(kernels["stream"]) == {kb.COMPUTE_STREAM, kb.NCCL_STREAM}


def test_figures_of_a_tiny_trace_in_gz_and_both_nccl_names(tmp_path: Path) -> None:
    """compute 100-500, NCCL 300-700, memcpy 600-650 per 1000 µs step; last step not counted."""
    old = gpu_rows(two_ranks(tmp_path / "old", ".json.gz"))
    new = gpu_rows(two_ranks(tmp_path / "new", nccl=kb.NCCL_NEW))
    for rows in (old, new):
        assert rows[0]["comm_overlap_pct"] == 50.0
        assert (rows[0]["idle_pct"], rows[0]["compute_pct"], rows[0]["non_compute_pct"]) == (
            25.0,
            50.0,
            25.0,
        )
        assert rows[0]["span_ms"] == 1.6


def test_collectives_steps_and_memory_are_mapped(tmp_path: Path) -> None:
    trace = dtprof.load_trace(two_ranks(tmp_path / "k"))
    coll = trace.collectives[trace.collectives["rank"] == 1].sort_values("seq")
    assert coll["op"].tolist() == ["all_reduce"] * 3
    assert coll["seq"].tolist() == [0, 1, 2]
    assert coll["bytes"].tolist() == [4096] * 3
    assert coll["step"].tolist() == [0, 1, 2]
    start = kb.ABS_T0_US * 1000 + 300_000  # the NCCL kernel's start, not the CPU call's
    assert int(coll["start_ns"].iloc[0]) == start
    mem = trace.samples[
        (trace.samples["rank"] == 0) & (trace.samples["metric"] == "cuda_allocated_bytes")
    ]
    assert mem["value"].tolist() == [2**20, 2**21, 3 * 2**20]


def test_p2p_beside_collectives_is_counted_apart(tmp_path: Path) -> None:
    """A pipeline stage's send among data-parallel all-reduces: peer is null for the
    collectives and -1 (unknown) for the send, and each kind keeps its own call order."""
    doc = kb.trace(0, steps=4)
    rpc = [e for e in doc["traceEvents"] if e["name"] == "record_param_comms"]
    ann = [e for e in doc["traceEvents"] if e["name"] == "nccl:allreduce"]
    rpc[1]["args"]["Collective name"], ann[1]["name"] = "send", "nccl:send"
    coll = rank_tables(read_kineto(kb.write(tmp_path, "rank0.json", doc)))["collectives"]
    assert coll.column("op").to_pylist() == ["all_reduce", "send", "all_reduce", "all_reduce"]
    assert coll.column("peer").to_pylist() == [None, -1, None, None]
    assert coll.column("seq").to_pylist() == [0, 0, 1, 2]
    assert coll.column("step").to_pylist() == [0, 1, 2, 3]
    assert coll.schema.metadata == {b"dtprof.seq_from": b"call order"}


def test_rank_from_file_name_then_file_order_with_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "k"
    kb.write(folder, "a.json", kb.trace(None))  # no rank anywhere: first in name order -> 0
    kb.write(folder, "b_rank-1.json", kb.trace(None))  # rank from the name -> 1
    trace = dtprof.load_trace(folder)
    assert sorted(trace.ranks["rank"]) == [0, 1]
    assert trace.meta[0].imported.rank_from == "file order"
    assert trace.meta[1].imported.rank_from == "file name"
    err = capsys.readouterr().err
    assert "without distributedInfo.rank" in err and "file name" in err and "file order" in err


def test_two_files_of_one_rank_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "k"
    kb.write(folder, "a.json", kb.trace(0))
    kb.write(folder, "b.json", kb.trace(0))
    assert main(["analyze", str(folder)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "b.json: rank 0 again (also a.json)" in err


@pytest.mark.parametrize(
    "name, content, says",
    [
        ("cut.json", b'{"traceEvents": [{"ph": "X", "ts": 1', "not valid JSON"),
        ("bad.json.gz", gzip.compress(b'{"traceEvents": []}')[:-9] + b"xxxxxxxxx", "gzip"),
        ("other.json", b'{"hello": 1}', "not a PyTorch profiler trace"),
        ("list.json", b"[1, 2, 3]", "not a PyTorch profiler trace"),
    ],
)
def test_bad_input_is_one_line_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, content: bytes, says: str
) -> None:
    folder = two_ranks(tmp_path / "k")
    (folder / name).write_bytes(content)
    for argv in (["analyze", str(folder)], ["convert", str(folder), "-o", str(tmp_path / "o")]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and str(folder / name) in err and says in err, err
    assert not (tmp_path / "o").exists()


def test_a_bad_event_is_named_by_its_place_in_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kineto_events, "CHUNK_EVENTS", 4)  # the bad event in the third chunk
    doc = kb.trace(0)
    doc["traceEvents"][9] = 7
    kb.write(tmp_path / "k", "rank0.json", doc)
    assert main(["analyze", str(tmp_path / "k")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "rank0.json: traceEvents holds something other" in err
    assert "at `$.traceEvents[9]`" in err, err


def test_decoding_in_chunks_changes_nothing_and_odd_fields_are_tolerated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = kb.trace(0, relative=True, float_offset_us=0.125, seq=True)
    doc["traceEvents"][10].update(args=[], pid="Spans")  # args that are no object: no args
    doc["traceEvents"][13]["name"] = 5  # a kernel's name that is no string: its text
    path = kb.write(tmp_path, "rank0.json", doc)
    whole = rank_tables(read_kineto(path, native=False))
    monkeypatch.setattr(kineto_events, "CHUNK_EVENTS", 3)
    chunked = rank_tables(read_kineto(path, native=False))
    assert all(whole[name].equals(chunked[name]) for name in whole)
    assert whole["kernels"]["name"].to_pylist()[3] == "5" and whole["collectives"].num_rows == 3
    assert whole["steps"]["start_ns"].to_pylist() == [125, 1_000_125, 2_000_125]


def test_a_step_without_a_category_is_a_step(tmp_path: Path) -> None:
    doc = kb.trace(0, steps=3)
    first = next(e for e in doc["traceEvents"] if str(e.get("name", "")).startswith("Profiler"))
    del first["cat"]
    tables = rank_tables(read_kineto(kb.write(tmp_path, "rank0.json", doc)))
    assert tables["steps"].num_rows == 3 and tables["spans"].num_rows == 0


def test_call_order_counts_each_groups_calls_as_groupby_does() -> None:
    import numpy as np
    import pandas as pd

    from dtprof.trace.kineto.mapping import _calls_before

    key = np.random.default_rng(2).integers(0, 7, 500)
    expected = pd.Series(key).groupby(key).cumcount().to_numpy()
    assert _calls_before(key).tolist() == expected.tolist()
    assert _calls_before(np.zeros(0, np.int64)).tolist() == []


def test_memory_samples_are_each_steps_last_reading_as_pandas_groups_them() -> None:
    """samples_table against its rule stated in pandas, on random readings (ties, NaNs, CPU and
    CUDA, readings before the first step, steps numbered in any order): per (step, device), the
    last reading that has the value, stamped with the group's last time; allocated rows first,
    each by step then device."""
    import numpy as np
    import pandas as pd

    from dtprof.trace.kineto.mapping import samples_table
    from dtprof.trace.steps import Steps, step_at

    rng = np.random.default_rng(7)
    for _ in range(200):
        n = int(rng.integers(1, 60))
        kf = type("KF", (), {})()
        kf.samples = None  # as the Python reader leaves them: worked out here
        kf.memory_ts_ns = rng.integers(0, 40, n).astype(np.int64) * 1000  # many ties
        kf.memory_device_type = rng.choice([0, 1, 1, 2], n).astype(np.int64)
        values = rng.random((2, n)) * 1e9
        values[rng.random((2, n)) < rng.random()] = np.nan
        kf.memory_allocated, kf.memory_reserved = values
        start = np.sort(rng.integers(0, 40_000, int(rng.integers(0, 5))))
        numbers = rng.permutation(len(start))  # numbered against their order too
        steps = Steps(numbers, start, start)  # the rule reads numbers and starts
        got = samples_table(kf, steps).to_pandas()
        df = pd.DataFrame(
            {
                "ts": kf.memory_ts_ns,
                "cuda": (kf.memory_device_type == 1).astype(int),
                "allocated_bytes": kf.memory_allocated,
                "reserved_bytes": kf.memory_reserved,
            }
        ).sort_values("ts", kind="stable")
        df["step"] = step_at(steps, df["ts"].to_numpy())
        groups = df.groupby(["step", "cuda"], sort=True)
        rows = []
        for what in ("allocated_bytes", "reserved_bytes"):
            for (step, cuda), g in groups:
                has = g[what].dropna()
                if len(has):
                    device = "cuda" if cuda else "cpu"
                    rows.append((step, g["ts"].iloc[-1], f"{device}_{what}", has.iloc[-1]))
        want = pd.DataFrame(rows, columns=["step", "ts_ns", "metric", "value"])
        assert got["step"].tolist() == want["step"].tolist()
        assert got["ts_ns"].tolist() == want["ts_ns"].tolist()
        assert got["metric"].tolist() == want["metric"].tolist()
        assert got["value"].tolist() == want["value"].tolist()


def _read_whole(monkeypatch: pytest.MonkeyPatch, path: Path) -> dict[str, Any]:
    """rank_tables of the file read whole, the way taken where streaming cannot cut it."""
    with monkeypatch.context() as m:
        m.setattr(kineto_events, "_stream", _unstreamable)
        kf = read_kineto(path, native=False)
    return {"file header": kf.header, "file events": kf.events, **rank_tables(kf)}


def _unstreamable(source: Any, header: dict[str, Any]) -> Any:
    raise kineto_events.Unstreamable("read whole")
    yield


@pytest.mark.parametrize("name", ["rank0.json", "rank0.json.gz"])
def test_streaming_a_buffer_at_a_time_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    doc = kb.trace(0, relative=True, seq=True, steps=6)
    doc["traceName"] = "after the events"  # keys after the list are read too
    doc["baseTimeNanoseconds"] = doc.pop("baseTimeNanoseconds")
    path = kb.write(tmp_path, name, doc)
    whole = _read_whole(monkeypatch, path)
    monkeypatch.setattr(kineto_events, "BUFFER_BYTES", 700)  # a few events per buffer
    chunks = list(kineto_events.stream(path, header := {}))
    assert len(chunks) > 5 and sum(map(len, chunks)) == len(doc["traceEvents"])
    assert header == whole["file header"] and header["baseTimeNanoseconds"] == kb.BASE_NS
    kf = read_kineto(path, native=False)
    streamed = {"file header": kf.header, "file events": kf.events, **rank_tables(kf)}
    assert streamed.keys() == whole.keys()
    for key, value in whole.items():
        same = value.equals(streamed[key]) if hasattr(value, "equals") else value == streamed[key]
        assert same, key


@pytest.mark.parametrize(
    "change",
    [
        "objects in a list over lines",
        "a separator inside a string",
        "one event longer than the buffer",
        "all on one line",
    ],
)
def test_what_streaming_cannot_cut_is_read_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    doc = kb.trace(0, seq=True)
    layout = "compact" if change in ("a separator inside a string", "all on one line") else ""
    if change == "objects in a list over lines":  # a cut between them would break the event
        doc["traceEvents"][12]["args"]["Extra"] = [{"a": 1}, {"b": 2}, {"c": 3}]
    elif change == "a separator inside a string":
        doc["traceEvents"][12]["args"]["Extra"] = ["}, {", "},{", "}, {"]
    elif change == "one event longer than the buffer":
        doc["traceEvents"][12]["args"]["Extra"] = "x" * 5000
    path = kb.write(tmp_path, "rank0.json", doc, layout=layout or "profiler")
    whole = _read_whole(monkeypatch, path)
    assert whole["file events"] == len(doc["traceEvents"])
    refused, sizes = 0, range(600, 7000, 71)
    for size in sizes:  # some buffer ends right after a cut inside the event
        monkeypatch.setattr(kineto_events, "BUFFER_BYTES", size)
        try:
            list(kineto_events.stream(path, {}))
        except kineto_events.Unstreamable:
            refused += 1
        kf = read_kineto(path, native=False)
        tables = rank_tables(kf)
        assert kf.events == whole["file events"] and kf.header == whole["file header"]
        assert all(tables[k].equals(whole[k]) for k in tables), size
    assert refused == 0 if change == "all on one line" else refused > 0


@pytest.mark.usefixtures("cache")
def test_a_warm_look_gives_the_report_of_the_cold_one(tmp_path: Path) -> None:
    folder = two_ranks(tmp_path / "k")
    cold = analyze(folder).to_json()  # converted into the cache and summarized meanwhile
    warm = analyze(folder).to_json()  # the cached conversion, read as a dtprof trace
    assert warm["summary"] == cold["summary"] and warm["findings"] == cold["findings"]


def test_cli_analyze_caches_and_convert_writes_a_dtprof_trace(
    tmp_path: Path, cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = two_ranks(tmp_path / "k", relative=True)
    out = tmp_path / "report.json"
    assert main(["analyze", str(folder), "--format", "json", "-o", str(out)]) == 0
    cold = json.loads(out.read_text())
    assert cached(folder) is not None and cached(folder).is_relative_to(cache)  # type: ignore[union-attr]
    assert main(["analyze", str(folder), "--format", "json", "-o", str(out)]) == 0
    warm = json.loads(out.read_text())
    assert warm["summary"] == cold["summary"] and warm["findings"] == cold["findings"]
    assert cold["trace"]["path"] == str(folder)

    converted = tmp_path / "converted"
    assert main(["convert", str(folder), "-o", str(converted)]) == 0
    assert trace_kind(converted) == "dtprof"
    assert analyze(converted).to_json()["summary"] == cold["summary"]
    parts = sorted(converted.glob("*/*/part-*.parquet"))  # lz4: quicker than zstd both ways
    codecs = {pq.ParquetFile(p).metadata.row_group(0).column(0).compression for p in parts}
    assert parts and codecs == {"LZ4"}
    for rank_dir in converted.glob("rank=*"):  # a folder only for each table with rows
        assert {p.parent.name for p in rank_dir.glob("*/part-*.parquet")} == {
            p.name for p in rank_dir.iterdir() if p.is_dir()
        }
    assert not (converted / "rank=00000" / "fingerprints").exists()
    assert dtprof.load_trace(converted).fingerprints.empty
    assert main(["convert", str(folder), "-o", str(converted)]) == 2  # not over a trace
    assert main(["analyze", str(folder)]) == 0
    text = capsys.readouterr().out
    assert "overlap %" in text and "HTA" in text


def test_nanoseconds_kept_where_hta_rounds_to_whole_microseconds(tmp_path: Path) -> None:
    """The deliberate difference: float stamps with sub-µs parts.

    Compute runs 100.4-100.9 µs into each step and NCCL 100.0-101.0: dtprof counts 0.5 of the
    1.0 µs as overlapped (50%); HTA rounds each start up and end down, so compute becomes
    101-100 (nothing) and NCCL 100-101, and reports 0%.
    """
    folder = tmp_path / "k"
    for rank in (0, 1):
        doc = kb.trace(rank, float_offset_us=0.25, compute_us=0.5, comm_start_us=100.0, comm_us=1.0)
        for e in doc["traceEvents"]:
            if e.get("cat") == "kernel" and e["name"].startswith("void gemm"):
                e["ts"] += 0.15  # 100.4 µs into the step
        kb.write(folder, f"r{rank}.json", doc)
    report = analyze(folder).to_json()
    assert report["summary"]["gpu"]["ranks"][0]["comm_overlap_pct"] == 50.0
    assert "rounds float timestamps inward" in report["summary"]["gpu"]["definitions"]


def _ranks_with(folder: Path, world: int, steps: int, **per_rank: dict[int, Any]) -> Path:
    for rank in range(world):
        kw = {k: v[rank] for k, v in per_rank.items() if rank in v}
        kb.write(folder, f"rank{rank}.json", kb.trace(rank, world=world, steps=steps, **kw))
    return folder


def test_straggler_hang_and_overlap_checks_run_on_imported_traces(tmp_path: Path) -> None:
    slow = {r: (5_500.0 if r == 2 else 4_000.0) for r in range(4)}
    folder = _ranks_with(
        tmp_path / "straggler", 4, 12, step_us={r: 10_000.0 for r in range(4)},
        compute_us=slow, comm_start_us={r: 100.0 + slow[r] for r in range(4)},
        comm_us={r: 5_600.0 - slow[r] + 200.0 for r in range(4)},
    )  # fmt: skip
    codes = {f.code: f for f in analyze(folder).findings}
    assert "straggler" in codes and codes["straggler"].ranks == [2]

    ops = {0: "allreduce", 1: "allgather"}
    folder = _ranks_with(tmp_path / "hang", 2, 3, op=ops, seq={0: True, 1: True})
    hang = [f for f in analyze(folder).findings if f.code == "hang"]
    assert hang and "all_gather" in hang[0].message
    # without "Seq" the importer counts calls; profiled windows may start apart: no verdict
    folder = _ranks_with(tmp_path / "counted", 2, 3, op=ops)
    assert [f for f in analyze(folder).findings if f.code == "hang"] == []

    exposed = _ranks_with(
        tmp_path / "exposed",
        2,
        12,
        comm_start_us={0: 500.0, 1: 500.0},
        comm_us={0: 450.0, 1: 450.0},
    )
    assert "poor-overlap" in {f.code for f in analyze(exposed).findings}


# ------------------------------------------------------------------ agreement with HTA


def _reference(name: str) -> Path:
    path = REFERENCE / name
    if not path.is_dir():
        pytest.skip(f"reference traces not here ({path})")
    return path


@pytest.mark.parametrize("name", ["hta_dlrm_8rank", "hta_sampled_2rank"])
def test_figures_agree_with_hta_on_the_reference_traces(name: str) -> None:
    folder = _reference(name)
    expected = json.loads((REFERENCE / "hta_figures.json").read_text())["sets"][name]
    ours = gpu_rows(folder)
    overlap = {r["rank"]: r["comp_comm_overlap_pctg"] for r in expected["comm_comp_overlap"]}
    assert sorted(ours) == sorted(overlap)
    for row in expected["temporal_breakdown"]:
        mine = ours[row["rank"]]
        assert abs(mine["comm_overlap_pct"] - overlap[row["rank"]]) <= TOLERANCE_POINTS
        for theirs, key in (
            ("idle_time_pctg", "idle_pct"),
            ("compute_time_pctg", "compute_pct"),
            ("non_compute_time_pctg", "non_compute_pct"),
        ):
            assert abs(mine[key] - row[theirs]) <= TOLERANCE_POINTS, (row["rank"], key)


@pytest.mark.parametrize("file", ["simple_add", "mtia_rank_0", "inference_rank_1"])
def test_traces_without_steps_get_the_gpu_figures_hta_gives_them(file: str) -> None:
    """No ProfilerStep#N (a one-op benchmark; an MTIA accelerator's trace, with one step; an
    inference trace in the older category names): the whole trace is the window."""
    folder = _reference("hta_unstepped")
    expected = json.loads((folder / "figures.json").read_text())["files"][f"{file}.json.gz"]
    mine = gpu_rows(folder / f"{file}.json.gz")[expected["rank"]]
    for theirs, key in (
        ("idle_time_pctg", "idle_pct"),
        ("compute_time_pctg", "compute_pct"),
        ("non_compute_time_pctg", "non_compute_pct"),
    ):
        assert abs(mine[key] - expected[theirs]) <= TOLERANCE_POINTS, (key, mine[key])


def test_v100_reference_matches_hta_050_run_here() -> None:
    """HTA 0.5.0 run here (benchmarks/vs_hta.py): 46.08 / 35.55 / 18.37 %, 0% overlap."""
    row = gpu_rows(_reference("hta_v100_allreduce_1rank"))[1]
    assert (row["idle_pct"], row["compute_pct"], row["non_compute_pct"]) == (46.08, 35.55, 18.37)
    assert row["comm_overlap_pct"] == 0.0


def test_profiler_traces_are_read_with_jemalloc_and_dtprof_traces_from_glibc_in_the_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import platform
    import subprocess
    import sys

    if sys.platform != "linux" or platform.machine() != "x86_64":
        pytest.skip("jemalloc is chosen on Linux x86-64 only")
    monkeypatch.delenv("ARROW_DEFAULT_MEMORY_POOL", raising=False)
    profiler = two_ranks(tmp_path / "k")
    (tmp_path / "t" / "rank=00000").mkdir(parents=True)
    probe = (
        "import os, sys; from dtprof.commands import own_process; "
        "own_process.OWN = sys.argv[2] == 'own'; "
        "own_process.choose_arrow_allocator(sys.argv[1]); "
        "assert 'pyarrow' not in sys.modules; print(os.environ.get('ARROW_DEFAULT_MEMORY_POOL'))"
    )
    chosen = {
        (name, own): subprocess.run(
            [sys.executable, "-c", probe, str(path), own],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        for name, path in [("profiler", profiler), ("dtprof", tmp_path / "t")]
        for own in ("own", "called")
    }
    assert chosen == {
        ("profiler", "own"): "jemalloc",
        ("profiler", "called"): "jemalloc",
        ("dtprof", "own"): "system",  # from glibc's heap, which the command keeps
        ("dtprof", "called"): "None",  # main() in a user's program: Arrow's own
    }


def test_import_workers_never_collect_garbage_they_inherit(tmp_path: Path) -> None:
    """Run in a process of its own: a worker that hangs is killed with it."""
    script = Path(__file__).parents[1] / "jobs" / "workers" / "import_with_garbage.py"
    proc = subprocess.Popen(
        [sys.executable, str(script), str(two_ranks(tmp_path / "k"))],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail("the import hung: a worker collected garbage it inherited")
    assert proc.returncode == 0, out
    assert out.strip().splitlines()[-1] == "[0, 1]", out


def test_union_and_intersection_sweeps_agree_with_counting_every_nanosecond() -> None:
    import numpy as np

    from dtprof.analysis.gpu import intersection_ns, union

    rng = np.random.default_rng(5)
    for _ in range(200):
        sets = []
        for _ in range(2):
            n = int(rng.integers(0, 12))
            start = rng.integers(0, 200, n)
            end = start + rng.integers(0, 30, n)  # empty, touching and nested ones too
            covered = np.zeros(260, bool)
            for s, e in zip(start, end, strict=True):
                covered[s:e] = True
            u = union(start.astype(np.int64), end.astype(np.int64))
            assert int((u[1] - u[0]).sum()) == covered.sum()
            assert (u[0][1:] > u[1][:-1]).all()  # disjoint, in order, touching ones merged
            sets.append((u, covered))
        (a, in_a), (b, in_b) = sets
        assert intersection_ns(a, b) == (in_a & in_b).sum() == intersection_ns(b, a)
