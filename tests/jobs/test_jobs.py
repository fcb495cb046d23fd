"""Real multi-process gloo jobs (DDP, every API op, FSDP2, pipelining) and what they record."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import dtprof
from dtprof.jobs import launch
from dtprof.trace.info import describe
from tests.conftest import logs_of, native_kernel_or_skip

pytestmark = pytest.mark.multiprocess


def _matched(coll: pd.DataFrame, world: int) -> pd.DataFrame:
    """Collectives (not p2p) keyed by (group, seq), one column per rank."""
    coll = coll[coll["peer"].isna()]
    return coll.pivot_table(
        index=["group", "seq"], columns="rank", values="end_ns", aggfunc="first"
    )


@pytest.mark.parametrize("how", ["native", "python", "comm_hook"])
def test_ddp_steps_buckets_sequence_numbers_clocks_fingerprints(tmp_path: Path, how: str) -> None:
    """``how``: DDP's buckets seen by the native kernel, the Python one, or a comm hook."""
    if how == "native":
        native_kernel_or_skip()
    trace_dir, world, steps = tmp_path / "trace", 3, 12
    script = Path(__file__).parent / "workers" / "ddp_buckets.py"
    procs = launch.start_command(
        [sys.executable, str(script), str(trace_dir), str(steps), how],
        world,
        log_dir=tmp_path / "logs",
        env={"DTPROF_NATIVE": "0"} if how == "python" else None,
    )
    assert launch.wait(procs, 180) == [0] * world, logs_of(tmp_path / "logs")
    trace = dtprof.load_trace(trace_dir)

    # every step on every rank, with its four phases
    assert trace.steps.groupby("rank")["step"].apply(list).tolist() == [list(range(steps))] * world
    phases = trace.spans[trace.spans["kind"] == "phase"]
    counts = phases.groupby(["rank", "step", "name"]).size().unstack()
    assert (counts[["data", "forward", "backward", "optimizer"]] == 1).all().all()

    # DDP buckets: several per step, labelled, together the size of all gradients
    via = "comm_hook" if how == "comm_hook" else "dispatcher"
    assert {m.ddp_buckets_via for m in trace.meta.values()} == {via}
    if via == "dispatcher":
        assert {m.ddp_buckets_kernel for m in trace.meta.values()} == {how}
    said = {"native": "at the dispatcher by the native kernel", "comm_hook": "through a comm hook"}
    assert f"DDP's buckets recorded {said.get(how, 'at the dispatcher by the python kernel')}" in (
        describe(str(trace_dir))
    )
    coll = trace.collectives
    assert set(coll["op"]) == {"all_reduce"}
    assert coll["label"].str.fullmatch(r"ddp\.bucket\d+").all()
    param_bytes = 6 * (128 * 128 + 128) * 4
    per_step = coll.groupby(["rank", "step"])["bytes"].agg(["sum", "size"])
    assert (per_step["sum"] == param_bytes).all()
    # DDP rebuilds its buckets after the first step, in the order gradients became ready
    after_first = per_step[per_step.index.get_level_values("step") >= 1]
    assert len(after_first) == world * (steps - 1) and (after_first["size"] >= 3).all()

    # the same collective has the same (group, seq), op and bytes on every rank
    keyed = coll.set_index(["group", "seq", "rank"])[["op", "bytes", "label"]].unstack("rank")
    for field in ("op", "bytes"):
        assert (keyed[field].nunique(axis=1) == 1).all()
    assert keyed.notna().all().all()

    # clocks aligned: an all-reduce completes at nearly the same moment on every rank
    ends = _matched(coll, world)
    spread_ms = (ends.max(axis=1) - ends.min(axis=1)) / 1e6
    assert spread_ms.median() < 5, spread_ms.describe()
    assert (trace.ranks["clock_error_ns"] < 5e6).all()

    # parameters are bit-identical across replicas: equal fingerprints at every step
    fp = trace.fingerprints.pivot_table(index=["step", "tensor"], columns="rank", values="sum")
    assert len(fp) == steps * 12
    assert (fp.nunique(axis=1) == 1).all()
    loss = trace.scalars[trace.scalars["name"] == "loss"]
    assert loss.groupby("rank").size().tolist() == [steps] * world
    assert set(trace.ranks["model_kind"]) == {"ddp"}

    # recording changed no bit of the training: a replica without dtprof (nor any comm hook)
    # ends with the same parameters, in a world of 3 where x / 3 and x * (1 / 3) can differ,
    # through steps where DDP multiplies (copies into buckets) and divides (bucket views), and
    # after recording ends
    assert [(tmp_path / f"bare-equal-{r}").read_text() for r in range(world)] == ["True"] * world


