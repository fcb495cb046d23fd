"""Findings the fault-injection benchmark asked for, on inline traces: slow stages, onsets,
communication-bound jobs, early loss spikes, and consequences listed under their cause."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import dtprof
from dtprof.analysis import analyze
from dtprof.analysis.checks.memory_growth import growth_onset
from dtprof.analysis.checks.straggler import _chance_held
from dtprof.analysis.columns import rows, values, warmup_steps
from dtprof.analysis.pipeline import idle_gaps, idle_share_by_rank
from dtprof.analysis.render import markdown, text
from dtprof.analysis.summarize import combine, summarize_rank
from dtprof.trace.reader import find_rank_dirs
from tests.tracebuild import rank_meta, write_rank

MS = 1_000_000


def _pipeline(
    trace: Path,
    work_ms: dict[int, float],
    steps: int = 20,
    m: int = 4,
    barrier_after: bool = False,
) -> None:
    """A GPipe run of len(work_ms) stages, one per rank: each microbatch's forward then
    backward, each taking work_ms[rank] per microbatch (a third forward), at the slowest's pace;
    with barrier_after, an optimizer phase ending each step and a barrier after the last step
    that the last rank enters last."""
    p = len(work_ms)
    slowest = max(work_ms.values())
    half = (m + p - 1) * slowest  # forwards, then backwards, each microbatch a slot
    step_ms = 2 * half
    info = {
        "schedule": "ScheduleGPipe",
        "stages": p,
        "microbatches": m,
        "virtual_stages_per_rank": 1,
    }
    for rank, work in work_ms.items():
        rows: dict[str, list[tuple]] = {"steps": [], "spans": []}
        for step in range(steps):
            t0 = step * step_ms
            rows["steps"].append((step, int(t0 * MS), int((t0 + step_ms) * MS)))
            for mb in range(m):
                start = t0 + (rank + mb) * slowest
                fwd = (start, start + work / 3)
                bwd_start = t0 + half + (p - 1 - rank + mb) * slowest
                bwd = (bwd_start, bwd_start + 2 * work / 3)
                for name, (a, b) in (("forward", fwd), ("backward", bwd)):
                    rows["spans"].append(
                        (step, name, "pipeline", int(a * MS), int(b * MS), 0, rank, mb)
                    )
        if barrier_after:  # and an optimizer phase, as dtprof run records one
            rows["spans"] += [
                (
                    step,
                    "optimizer",
                    "phase",
                    int(((step + 1) * step_ms - 0.5) * MS),
                    int(((step + 1) * step_ms - 0.1) * MS),
                    0,
                    None,
                    None,
                )
                for step in range(steps)
            ]
            end = steps * step_ms
            rows["groups"] = [("0", "gloo", list(range(p)))]
            rows["collectives"] = [
                (
                    steps,
                    "0",
                    0,
                    "barrier",
                    0,
                    None,
                    None,
                    int((end + rank) * MS),
                    int((end + p) * MS),
                    True,
                    None,
                )
            ]
        meta = rank_meta(rank, p, pipeline={**info, "stage_indices": [rank]})
        write_rank(trace, meta, rows)


def test_the_slow_stage_is_named_with_its_times_and_a_balanced_prediction(tmp_path: Path) -> None:
    _pipeline(tmp_path, {0: 6.0, 1: 6.0, 2: 8.4, 3: 6.0})
    findings = {f.code: f for f in analyze(tmp_path).findings}
    slow = findings["slow-stage"]
    assert (slow.ranks, slow.severity) == ([2], "warning")
    ev = slow.evidence
    assert ev["slowdown"] == pytest.approx(1.4, rel=0.01)
    assert ev["forward_ms_per_microbatch"] == pytest.approx(2.8, rel=0.01)
    assert ev["median_backward_ms_per_microbatch"] == pytest.approx(4.0, rel=0.01)
    # (m - 1) x slowest + one pass through the stages: 3 x 8.4 + 26.4 against 3 x 6 + 24
    assert ev["step_ms"] - ev["balanced_step_ms"] == pytest.approx(3 * 2.4 + 2.4, rel=0.01)
    assert "stage 2 of 4" in slow.message
    # the bubble this makes is listed as its consequence
    bubble = findings["pipeline-bubble"]
    assert bubble.caused_by == {"code": "slow-stage", "ranks": [2]}
    assert "caused by the slow-stage above" in text(analyze(tmp_path))


def test_a_barrier_after_the_last_step_names_no_straggler(tmp_path: Path) -> None:
    # the one group collective of a pipeline job is in no analysed step
    _pipeline(tmp_path, {0: 6.0, 1: 6.0, 2: 6.0}, barrier_after=True)
    assert "straggler" not in {f.code for f in analyze(tmp_path).findings}


def test_balanced_stages_give_no_slow_stage(tmp_path: Path) -> None:
    _pipeline(tmp_path, {0: 6.0, 1: 6.3, 2: 6.0, 3: 6.2})
    assert "slow-stage" not in {f.code for f in analyze(tmp_path).findings}


def _ddp_exposed(
    trace: Path, backward_ms: float, comm_ms: float, buckets: int, steps: int = 20
) -> None:
    """2 DDP ranks: backward, then their buckets all-reduced one after another after it."""
    step_ms = 2 + backward_ms + comm_ms + 1
    for rank in range(2):
        rows: dict[str, list[tuple]] = {"steps": [], "spans": [], "collectives": []}
        rows["groups"] = [("0", "gloo", [0, 1])]
        seq = 0
        for step in range(steps):
            t0 = step * step_ms
            rows["steps"].append((step, int(t0 * MS), int((t0 + step_ms) * MS)))
            bwd = (t0 + 2, t0 + 2 + backward_ms)
            rows["spans"].append((step, "backward", "phase", int(bwd[0] * MS), int(bwd[1] * MS), 0))
            rows["spans"][-1] += (None, None)
            start = bwd[1]
            for b in range(buckets):
                end = start + comm_ms / buckets
                rows["collectives"].append(
                    (step, "0", seq, "all_reduce", 4_000_000 // buckets, "float32", None,
                     int(start * MS), int(end * MS), True, f"ddp.bucket{b}")
                )  # fmt: skip
                seq, start = seq + 1, end
        write_rank(trace, rank_meta(rank, 2, model_kind="ddp"), rows)


def test_communication_longer_than_backward_is_communication_bound_not_poor_overlap(
    tmp_path: Path,
) -> None:
    _ddp_exposed(tmp_path, backward_ms=2.0, comm_ms=10.0, buckets=1)
    (finding,) = analyze(tmp_path).findings
    assert (finding.code, finding.severity) == ("communication-bound", "info")
    assert finding.evidence["comm_ms_per_step"] == pytest.approx(10.0, rel=0.01)
    assert finding.evidence["backward_ms_per_step"] == pytest.approx(2.0, rel=0.01)
    assert "no_sync" in finding.suggestion


def test_poor_overlap_suggests_smaller_buckets_only_where_one_bucket_holds_most(
    tmp_path: Path,
) -> None:
    _ddp_exposed(tmp_path / "one", backward_ms=20.0, comm_ms=10.0, buckets=1)
    (finding,) = analyze(tmp_path / "one").findings
    assert finding.code == "poor-overlap"
    assert "one bucket" in finding.suggestion and "bucket_cap_mb" in finding.suggestion
    _ddp_exposed(tmp_path / "four", backward_ms=20.0, comm_ms=10.0, buckets=4)
    (finding,) = analyze(tmp_path / "four").findings
    assert finding.code == "poor-overlap" and "4 buckets" in finding.suggestion


def test_a_job_stopped_after_a_few_steps_says_nothing_of_its_overlap(tmp_path: Path) -> None:
    """Three steps, two of them warm-up: one step's exposure is no evidence of how it overlaps."""
    _ddp_exposed(tmp_path / "short", backward_ms=20.0, comm_ms=10.0, buckets=1, steps=3)
    assert analyze(tmp_path / "short").findings == []
    _ddp_exposed(tmp_path / "enough", backward_ms=20.0, comm_ms=10.0, buckets=1, steps=7)
    assert [f.code for f in analyze(tmp_path / "enough").findings] == ["poor-overlap"]


