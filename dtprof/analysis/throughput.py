"""Throughput and MFU of a recorded run: samples and tokens per second, and the model FLOPs of
each step against the device's peak (docs/throughput.md).

Per rank, over the steps after warm-up that have the figure: samples/s is the sum of the
steps' ``samples`` over the sum of their times (tokens/s alike). The job's figure is the sum
over the ranks: right where each rank trains on its own batch (data parallelism, FSDP); where
several ranks see one batch (tensor parallelism), divide by their number.

FLOPs per step: the ``flops`` a script logged, else the rank's one count (meta.json's
``model_flops``) scaled to each step's tokens, or samples, where the count has them; where that
count found no FLOPs, 6 x parameters x tokens (the rule for decoder transformers). MFU is the
FLOPs per second over the peak of the rank's device in its compute dtype (dtprof.analysis.peaks,
or a peak the user states); there is none on CPU.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dtprof.analysis.columns import group_median, groups, rows, values, warmup_steps
from dtprof.analysis.peaks import peak_tflops
from dtprof.analysis.summarize import RunSummary
from dtprof.trace.meta import ModelFlops, RankMeta

NAMES = ("samples", "tokens", "flops")


def step_work(run: RunSummary) -> dict[str, np.ndarray] | None:
    """The analysed steps (after warm-up) of every rank: rank, step, step_ns, ``at`` (the
    rank's place in ``ranks``, its sorted ranks), and per name of NAMES the rank's value at that
    step (NaN where it has none); None where no rank has any of them."""
    scalars = run.scalars
    if scalars.num_rows:
        scalars = scalars.filter(pc.is_in(scalars.column("name"), pa.array(NAMES)))
    counted = {r: m.model_flops for r, m in run.meta.items() if m.model_flops is not None}
    if not scalars.num_rows and not counted:
        return None
    steps = run.steps
    step = values(steps, "step")
    steps = rows(steps, step >= warmup_steps(step)) if len(step) else steps
    (ranks,), at = groups(values(steps, "rank").astype(np.int64))
    out = {
        "ranks": ranks,
        "at": at,
        "step": values(steps, "step").astype(np.int64),
        "step_ns": values(steps, "step_ns", np.float64),
    }
    span = int(out["step"].max()) + 1 if len(out["step"]) else 1
    key = ranks[at] * span + out["step"]
    order = np.argsort(key)
    for name in NAMES:
        column = np.full(len(key), np.nan)
        these = rows(scalars, values(scalars, "name") == name) if scalars.num_rows else scalars
        if these.num_rows:
            s_key = values(these, "rank").astype(np.int64) * span + values(these, "step")
            place = np.minimum(np.searchsorted(key[order], s_key), max(len(key) - 1, 0))
            found = key[order][place] == s_key if len(key) else np.zeros(len(s_key), bool)
            column[order[place[found]]] = values(these, "value", np.float64)[found]
        out[name] = column
    _counted_flops(counted, out)
    return out


def _counted_flops(counted: dict[int, ModelFlops], work: dict[str, np.ndarray]) -> None:
    """Where a rank logged no ``flops``, its count scaled to each step (in place): to the
    step's tokens where the count and the step have them, else to its samples alike."""
    ranks = work["ranks"]
    nan = np.full(len(ranks), np.nan)
    per_step, samples, tokens, parameters = nan.copy(), nan.copy(), nan.copy(), nan.copy()
    for i, r in enumerate(ranks.tolist()):
        count = counted.get(r)
        if count is not None:
            per_step[i] = count.per_step
            samples[i] = count.samples or np.nan
            tokens[i] = count.tokens or np.nan
            parameters[i] = count.parameters or np.nan
    at = work["at"]
    flops = per_step[at]
    for seen, in_count in ((work["samples"], samples[at]), (work["tokens"], tokens[at])):
        scaled = flops * seen / in_count
        flops = np.where(np.isnan(scaled), flops, scaled)  # tokens last: they win
    by_rule = 6.0 * parameters[at] * work["tokens"]  # where the count found no FLOPs
    flops = np.where(per_step[at] > 0, flops, by_rule)
    work["flops"] = np.where(np.isnan(work["flops"]), flops, work["flops"])


def flops_source(meta: dict[int, RankMeta], work: dict[str, np.ndarray]) -> str | None:
    """How the FLOPs were had: logged, counted, or 6 x parameters x tokens."""
    counts = [m.model_flops for m in meta.values() if m.model_flops is not None]
    if not counts:
        return "logged" if not np.isnan(work["flops"]).all() else None
    if all(c.per_step > 0 for c in counts):
        return f"counted: {counts[0].method}"
    return "6 x parameters x tokens"


def rate(work: dict[str, np.ndarray], name: str) -> np.ndarray:
    """Per rank (of ``work["ranks"]``): the sum of ``name`` over its steps that have it, per
    second of those steps (NaN where it has none)."""
    known = ~np.isnan(work[name])
    n = len(work["ranks"])
    at = work["at"][known]
    total = np.bincount(at, weights=work[name][known], minlength=n)
    seconds = np.bincount(at, weights=work["step_ns"][known], minlength=n) / 1e9
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(seconds > 0, total / seconds, np.nan)


def throughput(run: RunSummary, stated_peak_tflops: float | None = None) -> dict[str, Any] | None:
    """The summary's ``throughput``: per rank and for the job; None where no rank has samples,
    tokens or FLOPs."""
    work = step_work(run)
    if work is None or all(np.isnan(work[name]).all() for name in NAMES):
        return None
    ranks = work["ranks"]
    per_second = {name: rate(work, name) for name in NAMES}
    peaks = [_peak(run.meta.get(int(r)), stated_peak_tflops) for r in ranks.tolist()]
    tflops = per_second["flops"] / 1e12
    mfu = np.array([t / p[0] if p else np.nan for t, p in zip(tflops, peaks, strict=True)])
    per_step = group_median(work["at"], len(ranks), work["flops"])
    known_peaks = {p[1] for p in peaks if p}
    return {
        "samples_per_s": _total(per_second["samples"]),
        "tokens_per_s": _total(per_second["tokens"]),
        "tflop_per_step": _round(float(np.nanmedian(per_step)) / 1e12 if _any(per_step) else None),
        "flops_from": flops_source(run.meta, work),
        "tflops_per_rank": _round(float(np.nanmean(tflops)) if _any(tflops) else None),
        "peak_tflops": _round(peaks[0][0]) if len(known_peaks) == 1 and peaks[0] else None,
        "peak_of": ", ".join(sorted(known_peaks)) or None,
        "mfu_pct": _round(float(np.nanmean(mfu)) * 100 if _any(mfu) else None),
        "ranks": [
            {
                "rank": int(r),
                "samples_per_s": _round(per_second["samples"][i]),
                "tokens_per_s": _round(per_second["tokens"][i]),
                "tflops": _round(tflops[i]),
                "mfu_pct": _round(mfu[i] * 100),
            }
            for i, r in enumerate(ranks.tolist())
        ],
    }


def job_rates(run: RunSummary, steps: np.ndarray) -> dict[str, float]:
    """The job's samples/s and tokens/s over the given steps (those it has)."""
    work = step_work(run)
    if work is None:
        return {}
    keep = np.isin(work["step"], steps)
    work = {name: column if name == "ranks" else column[keep] for name, column in work.items()}
    out = {}
    for name in ("samples", "tokens"):
        total = _total(rate(work, name))
        if total is not None:
            out[f"{name}_per_s"] = total
    return out


def rate_text(value: float) -> str:
    """A rate as the reports, findings and dashboard show it: ``1,234`` from 100 on, else three
    significant digits (``3.27``)."""
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _peak(meta: RankMeta | None, stated: float | None) -> tuple[float, str] | None:
    if stated is not None:
        return stated, "--peak-tflops"
    if meta is None:
        return None
    name = meta.device_name or (meta.nvml.name if meta.nvml else None)
    dtype = meta.model_flops.dtype if meta.model_flops else None
    return peak_tflops(name, dtype)


def _any(x: Any) -> bool:
    return bool(np.isfinite(np.asarray(x, np.float64)).any())


def _total(per_rank: np.ndarray) -> float | None:
    return _round(float(np.nansum(per_rank))) if _any(per_rank) else None


def _round(value: float | None) -> float | None:
    if value is None or not np.isfinite(value):
        return None
    return float(f"{value:.4g}") if abs(value) < 1e4 else round(float(value), 1)