def test_every_api_op_is_recorded_with_matching_sequence_numbers(run_job) -> None:
    trace = dtprof.load_trace(run_job("all-ops", 2))
    coll = trace.collectives
    expected = {
        "all_reduce",
        "all_gather",
        "all_gather_into_tensor",
        "reduce_scatter_tensor",
        "broadcast",
        "reduce",
        "all_to_all_single",
        "barrier",
        "gather",
        "scatter",
        "send",
        "recv",
        "isend",
        "irecv",
    }
    assert set(coll["op"]) == expected
    assert coll.groupby("rank").size().tolist() == [32, 32]
    assert (coll["end_ns"] >= coll["start_ns"]).all()
    # collectives: same op at the same (group, seq) on both ranks
    collective = coll[coll["peer"].isna()]
    ops = collective.pivot_table(
        index=["group", "seq"], columns="rank", values="op", aggfunc="first"
    )
    assert (ops[0] == ops[1]).all() and len(ops) == 24
    # p2p: each send has the receive with the same (group, src -> dst, seq) on its peer
    p2p = coll[coll["peer"].notna()].copy()
    sending = p2p["op"].isin(["send", "isend"])
    p2p["src"] = np.where(sending, p2p["rank"], p2p["peer"])
    p2p["dst"] = np.where(sending, p2p["peer"], p2p["rank"])
    sides = p2p.groupby(["group", "src", "dst", "seq"])["op"].apply(sorted)
    assert sides.map(tuple).isin([("recv", "send"), ("irecv", "isend")]).all()
    assert len(sides) == 8
    assert sorted(map(tuple, trace.groups["ranks"])) == [(0, 1), (0, 1)]


def test_fsdp2_all_gathers_and_reduce_scatters(run_job) -> None:
    trace = dtprof.load_trace(run_job("fsdp2", 2, "--steps", "4", "--fingerprint-every", "2"))
    coll = trace.collectives
    assert {"all_gather_into_tensor", "reduce_scatter_tensor"} <= set(coll["op"])
    ops = coll.pivot_table(index=["group", "seq"], columns="rank", values="op", aggfunc="first")
    assert ops.notna().all().all() and (ops[0] == ops[1]).all()
    assert trace.steps.groupby("rank").size().tolist() == [4, 4]
    assert set(trace.ranks["model_kind"]) == {"fsdp2"}
    assert len(trace.fingerprints) > 0


def test_pipeline_actions_per_stage_and_microbatch(run_job) -> None:
    trace = dtprof.load_trace(
        run_job("pipeline", 2, "--schedule", "1f1b", "--microbatches", "4", "--steps", "3")
    )
    actions = trace.spans[trace.spans["kind"] == "pipeline"]
    per = actions.groupby(["rank", "step", "stage", "name"])["microbatch"].apply(sorted)
    assert len(per) == 2 * 3 * 2
    assert all(mbs == [0, 1, 2, 3] for mbs in per)
    assert (actions["rank"] == actions["stage"]).all()
    meta = trace.meta[1].pipeline
    assert (meta.schedule, meta.stages, meta.microbatches) == ("Schedule1F1B", 2, 4)
    p2p = trace.collectives[trace.collectives["peer"].notna()]
    assert len(p2p) >= 2 * 3 * 4 * 2  # activations forward and gradients back, both sides


def test_zero_bubble_schedule_records_input_and_weight_gradients_per_virtual_stage(
    run_job,
) -> None:
    trace = dtprof.load_trace(
        run_job("pipeline", 2, "--schedule", "zb", "--microbatches", "4", "--steps", "2")
    )
    actions = trace.spans[trace.spans["kind"] == "pipeline"]
    counts = actions.groupby(["rank", "stage", "name"]).size().unstack()
    assert list(counts.columns) == ["backward_input", "backward_weight", "forward"]
    assert (counts == 2 * 4).all().all()  # every microbatch of both steps, per virtual stage
    assert counts.index.tolist() == [(0, 0), (0, 2), (1, 1), (1, 3)]
    meta = trace.meta[0].pipeline
    assert meta.schedule == "ScheduleInterleavedZeroBubble"
    assert (meta.stages, meta.virtual_stages_per_rank, meta.stage_indices) == (
        4,
        2,
        (0, 2),
    )
    assert meta.actions[:2] == ("0F0", "0F1")


def test_a_straggler_planted_on_a_random_rank_is_found(run_job) -> None:
    import random

    from dtprof.analysis import analyze

    slow = random.Random().randrange(3)  # a different rank from run to run, and said on failure
    trace = run_job(
        "straggler-ddp",
        3,
        "--steps",
        "24",
        "--device-ms",
        "20",
        "--bucket-mb",
        "0.25",
        "--slow-rank",
        str(slow),
        "--slow-fraction",
        "0.4",
    )
    findings = analyze(trace).findings
    assert [(f.code, f.ranks) for f in findings] == [("straggler", [slow])], (slow, findings)
    assert findings[0].evidence["slowdown"] > 1.2
