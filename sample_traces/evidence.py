"""The measured evidence that a sample trace shows its situation, computed with pandas.

Each function takes a loaded Trace and what the job was told to do, and returns one line of
figures for the README, or raises Missing when the trace does not show it. The bars here are
sanity bars for sample data, kept loose enough for a loaded 2-core machine; they are not the
analyzer's thresholds.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dtprof.trace.reader import Trace

WARMUP_STEPS = 2  # steps 0-1: DDP rebuilds its buckets, first fingerprints, cold caches


class Missing(Exception):
    """The trace lacks the evidence of its situation."""


def _need(condition: object, message: str) -> None:
    if not condition:
        raise Missing(message)


def _by_rank(values: pd.Series, digits: int = 3) -> str:
    return ", ".join(f"rank {r}: {v:.{digits}f}" for r, v in values.items())


def _ms(df: pd.DataFrame) -> pd.Series:
    return (df["end_ns"] - df["start_ns"]) / 1e6


def _after_warmup(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["step"] >= WARMUP_STEPS]


def _phase_ms(trace: Trace, names: list[str]) -> pd.Series:
    """Summed duration of the named phases per (rank, step), in ms."""
    spans = _after_warmup(trace.spans)
    spans = spans[(spans["kind"] == "phase") & spans["name"].isin(names)]
    return _ms(spans).groupby([spans["rank"], spans["step"]]).sum()


def _compute_ratio(trace: Trace) -> pd.Series:
    """Each rank's median forward+backward time over the median of all ranks' medians."""
    per_rank = _phase_ms(trace, ["forward", "backward"]).groupby(level="rank").median()
    return per_rank / per_rank.median()


def _union_ns(intervals: pd.DataFrame, keys: list[str]) -> pd.Series:
    """Length of the union of [start_ns, end_ns) intervals per key, by a sorted sweep."""
    d = intervals.sort_values([*keys, "start_ns"])
    reached = d.groupby(keys)["end_ns"].cummax().groupby([d[k] for k in keys]).shift()
    begin = np.maximum(d["start_ns"], reached.fillna(d["start_ns"]))
    return (d["end_ns"] - begin).clip(lower=0).groupby([d[k] for k in keys]).sum()


def _exposed_comm(trace: Trace) -> tuple[float, float]:
    """(median share of step time spent in collectives after backward ended, share of
    collectives that started before backward ended)."""
    keys = ["rank", "step"]
    spans = trace.spans
    bwd_end = spans[spans["name"] == "backward"].set_index(keys)["end_ns"].rename("bwd_end")
    coll = _after_warmup(trace.collectives).join(bwd_end, on=keys, how="inner")
    overlapping = float((coll["start_ns"] < coll["bwd_end"]).mean())
    tail = coll.assign(start_ns=np.maximum(coll["start_ns"], coll["bwd_end"]))
    tail = tail[tail["end_ns"] > tail["start_ns"]]
    steps = _after_warmup(trace.steps).set_index(keys)
    exposed = _union_ns(tail, keys).reindex(steps.index, fill_value=0)
    return float((exposed / (steps["end_ns"] - steps["start_ns"])).median()), overlapping


def _non_finite(trace: Trace) -> pd.DataFrame:
    loss = trace.scalars[trace.scalars["name"] == "loss"]
    return loss[~np.isfinite(loss["value"].to_numpy())]


def _odd_fingerprints(trace: Trace) -> tuple[pd.DataFrame, pd.Series]:
    """(step x rank: some finite parameter sum differs from the ranks' median, step: every
    fingerprint finite). With one odd replica among several, the median is the others' value."""
    fp = trace.fingerprints.pivot_table(index=["step", "tensor"], columns="rank", values="sum")
    odd = fp.ne(fp.median(axis=1), axis=0) & np.isfinite(fp)
    finite = np.isfinite(fp).all(axis=1).groupby(level="step").all()
    return odd.groupby(level="step").any(), finite


def _healthy(trace: Trace, replicas: bool = True, spread: float = 0.1) -> str:
    """Equal compute (within ``spread``) and finite losses; with ``replicas``, equal
    fingerprints on every rank."""
    ratio = _compute_ratio(trace)
    _need(
        ratio.max() < 1 + spread and ratio.min() > 1 - spread,
        f"compute differs by rank: {_by_rank(ratio)}",
    )
    _need(_non_finite(trace).empty, "a non-finite loss")
    line = f"compute {ratio.min():.3f}-{ratio.max():.3f}x median; losses finite"
    if replicas:
        odd, _ = _odd_fingerprints(trace)
        _need(not odd.any().any(), f"fingerprints differ on {odd.any(axis=1).sum()} step(s)")
        line += f"; fingerprints equal on all {len(odd)} fingerprinted steps"
    return line