def test_a_loss_spike_early_in_training_is_found(tmp_path: Path) -> None:
    for rank in range(2):
        loss = [(s, "loss", 2.3 + 0.01 * (s % 2)) for s in range(30)]
        if rank == 1:
            loss[6] = (6, "loss", 6.05)
        write_rank(tmp_path, rank_meta(rank, 2), {"scalars": loss})
    (finding,) = analyze(tmp_path).findings
    assert (finding.code, finding.ranks, finding.first_step) == ("loss-spike", [1], 6)


def test_a_spike_that_spreads_is_blamed_on_the_rank_where_it_began(tmp_path: Path) -> None:
    for rank in range(3):
        loss = [(s, "loss", 2.3) for s in range(30)]
        if rank == 0:
            loss[12] = (12, "loss", 9.0)
        else:  # the averaged gradient lifts the others' loss a step later
            loss[13] = (13, "loss", 5.0)
        write_rank(tmp_path, rank_meta(rank, 3), {"scalars": loss})
    (finding,) = analyze(tmp_path).findings
    assert (finding.ranks, finding.first_step, finding.last_step) == ([0], 12, 13)
    assert finding.evidence["reached"] == [1, 2]


def test_pipeline_idle_is_measured_once_for_the_finding_and_the_dashboard(tmp_path: Path) -> None:
    _pipeline(tmp_path, {0: 6.0, 1: 6.0, 2: 8.4, 3: 6.0})
    bubble = next(f for f in analyze(tmp_path).findings if f.code == "pipeline-bubble")
    run = combine([summarize_rank(d) for _, d in find_rank_dirs(tmp_path)])
    skip = warmup_steps(values(run.steps, "step"))
    ranks, share = idle_share_by_rank(
        rows(run.actions, values(run.actions, "step") >= skip),
        rows(run.steps, values(run.steps, "step") >= skip),
    )
    assert ranks.tolist() == [0, 1, 2, 3]  # every rank's steps equally long: the mean is it
    assert float(share.mean()) == pytest.approx(bubble.evidence["bubble_fraction"], abs=1e-4)
    # the slowest stage: 4 microbatches of 8.4 ms work in 2 x (m + p - 1) slots of 8.4 ms
    assert share[2] == pytest.approx(1 - 4 / 14, abs=1e-3)
    assert share[0] == pytest.approx(1 - 4 * 6.0 / (14 * 8.4), abs=1e-3)
    gaps = idle_gaps(
        rows(run.actions, values(run.actions, "step") == 5),
        rows(run.steps, values(run.steps, "step") == 5),
    )
    step_ns = values(rows(run.steps, values(run.steps, "step") == 5), "step_ns")
    per_rank = np.bincount(values(gaps, "rank"), values(gaps, "end_ns") - values(gaps, "start_ns"))
    assert per_rank / step_ns == pytest.approx(share, abs=1e-3)  # the gaps add up to the idle


