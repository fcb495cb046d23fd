"""dtprof analyze: the straggler check on inline traces and samples, reports, CLI exit codes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from dtprof.analysis import analyze
from dtprof.analysis.render import markdown, text
from tests.tracebuild import rank_meta, write_rank

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"
MS = 1_000_000


def _ddp_like(trace: Path, compute_ms: dict[int, float], steps: int = 12) -> None:
    """Ranks that compute, then all-reduce together: the slowest arrives last, waits least."""
    _ddp_steps(trace, len(compute_ms), steps, lambda rank, step: compute_ms[rank])


def _ddp_steps(
    trace: Path,
    world: int,
    steps: int,
    compute: Callable[[int, int], float],
    groups: list[list[int]] | None = None,
    data: Callable[[int, int], float] = lambda rank, step: 0.0,
) -> None:
    """Like _ddp_like with compute ms per (rank, step), each group all-reducing on its own;
    ``data`` ms per (rank, step) of input loading come before the compute."""
    groups = groups or [list(range(world))]
    group_of = {r: (str(i), members) for i, members in enumerate(groups) for r in members}

    def busy(rank: int, step: int) -> float:
        return data(rank, step) + compute(rank, step)

    step_ms = [max(busy(r, step) for r in range(world)) + 2 for step in range(steps)]
    starts = [sum(step_ms[:step]) for step in range(steps)]
    for rank in range(world):
        name, members = group_of[rank]
        rows: dict[str, list[tuple]] = {"steps": [], "spans": [], "collectives": []}
        rows["groups"] = [(name, "gloo", members)]
        for step in range(steps):
            t0 = int(starts[step] * MS)
            own, fed = compute(rank, step), t0 + int(data(rank, step) * MS)
            fwd_end = fed + int(own / 3 * MS)
            bwd_end = fed + int(own * MS)
            rows["steps"].append((step, t0, t0 + int(step_ms[step] * MS)))
            rows["spans"] += [
                (step, "data", "phase", t0, fed, 0, None, None),
                (step, "forward", "phase", fed, fwd_end, 0, None, None),
                (step, "backward", "phase", fwd_end, bwd_end, 0, None, None),
            ]
            # done when the group's last member arrived, plus the transfer
            done = t0 + int((max(busy(r, step) for r in members) + 1) * MS)
            rows["collectives"].append(
                (
                    step,
                    name,
                    step,
                    "all_reduce",
                    4096,
                    "float32",
                    None,
                    bwd_end,
                    done,
                    True,
                    "ddp.bucket0",
                )
            )
        write_rank(trace, rank_meta(rank, world), rows)


def test_the_culprit_is_the_last_arriver_with_the_shortest_collectives(tmp_path: Path) -> None:
    _ddp_like(tmp_path, {0: 20.0, 1: 26.0, 2: 20.0})
    report = analyze(tmp_path)
    (finding,) = report.findings
    assert (finding.code, finding.ranks, finding.severity) == ("straggler", [1], "error")
    ev = finding.evidence
    assert ev["slowdown"] == pytest.approx(1.3, rel=1e-3)
    assert ev["chronic"] is True and ev["last_arrival_share"] == 1.0
    # ranks 0 and 2 waited 6 ms at each analysed all-reduce (steps 2-11)
    assert ev["wait_caused_s"] == pytest.approx(10 * 2 * 0.006, rel=1e-6)
    # fixed, rank 1 would compute 20 ms: steps of 28 ms would take 22
    assert ev["speedup_if_fixed"] == pytest.approx(28 / 22, rel=1e-3)
    assert (finding.first_step, finding.last_step) == (2, 11)


def test_a_nan_born_in_one_loss_is_blamed_on_that_rank_not_on_all(tmp_path: Path) -> None:
    nan = float("nan")
    for rank in range(3):
        loss = [(s, "loss", 1.0) for s in range(5)] + [(5, "loss", nan if rank == 2 else 0.9)]
        prints = [(s, "w", 1.0, 2.0) for s in range(5)] + [(5, "w", nan, nan)]  # all ranks
        write_rank(
            tmp_path,
            rank_meta(rank, 3, model_kind="ddp"),
            {"scalars": loss, "fingerprints": prints},
        )
    (finding,) = analyze(tmp_path).findings
    assert (finding.code, finding.ranks, finding.first_step) == ("non-finite", [2], 5)
    assert finding.evidence["ranks_affected"] == [0, 1, 2]


def test_one_drifting_replica_is_named_and_persistence_judged(tmp_path: Path) -> None:
    for rank in range(4):
        prints = [(s, "w", 1.0 + (1e-9 if rank == 3 and s >= 4 else 0), 2.0) for s in range(10)]
        write_rank(tmp_path, rank_meta(rank, 4, model_kind="ddp"), {"fingerprints": prints})
    (finding,) = analyze(tmp_path).findings
    assert (finding.code, finding.ranks, finding.first_step) == ("replica-divergence", [3], 4)
    assert finding.evidence["persistent"] is True


def test_fsdp_shards_differ_by_design(tmp_path: Path) -> None:
    for rank in range(2):
        write_rank(
            tmp_path,
            rank_meta(rank, 2, model_kind="fsdp2"),
            {"fingerprints": [(s, "w", float(rank), 2.0) for s in range(4)]},
        )
    assert analyze(tmp_path).findings == []


def test_a_rank_killed_early_is_reported(tmp_path: Path) -> None:
    for rank in range(2):
        n = 4 if rank == 1 else 10
        status = "running" if rank == 1 else "finished"
        write_rank(
            tmp_path,
            rank_meta(rank, 2, status=status),
            {"steps": [(s, s * MS, (s + 1) * MS) for s in range(n)]},
        )
    (finding,) = analyze(tmp_path).findings
    assert (finding.code, finding.ranks) == ("rank-stopped", [1])
    assert finding.evidence == {
        "last_step": 3,
        "alive_until_step": 3,
        "furthest_step": 9,
        "status": "running",
        "exception": None,
    }


def test_a_rank_killed_with_its_last_steps_unwritten_is_still_the_cause(tmp_path: Path) -> None:
    # rank 1 was killed before it flushed its last steps; rank 0 raised from the all-reduce
    # that failed without it, at the same step: only the statuses tell who stopped first
    for rank in range(2):
        done = [
            (s, "0", s, "all_reduce", 64, "float32", None, s * MS, s * MS + 10, False, None)
            for s in range(10)
        ]
        if rank == 0:
            failed = (10, "0", 10, "all_reduce", 64, "float32", None, 10 * MS, 11 * MS, False)
            done.append((*failed, "error"))  # a plain all-reduce: "error" is its whole label
        status = "raised RuntimeError" if rank == 0 else "running"
        write_rank(
            tmp_path,
            rank_meta(rank, 2, status=status),
            {"steps": [(s, s * MS, (s + 1) * MS) for s in range(10)], "collectives": done},
        )
    killed, follower = [f for f in analyze(tmp_path).findings if f.code == "rank-stopped"]
    assert (killed.ranks, killed.severity, killed.first_step, killed.last_step) == (
        [1],
        "error",
        10,
        10,
    )
    assert killed.evidence == {
        "last_step": 9,
        "alive_until_step": 9,
        "furthest_step": 9,
        "status": "running",
        "exception": None,
    }
    assert (follower.ranks, follower.severity, follower.evidence["after"]) == ([0], "warning", [1])


def _data_phases(trace: Path, steps: int, stalls: dict[int, float]) -> None:
    """3 ranks, 30 ms steps, 0.2 ms data phases; rank 0's data phase lasts stalls[step] ms."""
    for rank in range(3):
        rows: dict[str, list[tuple]] = {"steps": [], "spans": []}
        for step in range(steps):
            t0 = step * 30 * MS
            data = int(stalls.get(step, 0.2) * MS) if rank == 0 else MS // 5
            rows["steps"].append((step, t0, t0 + 30 * MS))
            rows["spans"] += [
                (step, "data", "phase", t0, t0 + data, 0, None, None),
                (step, "forward", "phase", t0 + data, t0 + 20 * MS, 0, None, None),
            ]
        write_rank(trace, rank_meta(rank, 3), rows)