def healthy_ddp(trace: Trace) -> str:
    """Healthy, and most communication hidden behind backward."""
    exposed, overlapping = _exposed_comm(trace)
    _need(exposed < 0.25, f"{exposed:.0%} of a step is exposed communication")
    return (
        f"{_healthy(trace)}; {overlapping:.0%} of all-reduces start inside backward, "
        f"exposed communication {exposed:.0%} of step"
    )


def straggler(trace: Trace, rank: int) -> str:
    """``rank`` computes longest, arrives last at collectives and so waits least in them."""
    ratio = _compute_ratio(trace)
    _need(ratio.idxmax() == rank and ratio[rank] > 1.15, f"compute by rank: {_by_rank(ratio)}")
    coll = _after_warmup(trace.collectives)
    coll_ms = _ms(coll).groupby(coll["rank"]).median()
    _need(coll_ms.idxmin() == rank, f"median all-reduce ms by rank: {_by_rank(coll_ms, 2)}")
    last = coll.loc[coll.groupby(["group", "seq"])["start_ns"].idxmax(), "rank"]
    last_share = float((last == rank).mean())
    _need(last_share > 0.75, f"rank {rank} arrives last at only {last_share:.0%} of collectives")
    others = coll_ms.drop(rank).median()
    return (
        f"rank {rank} compute {ratio[rank]:.2f}x median (others "
        f"{ratio.drop(rank).min():.3f}-{ratio.drop(rank).max():.3f}x); its median all-reduce "
        f"{coll_ms[rank]:.1f} ms vs {others:.1f} ms on the others; it arrives last at "
        f"{last_share:.0%} of {len(last)} all-reduces"
    )


def data_stall(trace: Trace, rank: int, every: int, stall_ms: float) -> str:
    """``rank``'s data phase spikes by about ``stall_ms`` every ``every`` steps, no one else's."""
    data = _phase_ms(trace, ["data"]).unstack("rank")
    stalled = data.index % every == every - 1
    spikes = data.loc[stalled, rank]
    others = data.loc[stalled].drop(columns=rank).max(axis=1)
    calm = data.loc[~stalled].stack()
    _need(spikes.min() > 0.6 * stall_ms, f"rank {rank} data ms at stall steps: {spikes.min():.1f}")
    _need((spikes - others).min() > 0.5 * stall_ms, "other ranks' data is as slow at the stalls")
    _need(calm.quantile(0.95) < 0.3 * stall_ms, f"data p95 {calm.quantile(0.95):.1f} ms off stalls")
    ratio = _compute_ratio(trace)
    _need(ratio.max() < 1.1, f"compute differs by rank: {_by_rank(ratio)}")
    return (
        f"rank {rank} data phase {spikes.median():.0f} ms (min {spikes.min():.0f}) on the "
        f"{len(spikes)} steps with step % {every} == {every - 1}, other ranks at most "
        f"{others.max():.1f} ms on those steps; on other steps median {calm.median():.2f} ms, "
        f"p95 {calm.quantile(0.95):.1f} ms; compute {ratio.min():.3f}-{ratio.max():.3f}x median"
    )


def divergence(
    trace: Trace, perturb_rank: int, perturb_step: int, nan_rank: int, nan_step: int
) -> str:
    """Only ``perturb_rank``'s fingerprints differ, from ``perturb_step`` on; the first
    non-finite loss is ``nan_rank``'s alone, at ``nan_step``."""
    odd, finite = _odd_fingerprints(trace)
    ranks_odd = odd.columns[odd.any()].tolist()
    _need(ranks_odd == [perturb_rank], f"ranks with odd fingerprints: {ranks_odd}")
    steps = odd.index[odd[perturb_rank]]
    expected = finite.index[(finite.index >= perturb_step) & finite.to_numpy()]
    _need(steps.min() == perturb_step, f"rank {perturb_rank} first differs at step {steps.min()}")
    _need(steps.equals(expected), f"rank {perturb_rank} differs on steps {list(steps)} only")
    bad = _non_finite(trace)
    first = bad[bad["step"] == bad["step"].min()]
    _need(
        first["step"].tolist() == [nan_step] and first["rank"].tolist() == [nan_rank],
        f"first non-finite loss: {first[['rank', 'step']].to_dict('records')}",
    )
    after = bad[bad["step"] > nan_step].groupby("step")["rank"].nunique()
    return (
        f"rank {perturb_rank}'s fingerprints differ from step {perturb_step} on (every "
        f"finite step {steps.min()}-{steps.max()}), no other rank's ever; the first non-finite "
        f"loss is rank {nan_rank}'s alone at step {nan_step}, every rank's from step "
        f"{after.index.min()} on ({len(after)} steps)"
    )


