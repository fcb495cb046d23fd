"""What a recorded 2-rank DDP job with a slow rank 1 must show, however it was recorded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import dtprof
from dtprof.analysis import analyze
from dtprof.analysis.render import text


def recorded_as_a_user_expects(
    trace_dir: Path, steps: int, samples: int, tokens: int | None = None
) -> None:
    """Both ranks, a step per optimizer step with its two micro-batches, the loss each step,
    the DDP wrapper as the model, the ``samples`` (and ``tokens``) of each step, one count of
    its FLOPs, and the slow rank named with the throughput it costs."""
    assert sorted(p.name for p in trace_dir.iterdir()) == ["rank=00000", "rank=00001"]
    trace = dtprof.load_trace(trace_dir)
    assert trace.steps.groupby("rank").size().tolist() == [steps, steps]
    forward = trace.spans[trace.spans["name"] == "forward"]
    assert (forward.groupby(["rank", "step"]).size() == 2).all()
    loss = trace.scalars[trace.scalars["name"] == "loss"]
    assert len(loss) == 2 * steps and (loss["value"] > 0).all()
    meta = json.loads((trace_dir / "rank=00001" / "meta.json").read_text())
    assert meta["model_kind"] == "ddp" and meta["status"] == "finished"
    counted = trace.scalars[trace.scalars["name"] == "samples"]
    assert len(counted) == 2 * steps and (counted["value"] == samples).all()
    counted = trace.scalars[trace.scalars["name"] == "tokens"]
    assert counted["value"].tolist() == ([tokens] * 2 * steps if tokens else [])
    assert meta["model_flops"]["per_step"] > 0 and meta["model_flops"]["samples"] == samples
    report = analyze(trace_dir)
    stragglers = [f for f in report.findings if f.code == "straggler"]
    assert [f.ranks for f in stragglers] == [[1]], text(report)
    rate, evidence = report.summary["throughput"], stragglers[0].evidence
    assert rate["samples_per_s"] > 0 and evidence["samples_per_s"] > 0
    assert evidence["samples_per_s_if_fixed"] == pytest.approx(
        evidence["samples_per_s"] * evidence["speedup_if_fixed"], rel=1e-3
    )
    message = stragglers[0].message
    assert " samples/s" in message and message.endswith(" tokens/s)" if tokens else " samples/s)")