def test_periodic_slow_batches_on_one_rank_are_a_data_stall(tmp_path: Path) -> None:
    _data_phases(tmp_path, 12, {2: 12, 5: 12, 8: 12, 11: 12})
    (finding,) = analyze(tmp_path).findings
    assert (finding.code, finding.ranks, finding.first_step) == ("data-stall", [0], 2)
    assert finding.evidence["stall_steps"] == [2, 5, 8, 11]
    assert finding.evidence["period_steps"] == 3


def test_two_short_hiccups_costing_under_one_percent_are_no_data_stall(tmp_path: Path) -> None:
    _data_phases(tmp_path, 24, {7: 3.2, 15: 3.2})  # past the per-step bar, 0.8% of the time
    assert analyze(tmp_path).findings == []


@pytest.mark.parametrize(("inside_backward", "found"), [(True, []), (False, ["poor-overlap"])])
def test_communication_after_backward_is_exposed(
    tmp_path: Path, inside_backward: bool, found: list[str]
) -> None:
    for rank in range(2):
        rows: dict[str, list[tuple]] = {"steps": [], "spans": [], "collectives": []}
        for step in range(12):
            t0 = step * 40 * MS
            rows["steps"].append((step, t0, t0 + 40 * MS))
            rows["spans"].append((step, "backward", "phase", t0, t0 + 25 * MS, 0, None, None))
            start = t0 + (10 if inside_backward else 26) * MS
            rows["collectives"].append(
                (
                    step,
                    "0",
                    step,
                    "all_reduce",
                    64,
                    "float32",
                    None,
                    start,
                    start + 12 * MS,
                    True,
                    None,
                )
            )
        write_rank(tmp_path, rank_meta(rank, 2), rows)
    report = analyze(tmp_path)
    assert [f.code for f in report.findings] == found
    if found:
        ev = report.findings[0].evidence
        assert ev["overlap_fraction"] == 0.0
        assert ev["exposed_comm_fraction"] == pytest.approx(12 / 40)