def poor_overlap(trace: Trace) -> str:
    """No collective starts inside backward, and much of the step is communication after it."""
    exposed, overlapping = _exposed_comm(trace)
    _need(overlapping == 0, f"{overlapping:.0%} of all-reduces start inside backward")
    _need(exposed > 0.3, f"only {exposed:.0%} of a step is exposed communication")
    per_step = _after_warmup(trace.collectives).groupby(["rank", "step"]).size()
    return (
        f"all {int(per_step.median())} all-reduces per step start after backward ends "
        f"(0% inside it); exposed communication {exposed:.0%} of step; {_healthy(trace)}"
    )


def fsdp2(trace: Trace) -> str:
    """FSDP2's all-gathers and reduce-scatters, matched across ranks; otherwise healthy."""
    coll = trace.collectives
    ops = coll.pivot_table(index=["group", "seq"], columns="rank", values="op", aggfunc="first")
    _need(ops.notna().all().all(), "some (group, seq) is missing on some rank")
    _need((ops.nunique(axis=1) == 1).all(), "ranks disagree on the op at some (group, seq)")
    counts = ops[ops.columns[0]].value_counts()
    needed = {"all_gather_into_tensor", "reduce_scatter_tensor"}
    _need(needed <= set(counts.index), f"ops: {dict(counts)}")
    _need(set(trace.ranks["model_kind"]) == {"fsdp2"}, "model_kind is not fsdp2")
    return (
        f"{counts['all_gather_into_tensor']} all_gather_into_tensor and "
        f"{counts['reduce_scatter_tensor']} reduce_scatter_tensor, each (group, seq) on every "
        f"rank with the same op; {_healthy(trace, replicas=False)}"
    )


def pipeline(trace: Trace, schedule: str, microbatches: int) -> str:
    """One span per stage, microbatch and action each step; stages idle near the ideal bubble."""
    stages = len(trace.ranks)
    described = {
        (m.pipeline.schedule, m.pipeline.stages, m.pipeline.microbatches)
        for m in trace.meta.values()
        if m.pipeline
    }
    _need(described == {(schedule, stages, microbatches)}, f"meta pipeline: {described}")
    actions = trace.spans[trace.spans["kind"] == "pipeline"]
    per = actions.groupby(["step", "stage", "microbatch", "name"]).size()
    steps = trace.steps["step"].nunique()
    _need((per == 1).all(), "an action recorded twice")
    _need(len(per) == steps * stages * microbatches * 2, f"{len(per)} actions recorded")
    busy = _ms(actions).groupby([actions["rank"], actions["step"]]).sum()
    steps_ms = _after_warmup(trace.steps).set_index(["rank", "step"]).pipe(_ms)
    bubble = (1 - busy.reindex(steps_ms.index) / steps_ms).groupby(level="rank").median()
    ideal = (stages - 1) / (microbatches + stages - 1)
    _need(bubble.min() > 0.8 * ideal, f"bubble by rank {_by_rank(bubble)}, ideal {ideal:.2f}")
    return (
        f"one span per (stage, microbatch, action) in each of {steps} steps; idle share of "
        f"step per stage {bubble.min():.0%}-{bubble.max():.0%} "
        f"(ideal (p-1)/(m+p-1) = {ideal:.0%})"
    )


def slow_stage(trace: Trace, rank: int, microbatches: int) -> str:
    """``rank``'s stage does clearly more work per microbatch than every other stage."""
    actions = _after_warmup(trace.spans[trace.spans["kind"] == "pipeline"])
    per_mb = _ms(actions).groupby([actions["rank"], actions["step"]]).sum() / microbatches
    work = per_mb.groupby(level="rank").median()
    ratio = work / work.drop(rank).median()
    _need(ratio.idxmax() == rank and ratio[rank] > 1.3, f"work by rank: {_by_rank(ratio)}")
    _need(ratio.drop(rank).max() < 1.1, f"the other stages differ: {_by_rank(ratio)}")
    return (
        f"rank {rank}'s stage works {work[rank]:.1f} ms per microbatch (forward + backward), "
        f"{ratio[rank]:.2f}x the others' median ({ratio.drop(rank).min():.3f}-"
        f"{ratio.drop(rank).max():.3f}x); {pipeline(trace, 'Schedule1F1B', microbatches)}"
    )


