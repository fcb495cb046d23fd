"""slow-link: a group's bus bandwidth against its peers' (same op, size, strides and hosts)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dtprof.analysis import analyze, analyze_run
from dtprof.analysis.columns import values
from tests.tracebuild import rank_meta, write_rank

MS = 1_000_000
KIB = 1024


def tensor_parallel_trace(
    trace: Path,
    slow: str | None = None,
    slowdown: float = 4.0,
    hosts: tuple[str, ...] = ("a", "a", "b", "b"),
    steps: int = 30,
) -> Path:
    """4 ranks in 2-D, steps of 120 ms: tensor-parallel pairs {0, 1} (group 1) and {2, 3}
    (group 2), four synchronous 96 KiB all-reduces of 1 ms inside each 40 ms forward; then a
    38 ms backward; data-parallel pairs {0, 2} (group 3) and {1, 3} (group 4), a 1 MiB
    all-reduce of 10 ms after backward, at a tenth of the tensor-parallel bandwidth (another
    kind of link), from its later member's arrival. ``slow``: that group's calls take
    ``slowdown`` times as long, and its members' forward as much longer."""
    rng = np.random.default_rng(7)
    tp = {0: "1", 1: "1", 2: "2", 3: "2"}
    dp = {0: "3", 1: "4", 2: "3", 3: "4"}
    jitter = rng.uniform(0.9, 1.1, (steps, 5))  # per step and call, the same on both members
    slowed = np.array([slowdown if tp[r] == slow else 1.0 for r in range(4)])
    tp_ms = slowed[:, None, None] * jitter[None, :, :4]  # rank x step x call
    for rank in range(4):
        rows: dict[str, list[tuple]] = {"steps": [], "spans": [], "collectives": []}
        rows["groups"] = [("1", "gloo", [0, 1]), ("2", "gloo", [2, 3]),
                          ("3", "gloo", [0, 2]), ("4", "gloo", [1, 3])]  # fmt: skip
        for step in range(steps):
            t0 = step * 120 * MS
            rows["steps"].append((step, t0, t0 + 120 * MS))
            extra = [int((tp_ms[r, step].sum() - 4) * MS) for r in range(4)]  # forward's excess
            at = t0 + MS
            for k in range(4):
                start = at + (4 + 8 * k) * MS + int((tp_ms[rank, step, :k].sum() - k) * MS)
                rows["collectives"].append(
                    (step, tp[rank], 4 * step + k, "all_reduce", 96 * KIB, "float32", None,
                     start, start + int(tp_ms[rank, step, k] * MS), False, None)
                )  # fmt: skip
            fwd_end = at + 40 * MS + extra[rank]
            rows["spans"] += [
                (step, "forward", "phase", at, fwd_end, None, None, None),
                (step, "backward", "phase", fwd_end + MS, fwd_end + 39 * MS, None, None, None),
            ]
            took = 10 * MS * jitter[step, 4] * (slowdown if dp[rank] == slow else 1.0)
            mate = {0: 2, 2: 0, 1: 3, 3: 1}[rank]
            start = fwd_end + 40 * MS
            last = at + 80 * MS + max(extra[rank], extra[mate])
            rows["collectives"].append(
                (step, dp[rank], step, "all_reduce", 1024 * KIB, "float32", None, start,
                 last + int(took), True, "ddp.bucket0")
            )  # fmt: skip
        write_rank(trace, rank_meta(rank, 4, host=hosts[rank]), rows)
    return trace


def test_healthy_groups_of_two_kinds_of_link_are_never_held_against_each_other(
    tmp_path: Path,
) -> None:
    report = analyze(tensor_parallel_trace(tmp_path))
    assert not [f for f in report.findings if f.code == "slow-link"]


def test_the_slow_group_is_named_with_its_ranks_hosts_and_cost(tmp_path: Path) -> None:
    report = analyze(tensor_parallel_trace(tmp_path, slow="2"))
    (found,) = [f for f in report.findings if f.code == "slow-link"]
    assert found.ranks == [2, 3] and found.severity == "warning"
    assert "ranks 2, 3 on b" in found.message and "group 1" in found.message
    assert found.evidence["ratio"] == pytest.approx(0.25, rel=0.1)
    # each call 4 ms against 1 ms: 3 ms saved on each of 4 calls a step of 120 ms
    assert found.evidence["saved_ms_per_step"] == pytest.approx(12, rel=0.1)
    assert found.first_step == 3 and found.last_step == 29  # after the warm-up steps


def test_a_slow_data_parallel_pair_and_a_costly_one(tmp_path: Path) -> None:
    report = analyze(tensor_parallel_trace(tmp_path, slow="4", slowdown=5.0))
    (found,) = [f for f in report.findings if f.code == "slow-link"]
    assert found.ranks == [1, 3] and "its all_reduce calls of 1 MiB-16 MiB" in found.message
    # 50 ms against 10 ms a step of 120: a third of it
    assert found.severity == "error" and found.evidence["saved_ms_per_step"] == pytest.approx(
        40, rel=0.1
    )


def test_groups_across_a_different_number_of_hosts_are_not_peers(tmp_path: Path) -> None:
    # group 2 spans two hosts, group 1 one: an intra-node link against an inter-node one
    trace = tensor_parallel_trace(tmp_path, slow="2", hosts=("a", "a", "a", "b"))
    assert not [f for f in analyze(trace).findings if f.code == "slow-link"]


def test_a_rank_blocked_in_a_synchronous_collective_is_not_computing(tmp_path: Path) -> None:
    run, report = analyze_run(tensor_parallel_trace(tmp_path, slow="2"))
    compute = values(run.steps, "compute_ns", np.float64)
    rank = values(run.steps, "rank")
    # 40 + 38 ms of phases, less the four all-reduces inside the forward: 74 ms on every rank,
    # though the slow pair's forward lasts 12 ms longer
    for r in range(4):
        assert np.median(compute[rank == r]) / MS == pytest.approx(74, abs=1)
    assert not [f for f in report.findings if f.code == "straggler"]
