"""Collective bandwidth: nccl-tests' sizes and factors, time from the last arrival, bands, links."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dtprof.analysis import analyze
from dtprof.analysis.bandwidth import band_label, bandwidth_rows, bandwidth_summary, bus_factor
from dtprof.analysis.matching import ABSENT, GroupMatrix

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"
MIB = 1 << 20


def matrix(op: str, nbytes: float, starts: list[list[int]], ends: list[list[int]]) -> GroupMatrix:
    n = len(starts)
    size = len(starts[0])
    return GroupMatrix(
        group="0",
        size=size,
        ranks=np.arange(size),
        seq=np.arange(n),
        step=np.zeros(n, np.int64),
        start=np.array(starts, np.int64),
        end=np.array(ends, np.int64),
        op=np.array([op] * n, object),
        nbytes=np.full(n, nbytes),
        agree=np.ones(n, bool),
    )


def test_the_factors_nccl_tests_gives_each_op() -> None:
    assert bus_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    for op in ("all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single", "gather"):
        assert bus_factor(op, 4) == pytest.approx(3 / 4), op
    assert bus_factor("broadcast", 4) == bus_factor("reduce", 4) == 1.0
    assert bus_factor("barrier", 4) is None


def test_time_runs_from_the_last_arrival_and_all_gather_counts_its_output() -> None:
    # 4 ranks; rank 3 arrives 5 ms late; every call ends 2 ms after it arrives: t = 2 ms
    starts = [[0, 0, 0, 5_000_000]] * 3
    ends = [[7_000_000] * 4] * 3
    (row,) = bandwidth_rows([matrix("all_reduce", 4 * MIB, starts, ends)])
    assert row["time_ms"] == pytest.approx(2.0)
    assert row["algbw_gbs"] == pytest.approx(4 * MIB / 2e6)  # bytes per ns = GB/s
    assert row["busbw_gbs"] == pytest.approx(row["algbw_gbs"] * 1.5)
    assert (row["calls"], row["band"], row["total_ms"]) == (3, "1 MiB-16 MiB", pytest.approx(6.0))
    (gathered,) = bandwidth_rows([matrix("all_gather_into_tensor", MIB, starts, ends)])
    assert gathered["bytes"] == 4 * MIB  # the output: the input times the group
    assert gathered["busbw_gbs"] == pytest.approx(4 * MIB / 2e6 * 0.75)


def test_calls_a_member_missed_or_disagreed_on_are_not_measured() -> None:
    gm = matrix("all_reduce", MIB, [[0, 0]] * 3, [[1000, 1000]] * 3)
    gm.start[0, 1] = gm.end[0, 1] = ABSENT
    gm.agree[1] = False
    (row,) = bandwidth_rows([gm])
    assert row["calls"] == 1


def test_a_group_of_one_rank_moves_no_data_and_has_no_row() -> None:
    """A world of one (a single-GPU DDP job): its all-reduces copy nothing between ranks."""
    assert bandwidth_rows([matrix("all_reduce", 64 * MIB, [[0]] * 3, [[10_000]] * 3)]) == []


def test_bands_and_the_link_share() -> None:
    assert band_label(0) == "< 64 KiB" and band_label(1) == "64 KiB-1 MiB"
    assert band_label(3) == "16 MiB-256 MiB"
    gm = matrix("broadcast", 1e9, [[0, 0]], [[1_000_000, 1_000_000]])  # 1 GB in 1 ms
    block = bandwidth_summary([gm], link="ib-ndr")["bandwidth"]
    (row,) = block["rows"]
    assert row["busbw_gbs"] == pytest.approx(1000.0)
    assert row["of_link_pct"] == pytest.approx(100 * 1000 * 8 / 400)
    assert block["link"] == {"gbps": 400, "what": "InfiniBand NDR, one port: 400 Gb/s"}
    assert bandwidth_summary([gm], link="800")["bandwidth"]["rows"][0]["of_link_pct"] == 1000.0
    assert bandwidth_summary([]) == {}


def test_a_recorded_ddp_run_has_its_all_reduce_bandwidth() -> None:
    report = analyze(SAMPLES / "healthy-ddp", link_gbps="eth100").to_json()
    rows = report["summary"]["bandwidth"]["rows"]
    assert {r["op"] for r in rows} == {"all_reduce"} and all(r["ranks"] == 4 for r in rows)
    assert all(r["busbw_gbs"] > 0 and r["of_link_pct"] > 0 for r in rows)
    assert sum(r["calls"] for r in rows) > 100


def test_a_bad_link_is_one_line_naming_it(tmp_path: Path) -> None:
    for bad in ("fast", "0", "-3", "nan"):
        done = subprocess.run(
            [sys.executable, "-m", "dtprof", "analyze", str(SAMPLES / "healthy-ddp"),
             "--link-gbps", bad],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 2, bad
        assert "--link-gbps" in done.stderr and bad in done.stderr
        assert "Traceback" not in done.stderr
    done = subprocess.run(
        [sys.executable, "-m", "dtprof", "analyze", str(SAMPLES / "healthy-ddp"), "--format",
         "json", "--link-gbps", "nvlink4"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert json.loads(done.stdout)["summary"]["bandwidth"]["link"]["gbps"] == 3600


def test_point_to_point_transfers_are_rows_per_direction_of_each_pair() -> None:
    import dtprof

    trace = SAMPLES / "pipeline-1f1b"
    rows = analyze(trace).to_json()["summary"]["bandwidth"]["rows"]
    p2p = {r["group"]: r for r in rows if r["op"] == "p2p"}
    # four stages in a line: each neighbour pair, both ways
    assert set(p2p) == {"0 0->1", "0 1->0", "0 1->2", "0 2->1", "0 2->3", "0 3->2"}
    sends = dtprof.load_trace(trace).collectives
    sends = sends[sends["op"].isin(["send", "isend"])]
    counted = sends.groupby(["rank", "peer"]).size()
    for (src, dst), n in counted.items():
        row = p2p[f"0 {src}->{int(dst)}"]
        assert row["calls"] == n and row["ranks"] == 2  # every send met its receive
        assert row["busbw_gbs"] == row["algbw_gbs"] > 0  # the factor is 1