def slow_link(trace: Trace, ranks: list[int], slowdown: float) -> str:
    """The tensor-parallel group of ``ranks`` takes clearly longer per all-reduce than the
    other; every rank's forward and backward, less that waiting, alike."""
    groups = trace.groups.drop_duplicates("group")
    tp = groups[groups["ranks"].map(lambda r: len(r) == 2 and r[1] - r[0] == 1)]
    slow = tp[tp["ranks"].map(lambda r: list(r) == ranks)]["group"]
    _need(len(tp) == 2 and len(slow) == 1, f"tensor-parallel groups: {tp.to_dict('records')}")
    coll = _after_warmup(trace.collectives)
    coll = coll[coll["group"].isin(tp["group"]) & ~coll["async_op"]]
    call_ms = _ms(coll).groupby(coll["group"]).median()
    ratio = call_ms[slow.iloc[0]] / call_ms.drop(slow.iloc[0]).iloc[0]
    _need(ratio > slowdown / 2, f"all-reduce ms by group: {call_ms.round(2).to_dict()}")
    return (
        f"ranks {ranks[0]} and {ranks[1]}'s tensor-parallel all-reduces take "
        f"{call_ms[slow.iloc[0]]:.2f} ms (median), {ratio:.1f}x the other pair's "
        f"{call_ms.drop(slow.iloc[0]).iloc[0]:.2f} ms"
    )


def comm_bound(trace: Trace) -> str:
    """DDP with one bucket per step whose all-reduce takes longer than the backward before it.
    Its few milliseconds of compute jitter more across ranks on a shared CPU than a long step's."""
    coll = _after_warmup(trace.collectives)
    per_step = coll.groupby(["rank", "step"]).size()
    _need((per_step == 1).all(), f"buckets per step: {sorted(set(per_step))}")
    comm = _ms(coll).median()
    backward = _phase_ms(trace, ["backward"]).median()
    _need(comm > 1.5 * backward, f"all-reduce {comm:.1f} ms against backward {backward:.1f} ms")
    exposed, _ = _exposed_comm(trace)
    return (
        f"one {coll['bytes'].iloc[0] / 1e6:.2f} MB bucket per step; its all-reduce takes "
        f"{comm:.1f} ms (median) against {backward:.1f} ms of backward; exposed communication "
        f"{exposed:.0%} of step; {_healthy(trace, spread=0.5)}"
    )


def gpu_straggler(trace: Trace, rank: int, extra_ms: float) -> str:
    """CUDA events show ``rank``'s forward ``extra_ms`` longer on the GPU, while its host time
    (the launch) is like the others'."""
    _need(len(trace.gpu_spans), "no gpu_spans: not timed on a GPU")
    spans = _after_warmup(trace.gpu_spans)
    forward = spans[(spans["kind"] == "phase") & (spans["name"] == "forward")]
    gpu = ((forward["gpu_end_ns"] - forward["gpu_start_ns"]) / 1e6).groupby(forward["rank"])
    host = _ms(forward).groupby(forward["rank"]).median()
    gpu_ms = gpu.median()
    others = gpu_ms.drop(rank)
    _need(
        gpu_ms[rank] >= others.max() + 0.8 * extra_ms,
        f"rank {rank}'s forward on the GPU is not {extra_ms} ms longer: {_by_rank(gpu_ms)}",
    )
    _need(host.max() < 0.5 * extra_ms, f"the host's forward is not a launch: {_by_rank(host)}")
    return f"forward on the GPU ms {_by_rank(gpu_ms, 1)}; on the host ms {_by_rank(host, 1)}"


def crash_at_start(trace: Trace, rank: int) -> str:
    """``rank`` raised before its first step; the others failed in the collective it left."""
    exception = trace.meta[rank].exception
    _need(exception is not None and exception.step == 0, f"rank {rank}'s exception: {exception}")
    assert exception is not None
    _need(trace.steps[trace.steps["rank"] == rank].empty, f"rank {rank} recorded steps")
    others = trace.ranks[trace.ranks["rank"] != rank]
    _need(others["status"].str.startswith("raised").all(), f"statuses: {list(others['status'])}")
    failed = trace.collectives[trace.collectives["label"].str.endswith("error", na=False)]
    _need(
        set(failed["rank"]) == set(others["rank"]), f"failed collectives on {set(failed['rank'])}"
    )
    return (
        f"rank {rank} raised {exception.message} at step 0 in {exception.function}; "
        f"ranks {', '.join(map(str, others['rank']))} "
        f"{', '.join(sorted(set(others['status'])))} from the all-reduce it never joined"
    )