def test_memory_growth_starts_where_the_readings_rise() -> None:
    step = np.arange(40)
    value = 1e9 + np.where(step >= 17, (step - 16) * 8e6, 0) + (step % 3) * 1e5
    assert growth_onset(step, value.astype(float)) == 17


def test_a_chronic_straggler_that_began_mid_run_is_reported_from_then(tmp_path: Path) -> None:
    from tests.unit.test_analyze import _ddp_steps

    def compute(rank: int, step: int) -> float:
        return 28.0 if rank == 1 and step >= 15 else 20.0 + 0.1 * ((rank + step) % 3)

    _ddp_steps(tmp_path, 4, 40, compute)
    (finding,) = analyze(tmp_path).findings
    assert (finding.code, finding.ranks, finding.first_step) == ("straggler", [1], 15)
    assert finding.evidence["chronic"] is True


def test_a_transient_window_spans_a_step_where_another_rank_was_later_still(
    tmp_path: Path,
) -> None:
    from tests.unit.test_analyze import _ddp_steps

    def compute(rank: int, step: int) -> float:
        if rank == 2 and step == 14:
            return 34.0  # later still, in one step of rank 1's window
        slow = rank == 1 and 10 <= step < 20
        return 30.0 if slow else 20.0 + 0.1 * ((rank + step) % 3)

    _ddp_steps(tmp_path, 4, 40, compute)
    (finding,) = [f for f in analyze(tmp_path).findings if f.code == "straggler"]
    assert (finding.ranks, finding.first_step, finding.last_step) == ([1], 10, 19)
    assert finding.evidence["chronic"] is False
    assert "9 of those 10 steps" in finding.message


