"""load_trace(): clock alignment, nullable columns, and one clear error per bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dtprof.errors import DtprofError
from dtprof.trace.follow import TraceFollower
from dtprof.trace.reader import load_trace
from dtprof.trace.schema import SCHEMA_VERSION
from tests.tracebuild import rank_meta, write_rank


def test_times_are_moved_onto_rank_zero_clock_with_drift(tmp_path: Path) -> None:
    # rank 1's wall clock runs 5 ms ahead at mono 0 and 7 ms ahead at mono 1e9 (2 ms drift)
    write_rank(
        tmp_path, rank_meta(0, 2, base=1_000_000_000_000), {"steps": [(0, 0, 1_000_000_000)]}
    )
    write_rank(
        tmp_path,
        rank_meta(
            1, 2, base=2_000_000_000_000, offset_ns=5_000_000, end=(1_000_000_000, 7_000_000)
        ),
        {"steps": [(0, 0, 1_000_000_000)]},
    )
    steps = load_trace(tmp_path).steps.set_index("rank")
    assert steps.loc[0, "start_ns"] == 1_000_000_000_000
    assert steps.loc[1, "start_ns"] == 2_000_000_000_000 - 5_000_000
    assert steps.loc[1, "end_ns"] == 2_000_000_000_000 + 1_000_000_000 - 7_000_000


def test_an_exit_estimate_within_the_error_bounds_is_noise_not_drift(tmp_path: Path) -> None:
    # start 5 ms +- 1 ms, end 5.5 ms +- 0.2 ms: the change is within the bounds, so no drift,
    # and the better (end) estimate holds for the whole run
    write_rank(tmp_path, rank_meta(0, 2), {"steps": [(0, 0, 10)]})
    meta = rank_meta(1, 2, offset_ns=5_000_000, end=(1_000_000_000, 5_500_000))
    meta["clock"]["start"]["error_ns"] = 1_000_000
    meta["clock"]["end"]["error_ns"] = 200_000
    write_rank(tmp_path, meta, {"steps": [(0, 0, 1_000_000_000)]})
    trace = load_trace(tmp_path)
    row = trace.steps.set_index("rank").loc[1]
    assert (row["start_ns"], row["end_ns"]) == (-5_500_000, 1_000_000_000 - 5_500_000)
    assert trace.ranks.set_index("rank").loc[1, "clock_drift_ppm"] == 0


def test_ranks_table_and_nullable_integer_columns(tmp_path: Path) -> None:
    for rank in (0, 1):
        write_rank(
            tmp_path,
            rank_meta(rank, 2, offset_ns=rank * 1000),
            {
                "collectives": [
                    (0, "0", 0, "all_reduce", 64, "float32", None, 10, 20, False, None),
                    (0, "0", 0, "send", 64, "float32", 1 - rank, 30, 40, False, None),
                ],
                "groups": [("0", "gloo", [0, 1])],
            },
        )
    trace = load_trace(tmp_path)
    assert trace.world_size == 2
    assert list(trace.ranks["clock_offset_ns"]) == [0, 1000]
    peers = trace.collectives["peer"]
    assert str(peers.dtype) == "Int32" and peers.isna().sum() == 2
    assert trace.groups.to_dict("records") == [{"group": "0", "backend": "gloo", "ranks": [0, 1]}]


def test_live_segments_are_read_like_sealed_parts(tmp_path: Path) -> None:
    write_rank(tmp_path, rank_meta(0, 1), {"steps": [(0, 0, 10), (1, 10, 20)]}, seal=False)
    assert list(load_trace(tmp_path).steps["step"]) == [0, 1]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: None, "no such directory"),
        (lambda p: p.mkdir(), "not a dtprof trace (no rank=NNNNN folders)"),
        (lambda p: (p.mkdir(), (p / "rank=00000").mkdir()), "meta.json: missing"),
        (
            lambda p: (
                p.mkdir(),
                (p / "rank=00000").mkdir(),
                (p / "rank=00000" / "meta.json").write_text("{not json"),
            ),
            "meta.json: not readable JSON",
        ),
        (lambda p: (p.mkdir(), (p / "rank=0x1").mkdir()), "rank folder name is not"),
        (lambda p: p.write_text("x"), "not a directory"),
    ],
)
def test_bad_input_is_one_error_naming_the_file(tmp_path: Path, make, message: str) -> None:
    path = tmp_path / "trace"
    make(path)
    with pytest.raises(DtprofError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_trace(path)


def test_meta_is_read_as_leniently_as_its_writers_ever_wrote_it(tmp_path: Path) -> None:
    """An older recorder's config without later fields, a clock without method, offsets as
    floats, no world_size: all read. A world_size that is there must be a number of ranks."""
    meta = rank_meta(0, 1, offset_ns=0, config={"fingerprint_every": 5})
    del meta["clock"]["method"], meta["world_size"]
    meta["clock"]["start"]["offset_ns"] = 1.5
    write_rank(tmp_path, meta, {"steps": [(0, 0, 10)]})
    read = load_trace(tmp_path).meta[0]
    assert (read.world_size, read.clock.method, read.clock.start.offset_ns) == (0, "none", 1.5)
    assert read.config is not None and read.config.fingerprint_every == 5
    assert read.config.seal_interval_s is None
    meta["world_size"] = 0
    write_rank(tmp_path, meta, {"steps": [(0, 0, 10)]})
    with pytest.raises(DtprofError, match=r"meta\.json: world_size: expected int >= 1"):
        load_trace(tmp_path)


def test_a_future_schema_version_asks_for_an_upgrade(tmp_path: Path) -> None:
    write_rank(tmp_path, rank_meta(0, 1, schema_version=SCHEMA_VERSION + 1), {})
    with pytest.raises(DtprofError, match=f"schema version {SCHEMA_VERSION + 1}.*upgrade"):
        load_trace(tmp_path)


def test_a_version_1_trace_reads_unless_a_segment_of_it_was_never_sealed(tmp_path: Path) -> None:
    write_rank(tmp_path, rank_meta(0, 1, schema_version=1), {"steps": [(0, 0, 10), (1, 10, 20)]})
    assert list(load_trace(tmp_path).steps["step"]) == [0, 1]
    stream = tmp_path / "rank=00000" / "steps" / "_live-000001.arrows"
    stream.write_bytes(b"\xff\xff\xff\xff")  # an Arrow IPC stream, left by a killed rank
    with pytest.raises(DtprofError) as err:
        load_trace(tmp_path)
    assert str(err.value).startswith(f"{stream}: an unsealed segment of trace schema version 1")
    with pytest.raises(DtprofError, match="schema version 1"):
        TraceFollower(tmp_path).poll()


def test_mixed_world_sizes_are_refused(tmp_path: Path) -> None:
    write_rank(tmp_path, rank_meta(0, 2), {})
    write_rank(tmp_path, rank_meta(1, 4), {})
    with pytest.raises(DtprofError, match=r"disagree on the world size \(\[2, 4\]\)"):
        load_trace(tmp_path)


def test_a_rank_folder_holding_another_ranks_meta_is_refused(tmp_path: Path) -> None:
    folder = write_rank(tmp_path, rank_meta(0, 2), {})
    meta = json.loads((folder / "meta.json").read_text())
    meta["rank"] = 1
    (folder / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(DtprofError, match="says rank 1 but the folder is rank 0"):
        load_trace(tmp_path)


def test_a_truncated_parquet_part_is_named(tmp_path: Path) -> None:
    folder = write_rank(tmp_path, rank_meta(0, 1), {"steps": [(0, 0, 10)]})
    part = folder / "steps" / "part-000000.parquet"
    part.write_bytes(part.read_bytes()[:30])
    with pytest.raises(DtprofError, match=r"part-000000.parquet: not a readable Parquet file"):
        load_trace(tmp_path)


def test_cli_prints_one_line_and_exits_2_on_bad_input(tmp_path: Path) -> None:
    before = sorted(tmp_path.iterdir())
    proc = subprocess.run(
        [sys.executable, "-m", "dtprof", "info", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"dtprof: error: {tmp_path / 'nope'}: no such directory"
    ]
    assert sorted(tmp_path.iterdir()) == before