def test_exposure_a_straggler_causes_on_the_others_is_no_poor_overlap(tmp_path: Path) -> None:
    """Rank 2's backward takes 40 ms where the others' takes 20: each bucket's 8 ms transfer
    starts when rank 2 enters it, during rank 2's backward but mostly after the others' has
    ended. Exposed 27% of the step on ranks 0 and 1, 12% on the critical path (rank 2): a
    straggler, not a job that cannot overlap."""
    for rank in range(3):
        rows: dict[str, list[tuple]] = {"steps": [], "spans": [], "collectives": []}
        backward = 40 if rank == 2 else 20
        for step in range(12):
            t0 = step * 60 * MS
            rows["steps"].append((step, t0, t0 + 60 * MS))
            rows["spans"].append((step, "forward", "phase", t0, t0 + 5 * MS, 0, None, None))
            rows["spans"].append(
                (step, "backward", "phase", t0 + 5 * MS, t0 + (5 + backward) * MS, 0, None, None)
            )
            for bucket in range(3):  # rank 2 enters at 17, 30 and 44 ms into the step
                own = t0 + (5 + (bucket + 1) * backward // 3 - 1) * MS
                last = t0 + (5 + (bucket + 1) * 40 // 3 - 1) * MS
                row = (step, "0", 3 * step + bucket, "all_reduce", 64, "float32", None)
                rows["collectives"].append((*row, own, last + 8 * MS, True, f"ddp.bucket{bucket}"))
        write_rank(tmp_path, rank_meta(rank, 3), rows)
    from dtprof.analysis import overlap
    from dtprof.analysis.arrivals import last_arrival_shares
    from dtprof.analysis.columns import values
    from dtprof.analysis.summarize import combine, summarize_rank
    from dtprof.trace.reader import find_rank_dirs

    run = combine([summarize_rank(d) for _, d in find_rank_dirs(tmp_path)])
    skip = 2
    phases = run.phases.filter(values(run.phases, "step") >= skip)
    per = overlap.comm_overlap(run, skip, phases)
    step_ns = 10 * 60 * MS
    exposed = {rank: round((comm - under) / step_ns, 3) for rank, (comm, under) in per.items()}
    assert exposed == {0: 0.267, 1: 0.267, 2: 0.117}
    assert last_arrival_shares(run, skip) == {0: 0.0, 1: 0.0, 2: 1.0}
    codes = [f.code for f in analyze(tmp_path).findings]
    assert "poor-overlap" not in codes and "straggler" in codes


def test_bubble_theory_per_schedule() -> None:
    from dtprof.analysis.pipeline import schedule_bubble as theory

    assert theory("ScheduleGPipe", 4, 4, 1) == pytest.approx(3 / 7)
    assert theory("Schedule1F1B", 4, 8, 1) == pytest.approx(3 / 11)
    assert theory("ScheduleInterleaved1F1B", 8, 8, 2) == pytest.approx(3 / 19)
    assert theory("ScheduleInterleavedZeroBubble", 8, 8, 2) == pytest.approx(1 / 19)
    assert theory("ScheduleGPipe", 1, 4, 1) == 0.0


@pytest.mark.skipif(not SAMPLES.exists(), reason="no sample traces")
def test_gpipe_bubble_is_measured_against_theory_and_split() -> None:
    (finding,) = analyze(SAMPLES / "pipeline-gpipe").findings
    ev = finding.evidence
    assert ev["theoretical_bubble_fraction"] == pytest.approx(3 / 7, abs=1e-4)
    assert ev["theoretical_bubble_fraction"] <= ev["bubble_fraction"] < 0.6
    assert sum(ev["idle_split"].values()) == pytest.approx(1.0, abs=1e-3)
    assert ev["suggested_bubble_fraction"] < ev["theoretical_bubble_fraction"]


def test_a_loss_spike_is_found_against_its_own_history(tmp_path: Path) -> None:
    for rank in range(2):
        loss = [(s, "loss", 2.0 - 0.01 * s + 0.02 * (s % 3)) for s in range(40)]
        if rank == 1:
            loss[30] = (30, "loss", 9.0)
        write_rank(tmp_path, rank_meta(rank, 2), {"scalars": loss})
    (finding,) = analyze(tmp_path).findings
    assert (finding.code, finding.ranks, finding.first_step) == ("loss-spike", [1], 30)
    assert finding.evidence["spikes"][0]["value"] == 9.0


GIB = 2**30


@pytest.mark.parametrize(("leak", "found"), [(True, ["memory-growth"]), (False, [])])
def test_memory_that_keeps_growing_is_flagged_a_plateau_is_not(
    tmp_path: Path, leak: bool, found: list[str]
) -> None:
    for rank in range(2):
        rss = []
        for s in range(40):
            grown = 0.05 * s if leak and rank == 0 else 0.05 * min(s, 5)  # plateau after 5
            rss.append((s, s * MS, "rss_bytes", (1 + grown) * GIB))
        write_rank(tmp_path, rank_meta(rank, 2), {"samples": rss})
    report = analyze(tmp_path)
    assert [f.code for f in report.findings] == found
    if found:
        assert report.findings[0].ranks == [0]
        assert report.findings[0].evidence["metric"] == "rss_bytes"


def test_memory_read_every_few_steps_is_counted_in_steps(tmp_path: Path) -> None:
    """A fast job's memory is read every few steps (at most every 50 ms): the finding counts
    the steps the growth spans, and its rate is per step, not per reading."""
    for rank in range(2):
        rss = []
        for s in range(0, 80, 4):  # step 0, 4, ..., 76: 20 readings over 80 steps
            grown = 0.01 * s if rank == 0 else 0.0
            rss.append((s, s * MS + MS // 2, "rss_bytes", (1 + grown) * GIB))
        steps = [(s, s * MS, s * MS + MS // 2) for s in range(80)]
        write_rank(tmp_path, rank_meta(rank, 2), {"samples": rss, "steps": steps})
    (finding,) = analyze(tmp_path).findings
    assert finding.code == "memory-growth" and finding.ranks == [0]
    # after the warm-up (the first 10% of the 80 steps), from the reading of step 8 to 76
    assert "over 69 steps" in finding.message
    assert finding.evidence["bytes_per_step"] == {0: pytest.approx(0.01 * GIB, rel=1e-6)}


def _in_flight(group: str, seq: int) -> dict[str, object]:
    """One inflight.json row: an all-reduce of step ``seq`` entered at (seq + 1) ms."""
    return {
        "step": seq,
        "group": group,
        "seq": seq,
        "op": "all_reduce",
        "bytes": 64,
        "dtype": "float32",
        "peer": None,
        "start_ns": (seq + 1) * MS,
        "async_op": False,
        "label": None,
    }


def test_a_collective_one_rank_never_entered_is_a_hang(tmp_path: Path) -> None:
    import json as _json

    for rank in range(3):
        done = [
            (s, "0", s, "all_reduce", 64, "float32", None, s * MS, s * MS + 10, False, None)
            for s in range(4)
        ]
        spans = [(3, "eval", "region", 3 * MS, 4 * MS, 0, None, None)]
        folder = write_rank(
            tmp_path, rank_meta(rank, 3, status="running"), {"collectives": done, "spans": spans}
        )
        stuck = [_in_flight("0", 4)] if rank != 2 else []
        (folder / "inflight.json").write_text(_json.dumps(stuck))
    (finding,) = [f for f in analyze(tmp_path).findings if f.code == "hang"]
    assert finding.ranks == [2]
    ev = finding.evidence
    assert (ev["op"], ev["seq"], ev["joined"], ev["missing"]) == ("all_reduce", 4, [0, 1], [2])
    assert ev["last_activity"] == {2: "region eval at step 3"}


def _stuck_world(
    trace: Path, ranks: list[int], world: int, group: tuple[str, list[int]], stuck: set[int]
) -> None:
    """Ranks that completed seq 0-3 of ``group``; those in ``stuck`` are in flight in seq 4."""
    name, members = group
    for rank in ranks:
        done = [
            (s, name, s, "all_reduce", 64, "float32", None, s * MS, s * MS + 10, False, None)
            for s in range(4)
            if rank in members
        ]
        tables = {
            "collectives": done,
            "steps": [(s, s * MS, (s + 1) * MS) for s in range(5)],
            "groups": [("0", "gloo", list(range(world)))]
            + ([(name, "gloo", members)] if rank in members and name != "0" else []),
        }
        meta = rank_meta(rank, world, status="running")
        folder = write_rank(trace, meta, tables)  # type: ignore[arg-type]
        inflight = [_in_flight(name, 4)] if rank in stuck else []
        (folder / "inflight.json").write_text(json.dumps(inflight))


def test_ranks_that_wrote_no_trace_are_named_and_awaited(tmp_path: Path) -> None:
    _stuck_world(tmp_path, [0, 1, 3], 4, ("0", [0, 1, 2, 3]), stuck={0, 1, 3})
    report = analyze(tmp_path)
    assert report.trace["ranks_without_trace"] == [2]
    (gone,) = [f for f in report.findings if f.code == "rank-stopped" and f.first_step is None]
    assert (gone.ranks, gone.severity) == ([2], "error") and "of 4 wrote no trace" in gone.message
    (hang,) = [f for f in report.findings if f.code == "hang"]
    assert hang.ranks == [2] and hang.evidence["joined"] == [0, 1, 3]
    assert hang.evidence["last_activity"] == {2: "nothing: it wrote no trace"}
    chosen = analyze(tmp_path, ranks=[0, 1])  # a rank not asked for is not looked for
    assert chosen.trace["ranks_without_trace"] == []
    assert not [f for f in chosen.findings if f.code == "rank-stopped" and f.first_step is None]


def test_a_subgroup_hang_names_its_own_members_only(tmp_path: Path) -> None:
    _stuck_world(tmp_path, [0, 1, 2, 3], 4, ("1", [0, 1]), stuck={0})
    (hang,) = [f for f in analyze(tmp_path).findings if f.code == "hang"]
    assert (hang.ranks, hang.evidence["group"], hang.evidence["joined"]) == ([1], "1", [0])


def test_ranks_calling_different_collectives_is_a_hang(tmp_path: Path) -> None:
    for rank in range(3):
        op, size = ("broadcast", 64) if rank == 1 else ("all_reduce", 64)
        write_rank(
            tmp_path,
            rank_meta(rank, 3),
            {"collectives": [(0, "0", 0, op, size, "float32", None, 0, 10, False, None)]},
        )
    (finding,) = analyze(tmp_path).findings
    assert (finding.code, finding.ranks) == ("hang", [1])
    assert finding.evidence["calls"][1] == "broadcast of 64 bytes"


def test_a_rank_within_jitter_is_no_straggler(tmp_path: Path) -> None:
    _ddp_like(tmp_path, {0: 20.0, 1: 20.8, 2: 20.0, 3: 20.4})
    assert analyze(tmp_path).findings == []


def test_a_transient_straggler_is_reported_for_its_window_only(tmp_path: Path) -> None:
    def compute(rank: int, step: int) -> float:
        return 28.0 if rank == 2 and 20 <= step < 30 else 20.0 + 0.1 * ((rank + step) % 3)

    _ddp_steps(tmp_path, 4, 40, compute)
    (finding,) = analyze(tmp_path).findings
    assert (finding.code, finding.ranks, finding.severity) == ("straggler", [2], "warning")
    assert (finding.first_step, finding.last_step) == (20, 29)
    ev = finding.evidence
    assert ev["chronic"] is False and ev["slowdown"] == pytest.approx(1.4, rel=0.02)
    # 10 steps x 3 ranks waiting ~8 ms each; those steps ~1.3x faster at the median
    assert ev["wait_caused_s"] == pytest.approx(10 * 3 * 0.008, rel=0.05)
    assert 1.2 < ev["speedup_if_fixed"] < 1.45


def test_a_short_blip_is_no_straggler(tmp_path: Path) -> None:
    _ddp_steps(tmp_path, 4, 40, lambda r, s: 28.0 if r == 2 and 20 <= s < 23 else 20.0)
    assert analyze(tmp_path).findings == []


def test_stragglers_are_found_inside_subgroups(tmp_path: Path) -> None:
    # two data-parallel groups of two; rank 3 holds up only its own group
    _ddp_steps(tmp_path, 4, 20, lambda r, s: 27.0 if r == 3 else 20.0, groups=[[0, 1], [2, 3]])
    (finding,) = analyze(tmp_path).findings
    assert (finding.code, finding.ranks) == ("straggler", [3])
    assert finding.evidence["chronic"] is True
    # only rank 2 waited for it: 7 ms in each of the 18 analysed steps
    assert finding.evidence["wait_caused_s"] == pytest.approx(18 * 0.007, rel=0.05)


def test_slow_loading_shows_progress_on_stderr(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import dtprof.analysis
    import dtprof.parallel

    analyze(SAMPLES / "healthy-ddp", progress=True)
    assert capsys.readouterr().err == ""  # quick: nothing
    monkeypatch.setattr(dtprof.analysis, "PROGRESS_AFTER_S", -1.0)
    monkeypatch.setattr(dtprof.parallel, "PROGRESS_AFTER_S", -1.0)
    analyze(SAMPLES / "healthy-ddp", progress=True)
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "dtprof: read 4/4 ranks"
    assert re.fullmatch(
        r"dtprof: read 4 ranks in \d+\.\d s, combined and checked them in \d+\.\d s", err[1]
    )


def test_a_window_inside_the_warm_up_gives_no_pipeline_finding() -> None:
    # every step of the window is skipped as warm-up: nothing to measure, and no error
    assert analyze(SAMPLES / "pipeline-gpipe", steps=(0, 2)).findings == []


def test_vectorized_overlap_equals_the_per_rank_sweep(tmp_path: Path) -> None:
    from dtprof.analysis import overlap
    from dtprof.analysis.columns import values
    from dtprof.analysis.summarize import combine, summarize_rank
    from dtprof.trace.reader import find_rank_dirs

    # ranks 0-3 all-reduce on the world group, ranks 2 and 3 also on a pair group: ranks 0 and
    # 1 take the vectorized path, 2 and 3 (in two groups) the sweep
    for rank in range(4):
        rows: dict[str, list[tuple]] = {"steps": [], "spans": [], "collectives": []}
        rows["groups"] = [("0", "gloo", [0, 1, 2, 3])] + (
            [("1", "gloo", [2, 3])] if rank >= 2 else []
        )
        for step in range(12):
            t0 = step * 40 * MS
            rows["steps"].append((step, t0, t0 + 40 * MS))
            rows["spans"] += [
                (step, "forward", "phase", t0, t0 + (10 + rank) * MS, 0, None, None),
                (step, "backward", "phase", t0 + 12 * MS, t0 + 30 * MS, 0, None, None),
            ]
            enter, done = t0 + (14 + rank) * MS, t0 + 34 * MS
            rows["collectives"].append(
                (step, "0", step, "all_reduce", 64, "float32", None, enter, done, True, None)
            )
            if rank >= 2:
                rows["collectives"].append(
                    (step, "1", step, "all_reduce", 64, "float32", None, enter - 9 * MS,
                     enter - 2 * MS, True, None)
                )  # fmt: skip
        write_rank(tmp_path, rank_meta(rank, 4), rows)
    run = combine([summarize_rank(d) for _, d in find_rank_dirs(tmp_path)])
    compute = run.phases.filter(values(run.phases, "step") >= 2)
    fast = overlap.comm_overlap(run, 2, compute)
    sweep = overlap.overlap_per_rank(overlap.transfer_intervals(run, 2), compute)
    assert fast == sweep and sorted(fast) == [0, 1, 2, 3]
    assert all(0 < overlap < comm for comm, overlap in fast.values())
    # rows in any order: the spans are sorted by rank and start where they are not already
    shuffled = compute.take(np.random.default_rng(3).permutation(compute.num_rows))
    assert (np.diff(values(shuffled, "rank")) < 0).any()
    merged, again = overlap.merged_compute(compute), overlap.merged_compute(shuffled)
    assert merged.keys() == again.keys()
    for rank, arrays in merged.items():
        assert all(np.array_equal(a, b) for a, b in zip(arrays, again[rank], strict=True))
    assert overlap.comm_overlap(run, 2, shuffled) == fast


def test_steps_and_ranks_windows(tmp_path: Path) -> None:
    _ddp_like(tmp_path, {0: 20.0, 1: 26.0, 2: 20.0})
    assert analyze(tmp_path, steps=(0, 4)).findings == []  # too few steps to judge
    report = analyze(tmp_path, ranks=[0, 2])
    assert report.trace["ranks_analysed"] == [0, 2] and report.findings == []


# What the checks built so far must find in each sample: (code, ranks, first step)
GOLDEN = {
    "straggler-ddp": [("straggler", [1], 4)],
    "healthy-ddp": [],
    "data-stall": [("data-stall", [3], 4)],
    "divergence": [("non-finite", [1], 30), ("replica-divergence", [2], 10)],
    "poor-overlap": [("poor-overlap", [0, 1, 2, 3], 4)],
    "fsdp2": [],
    "pipeline-gpipe": [("pipeline-bubble", [0, 1, 2, 3], 3)],
    "pipeline-1f1b": [("pipeline-bubble", [0, 1, 2, 3], 3)],
    "pipeline-slow-stage": [("pipeline-bubble", [0, 1, 2, 3], 3), ("slow-stage", [2], 3)],
    "comm-bound-ddp": [("communication-bound", [0, 1, 2, 3], 4)],
    "slow-link": [("slow-link", [2, 3], 4)],
    "crash-at-start": [("rank-stopped", [1], 0), ("rank-stopped", [0, 2, 3], 0)],
    # recorded on a GPU: the straggler is seen in the GPU's times only
    "gpu-straggler": [("straggler", [1], 3), ("communication-bound", [1], 3)],
}


@pytest.mark.skipif(not SAMPLES.exists(), reason="no sample traces")
@pytest.mark.parametrize("sample", sorted(GOLDEN))
def test_samples_give_exactly_their_findings(sample: str) -> None:
    report = analyze(SAMPLES / sample)
    found = [(f.code, f.ranks, f.first_step) for f in report.sorted_findings()]
    assert found == GOLDEN[sample]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dtprof", "analyze", *args], capture_output=True, text=True
    )


PANDAS_PROBE = """
import sys
import pyarrow
import dtprof.cli as cli
from dtprof.commands import own_process
own_process.OWN = True  # as run() sets it
code = cli.main(["analyze", *sys.argv[1:]])
print("exit", code, "pandas", "pandas" in sys.modules)
print(type(pyarrow.table({"a": [1]}).to_pandas()).__name__)  # pandas where it is asked for
"""


def test_analyze_never_imports_pandas_but_arrow_still_reaches_it(tmp_path: Path) -> None:
    from tests.unit.test_flight import _entry, _write
    from tests.unit.test_kineto import two_ranks

    _ddp_like(tmp_path / "slow", {0: 20.0, 1: 26.0, 2: 20.0})
    (tmp_path / "fr").mkdir()  # Flight Recorder dumps: rank 1 called another collective
    config = {"1": {"name": "1", "desc": "default_pg", "ranks": "[0, 1, 2]"}}
    for rank, last in ((0, "all_reduce"), (1, "all_gather"), (2, "all_reduce")):
        entries = [_entry(1, "completed"), _entry(2, "completed", last)]
        dump = {"version": "2.10", "pg_config": config, "entries": entries}
        _write(tmp_path / "fr" / f"nccl_trace_rank_{rank}", dump)
    env = dict(os.environ, DTPROF_CACHE_DIR=str(tmp_path / "cache"))
    kinds = ((tmp_path / "slow", 1), (two_ranks(tmp_path / "k"), 0), (tmp_path / "fr", 1))
    for trace, code in kinds:
        cmd = [sys.executable, "-c", PANDAS_PROBE, str(trace), "--format", "json"]
        done = subprocess.run(cmd, capture_output=True, text=True, env=env)
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines()[-2:] == [f"exit {code} pandas False", "DataFrame"]


def test_cli_formats_and_exit_codes(tmp_path: Path) -> None:
    _ddp_like(tmp_path / "slow", {0: 20.0, 1: 26.0, 2: 20.0})
    _ddp_like(tmp_path / "fine", {0: 20.0, 1: 20.2, 2: 20.0})
    assert _cli(str(tmp_path / "fine"), "--fail-on", "info").returncode == 0
    slow = _cli(str(tmp_path / "slow"))
    assert slow.returncode == 1 and "ERROR straggler (ranks 1" in slow.stdout
    out = tmp_path / "report.json"
    assert _cli(str(tmp_path / "slow"), "--format", "json", "-o", str(out)).returncode == 1
    report = json.loads(out.read_text())
    assert report["schema"] == "dtprof.report/1"
    assert [f["code"] for f in report["findings"]] == ["straggler"]
    assert set(report["findings"][0]) == {
        "code",
        "severity",
        "ranks",
        "first_step",
        "last_step",
        "message",
        "suggestion",
        "evidence",
        "caused_by",
    }


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["NOPE"], "NOPE: no such directory"),
        (["{t}", "--steps", "3"], "--steps wants A:B"),
        (["{t}", "--ranks", "a"], "--ranks wants a list"),
        (["{t}", "--ranks", "7"], "none of the ranks [7] is in this trace"),
        (["{t}", "--format", "xml"], "invalid choice: 'xml'"),
    ],
)
def test_cli_user_errors_are_one_line_and_exit_2(
    tmp_path: Path, args: list[str], message: str
) -> None:
    _ddp_like(tmp_path, {0: 20.0, 1: 20.0})
    proc = _cli(*[a.format(t=tmp_path) for a in args])
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dtprof: error: ") and message in lines[0]


def test_text_and_markdown_renderings(tmp_path: Path) -> None:
    _ddp_like(tmp_path, {0: 20.0, 1: 26.0, 2: 20.0})
    report = analyze(tmp_path)
    t, m = text(report), markdown(report)
    assert t.splitlines()[0].endswith("3 of 3 ranks, 12 steps, median step 28.00 ms")
    assert "try: look at rank 1's host" in t
    assert "| rank | steps |" in m and "**error** `straggler` ranks 1" in m


def test_the_straggler_compute_matrix_is_the_pivot_table_of_the_steps() -> None:
    import pandas as pd

    from dtprof.analysis.checks.straggler import _compute_matrix

    rng = np.random.default_rng(5)
    rows = [(r, s) for s in range(30) for r in range(4) if rng.random() > 0.1]
    steps = pd.DataFrame(rows, columns=["rank", "step"])
    steps["compute_ns"] = rng.normal(1e6, 1e4, len(steps))
    steps.loc[rng.random(len(steps)) < 0.1, "compute_ns"] = np.nan
    steps.loc[steps["step"] == 7, "compute_ns"] = np.nan  # a step without any: left out
    steps.loc[steps["rank"] == 2, "compute_ns"] = np.nan  # a rank without any: left out
    pivot = steps.pivot_table(index="step", columns="rank", values="compute_ns")
    step_no, rank_no, compute = _compute_matrix(pa.Table.from_pandas(steps, preserve_index=False))
    assert step_no.tolist() == pivot.index.tolist() and 7 not in step_no
    assert rank_no.tolist() == pivot.columns.tolist() == [0, 1, 3]
    assert np.array_equal(compute, pivot.to_numpy(), equal_nan=True)


def test_the_per_rank_summary_is_the_groupby_median_of_the_steps() -> None:
    import pandas as pd

    from dtprof.analysis import _summary
    from dtprof.analysis.summarize import RunSummary

    rng = np.random.default_rng(11)
    n = 200
    steps = pd.DataFrame({"rank": rng.integers(0, 5, n).astype(np.int32), "step": np.arange(n)})
    steps["step_ns"] = rng.integers(1, 10**9, n)
    for name in ("compute_ns", "data_ns"):
        steps[name] = rng.random(n) * 1e8
        steps.loc[rng.random(n) < 0.3, name] = np.nan
    steps.loc[steps["rank"] == 3, "data_ns"] = np.nan  # a rank without any: no median
    run = RunSummary(
        **{f: pa.table({}) for f in _RUN_FRAMES},
        ranks=[],
        meta={},
        steps=pa.Table.from_pandas(steps, preserve_index=False),
    )
    per = steps.groupby("rank").agg(
        n=("step", "size"), step=("step_ns", "median"), compute=("compute_ns", "median"),
        data=("data_ns", "median"),
    )  # fmt: skip
    got = _summary(run)
    assert [r["rank"] for r in got["ranks"]] == per.index.tolist() == [0, 1, 2, 3, 4]
    for row, (_, want) in zip(got["ranks"], per.iterrows(), strict=True):
        assert row["steps"] == want["n"]
        for name in ("step", "compute", "data"):
            expected = None if pd.isna(want[name]) else round(want[name] / 1e6, 3)
            assert row[f"{name}_ms"] == expected
        other = want["step"] - np.nan_to_num(want["compute"]) - np.nan_to_num(want["data"])
        assert row["other_ms"] == round(other / 1e6, 3)
    assert got["median_step_ms"] == round(per["step"].median() / 1e6, 3)


_RUN_FRAMES = (
    "phases", "actions", "collectives", "scalars", "fingerprints", "memory", "events",
    "inflight", "last_span", "groups",
)  # fmt: skip


def test_memory_growth_takes_first_middle_and_last_as_pandas_does() -> None:
    import pandas as pd

    from dtprof.analysis.checks.memory_growth import _first_mid_last

    rng = np.random.default_rng(3)
    n = 300
    rows = pd.DataFrame({"rank": rng.integers(0, 6, n).astype(np.int32), "value": rng.random(n)})
    rows.loc[rng.random(n) < 0.3, "value"] = np.nan
    rows.loc[rows["rank"] == 4, "value"] = np.nan  # none known: NaN first and last
    rows.loc[rows.index[rows["rank"] == 0][:2], "value"] = np.nan  # first known: the third
    rows.loc[rows.index[rows["rank"] == 1][-1:], "value"] = np.nan  # last known: the one before
    ranks, first, mid, last = _first_mid_last(rows["rank"].to_numpy(), rows["value"].to_numpy())
    g = rows.groupby("rank")["value"]
    middle = g.apply(lambda v: v.iloc[len(v) // 2])
    assert ranks.tolist() == g.first().index.tolist() == [0, 1, 2, 3, 4, 5]
    for got, want in ((first, g.first()), (mid, middle), (last, g.last())):
        assert np.array_equal(got, want.to_numpy(), equal_nan=True)
    assert np.isnan(first[4]) and np.isnan(last[4])


@pytest.mark.parametrize("end", [None, (1_000_000_000, 7_000_000)], ids=["offset", "drift"])
def test_gpu_figures_read_kernels_on_rank_zero_clock(
    tmp_path: Path, end: tuple[int, int] | None
) -> None:
    # the kernels' arrays are read straight from Arrow with a constant offset, and through
    # the frames' alignment when the clock drifts: both land where the steps do
    from dtprof.analysis.summarize import summarize_rank

    kernels = [
        (0, 0, 7, "gemm", "compute", 100, 300, 1, None),
        (0, 0, 8, "ncclKernel_AllReduce", "communication", 200, 500, 2, None),
        (None, 0, 7, "gemm", "compute", 800, 900, 3, None),  # launch not traced
        (1, 0, 7, "gemm", "compute", 1_000, 1_100, 4, None),
    ]
    meta = rank_meta(0, 1, base=10**12, offset_ns=5_000_000, end=end)
    folder = write_rank(
        tmp_path, meta, {"steps": [(0, 100, 600), (1, 1_000, 1_200)], "kernels": kernels}
    )
    summary = summarize_rank(folder)
    steps = summary.steps.to_pandas().set_index("step")
    phases = summary.phases.to_pandas().set_index("start_ns")
    assert list(phases["step"]) == [0, 0, 1]
    assert phases.index[0] == steps.loc[0, "start_ns"]  # both local 100
    assert phases.index[2] == steps.loc[1, "start_ns"]  # both local 1,000
    gpu = summary.gpu.to_pandas().iloc[0]
    # counted: launched before the last step, so the first two (the third's step is unknown);
    # a drifting clock moves each time by its own offset, rounded: within a nanosecond
    assert gpu["kernels"] == 2
    got = gpu[["span_ns", "comm_ns", "overlap_ns"]].to_numpy(float)
    assert np.abs(got - [400, 300, 100]).max() <= (1 if end else 0)


def test_the_last_span_is_the_one_that_never_ended_else_the_latest_end_else_the_kernels() -> None:
    import pandas as pd

    from dtprof.analysis.summarize import _last_span

    base = 1_700_000_000_000_000_000  # epoch ns: past float64's exact integers
    spans = pd.DataFrame(
        {
            "rank": np.int32(0),
            "step": [0, 1, 2, 3],
            "name": ["a", "b", "c", "d"],
            "kind": "region",
            "start_ns": [base, base + 10, base + 20, base + 30],
            "end_ns": pd.array([base + 5, base + 41, base + 41, base + 40], dtype="Int64"),
        }
    )
    phases = pd.DataFrame(
        {
            "rank": np.int32(0),
            "step": [3, 4],
            "name": "gpu-compute",
            "kind": "phase",
            "start_ns": [base + 1, base + 35],
            "end_ns": [base + 2, base + 42],
        }
    )

    def last(spans: pd.DataFrame, phases: pd.DataFrame | None, column: str = "name") -> list:
        as_arrow = (pa.Table.from_pandas(f, preserve_index=False) for f in (spans, phases))
        got = _last_span(next(as_arrow), next(as_arrow) if phases is not None else None)
        return got.column(column).to_pylist()

    assert last(spans, None) == ["c"]  # of equal ends, the later
    assert last(spans, phases) == ["gpu-compute"]  # ends 1 ns later
    phases.loc[1, "end_ns"] = base + 41
    assert last(spans, phases, "step") == [4]  # equal: the phases come after
    phases.loc[1, "end_ns"] = base + 40
    assert last(spans, phases) == ["c"]
    spans.loc[[0, 1], "end_ns"] = pd.NA  # never ended: the last of those, whatever else
    assert last(spans, phases) == ["b"]
    empty = pa.Table.from_pandas(spans.iloc[:0], preserve_index=False)
    assert _last_span(empty, None).num_rows == 0
    arrow_phases = pa.Table.from_pandas(phases, preserve_index=False)
    assert _last_span(empty, arrow_phases).column_names == [
        "rank", "step", "name", "kind", "end_ns"
    ]  # fmt: skip