def test_the_rank_that_raised_first_is_the_cause_and_the_others_follow(tmp_path: Path) -> None:
    exception = {
        "type": "ValueError",
        "message": "ValueError: bad batch",
        "step": 0,
        "file": "/job/train.py",
        "line": 42,
        "function": "train",
        "code": "raise ValueError('bad batch')",
    }
    for rank in range(3):
        rows: dict[str, list[tuple]] = {"collectives": []}
        extra = {}
        if rank == 1:
            extra = {"status": "raised ValueError", "exception": exception}
        else:
            failed = (0, "0", 0, "all_reduce", 64, "float32", None, MS, 2 * MS, False, "error")
            rows["collectives"].append(failed)
            extra = {"status": "raised DistBackendError"}
        write_rank(tmp_path, rank_meta(rank, 3, **extra), rows)
    report = analyze(tmp_path)
    ((cause, consequences),) = report.by_cause()
    assert (cause.code, cause.ranks, cause.first_step) == ("rank-stopped", [1], 0)
    assert "raised ValueError in train (train.py:42) at step 0: bad batch" in cause.message
    assert "before its first step" in cause.message
    assert [(f.code, f.ranks) for f in consequences] == [("rank-stopped", [0, 2])]
    assert consequences[0].caused_by == {"code": "rank-stopped", "ranks": [1]}
    assert report.to_json()["findings"][1]["caused_by"] == {"code": "rank-stopped", "ranks": [1]}
    assert "  - caused by it: **warning** `rank-stopped`" in markdown(report)


def test_profile_records_the_exception_training_left_with(tmp_path: Path) -> None:
    def train() -> None:
        raise ValueError("bad batch\nsecond line")

    with pytest.raises(ValueError), dtprof.profile(tmp_path) as prof:
        prof.step()
        train()
    trace = dtprof.load_trace(tmp_path)
    exception = trace.meta[0].exception
    assert exception.type == "ValueError" and exception.message == "ValueError: bad batch"
    assert (exception.step, exception.function) == (1, "train")
    assert exception.file == __file__
    events = trace.events[trace.events["kind"] == "exception"]
    assert events["message"].tolist() == ["ValueError: bad batch"]


def test_a_rank_late_from_its_data_phase_is_no_straggler(tmp_path: Path) -> None:
    """A leaking loader: rank 3 is last at every step, from its input; its compute is only
    4% slower (memory pressure), far from explaining the others' wait."""
    from tests.unit.test_analyze import _ddp_steps

    _ddp_steps(
        tmp_path,
        4,
        40,
        lambda rank, step: 20.8 if rank == 3 else 20.0,
        data=lambda rank, step: 12.0 if rank == 3 else 0.2,
    )
    codes = [f.code for f in analyze(tmp_path).findings]
    assert "straggler" not in codes and "data-stall" in codes


def test_a_small_consistent_excess_is_a_straggler(tmp_path: Path) -> None:
    from tests.unit.test_analyze import _ddp_steps

    _ddp_steps(tmp_path, 4, 40, lambda rank, step: 21.2 if rank == 2 else 20.0)
    (finding,) = analyze(tmp_path).findings
    assert (finding.code, finding.ranks, finding.severity) == ("straggler", [2], "warning")
    assert finding.evidence["slowdown"] == pytest.approx(1.06, rel=0.01)


def _mostly_last(rank: int, step: int) -> float:
    """Rank 2 is 6% slower; in 3 steps of 10 rank 0 is slower still and holds the others up."""
    if rank == 0 and step % 10 in (1, 4, 7):
        return 23.0
    return 21.2 if rank == 2 else 20.0


def test_a_small_excess_held_in_most_of_many_steps_is_a_straggler(tmp_path: Path) -> None:
    """Last in 7 steps of 10 over 36 steps: equal ranks would do that once in ~10^7 runs."""
    from tests.unit.test_analyze import _ddp_steps

    _ddp_steps(tmp_path, 4, 40, _mostly_last)
    (finding,) = analyze(tmp_path).findings
    assert (finding.code, finding.ranks, finding.severity) == ("straggler", [2], "warning")
    assert finding.evidence["steps_last"] == pytest.approx(0.7, abs=0.03)


def test_the_same_share_of_a_few_steps_is_no_straggler(tmp_path: Path) -> None:
    """Last in 7 of 10 analysed steps: equal ranks would do that in ~1% of runs."""
    from tests.unit.test_analyze import _ddp_steps

    _ddp_steps(tmp_path, 4, 12, _mostly_last)
    assert [f.code for f in analyze(tmp_path).findings] == []


def _slow_from_step_8(rank: int, step: int) -> float:
    """Rank 2: 3% slower all along, 20% from step 8, then 6% from step 18 on."""
    if rank != 2:
        return 20.0
    return 20.0 * (1.03 if step < 8 else 1.20 if step < 18 else 1.06)


def test_the_onset_is_where_the_rank_became_slow_not_where_its_excess_fell(
    tmp_path: Path,
) -> None:
    """Its compute splits best at step 18 (20% before, 6% after), which says nothing of when it
    became slow; of the splits with a level before nearer the others' than after, step 8 is
    the best."""
    from tests.unit.test_analyze import _ddp_steps

    _ddp_steps(tmp_path, 4, 40, _slow_from_step_8)
    (finding,) = analyze(tmp_path).findings
    assert (finding.code, finding.ranks, finding.first_step) == ("straggler", [2], 8)


def test_the_chance_of_holding_the_others_up_is_a_binomial_tail() -> None:
    # 4 ranks: P(X >= 9 of 10) = 10 x 0.25^9 x 0.75 + 0.25^10, times 4
    assert _chance_held(9, 10, 4) == pytest.approx(4 * (10 * 0.25**9 * 0.75 + 0.25**10))
    assert _chance_held(0, 10, 4) == 1.0
    assert _chance_held(19, 26, 4) < 1e-5 < _chance_held(8, 10, 4) < 0.01


SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"


@pytest.mark.skipif(not SAMPLES.exists(), reason="no sample traces")
@pytest.mark.parametrize(
    ("sample", "consequence", "cause"),
    [
        ("pipeline-slow-stage", "pipeline-bubble", {"code": "slow-stage", "ranks": [2]}),
        ("crash-at-start", "rank-stopped", {"code": "rank-stopped", "ranks": [1]}),
    ],
)
def test_samples_list_their_consequences_under_the_cause(
    sample: str, consequence: str, cause: dict
) -> None:
    report = analyze(SAMPLES / sample)
    ((root, under),) = report.by_cause()
    assert {"code": root.code, "ranks": root.ranks} == cause
    assert [(f.code, f.caused_by) for f in under] == [(consequence, cause)]


def test_a_leaking_rank_slow_from_where_its_memory_grew_is_listed_under_the_leak() -> None:
    from dtprof.analysis.causes import link
    from dtprof.analysis.report import Finding

    def finding(code: str, rank: int, first: int) -> Finding:
        return Finding(code, "warning", [rank], first, 79, code, "")

    growth = finding("memory-growth", 3, 17)
    slow_after, slow_before, other = (
        finding("straggler", 3, 28),
        finding("straggler", 3, 10),
        finding("straggler", 2, 28),
    )
    assert link([slow_after, growth])[0].caused_by == {"code": "memory-growth", "ranks": [3]}
    assert link([slow_before, growth])[0].caused_by is None  # slow before it grew: its own
    assert link([other, growth])[0].caused_by is None  # another rank
