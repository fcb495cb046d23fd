"""Two runs compared: did a change make training faster or slower, where, and is it real?

Each run is analysed whole (recorded traces and profiler traces alike). Compared:

- **The step and its split**, per step after warm-up (the checks' rule): the step's time and
  its compute, exposed communication (transfers no compute phase covers), data and the rest
  (waiting, idle), each step's value the median over the ranks.
- **Per rank**, for ranks in both runs: each rank's step and compute time, the same way.
- **Throughput** (samples/s, tokens/s), **memory** (the largest resident and CUDA figures of
  any rank), **bandwidth** per group, op and message size (dtprof.analysis.bandwidth), the
  **GPU figures** of profiler traces per rank (HTA's; of the whole trace where it has no
  steps), and the **findings** that appeared or went away (by code and ranks).

A change is called only when it is real and larger than the runs' own noise: the two runs'
per-step values differ by a two-sided Mann-Whitney U test (normal approximation, ties
corrected) at p < ALPHA, and the medians differ by more than the noise band: what a step of
one run and a step of the other differ by 95% of the time under noise alone, 1.96 x the root of
the sum of the two runs' squared spreads (each 1.4826 x its median absolute deviation: the
standard deviation of normal noise) and by at least 1% of the base run's step. A part of the
step that varies little (a data phase of 0.2 ms in a 70 ms step) can drift between runs by more
than its steps vary, and a change that small moves no one's training. Throughput, memory and
bandwidth are point figures: shown with their change, never called.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from dtprof.analysis.bandwidth import bandwidth_rows
from dtprof.analysis.columns import rows, values, warmup_steps
from dtprof.analysis.measures import rank_steps
from dtprof.analysis.report import Report
from dtprof.analysis.summarize import RunSummary

ALPHA = 0.01
MAD_TO_SIGMA = 1.4826
BAND_Z = 1.96  # the two-sided 95% band of a normal difference
MIN_STEP_SHARE = 0.01  # the smallest change called, as a share of the base run's step
METRICS = ("step_ms", "compute_ms", "exposed_comm_ms", "data_ms", "other_ms")
RANK_METRICS = ("step_ms", "compute_ms")
TEST = (
    f"two-sided Mann-Whitney U over the steps after warm-up, p < {ALPHA}, and a change of the "
    f"median larger than the noise band: {BAND_Z} x the two runs' step-to-step spreads "
    f"({MAD_TO_SIGMA} x MAD each) added in quadrature, what two steps differ by 95% of the "
    f"time, and at least {MIN_STEP_SHARE:.0%} of the base run's step"
)


def mann_whitney_p(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sided p-value of the Mann-Whitney U test (normal approximation with the tie
    correction; continuity corrected); 1.0 where either sample is empty or all values tie."""
    n1, n2 = len(a), len(b)
    if not n1 or not n2:
        return 1.0
    both = np.concatenate([a, b])
    order = np.argsort(both, kind="mergesort")
    ranked = np.empty(len(both))
    ranked[order] = np.arange(1, len(both) + 1)
    _, inverse, counts = np.unique(both, return_inverse=True, return_counts=True)
    ranked = np.bincount(inverse, weights=ranked)[inverse] / counts[inverse]  # ties: mean rank
    u = ranked[:n1].sum() - n1 * (n1 + 1) / 2
    n = n1 + n2
    ties = float((counts**3 - counts).sum())
    variance = n1 * n2 / 12 * ((n + 1) - ties / (n * (n - 1)))
    if variance <= 0:
        return 1.0
    z = (abs(u - n1 * n2 / 2) - 0.5) / math.sqrt(variance)
    return float(math.erfc(max(z, 0.0) / math.sqrt(2)))


def spread(x: np.ndarray) -> float:
    """Step-to-step noise: 1.4826 x the median absolute deviation."""
    return MAD_TO_SIGMA * float(np.median(np.abs(x - np.median(x)))) if len(x) else math.nan


def compare(base: np.ndarray, new: np.ndarray, least: float = 0.0) -> dict[str, Any]:
    """Medians, the change, the band it must pass (the noise, and at least ``least``), the
    test's p and whether the change is called."""
    base, new = base[~np.isnan(base)], new[~np.isnan(new)]
    if not len(base) or not len(new):
        return {"base": None, "new": None, "called": False}
    b, n = float(np.median(base)), float(np.median(new))
    noise = max(BAND_Z * math.hypot(spread(base), spread(new)), least)
    p = mann_whitney_p(base, new)
    called = p < ALPHA and abs(n - b) > noise
    return {
        "base": round(b, 3),
        "new": round(n, 3),
        "change_pct": _pct(b, n),
        "noise_pct": round(100 * noise / b, 2) if b else None,
        "p": float(f"{p:.3g}"),
        "steps": [len(base), len(new)],
        "called": bool(called),
    }


def _pct(base: float | None, new: float | None) -> float | None:
    if base is None or new is None or not base or math.isnan(base) or math.isnan(new):
        return None
    return round(100 * (new - base) / base, 2)


def per_step(run: RunSummary) -> pd.DataFrame:
    """Per rank and step after warm-up: rank, step and the METRICS in ms (exposed
    communication where collectives were matched, else zero)."""
    data = pd.DataFrame({c: values(run.steps, c) for c in ("rank", "step", "data_ns")})
    frame = rank_steps(run).merge(data, on=["rank", "step"], how="left")
    frame = frame[frame["step"] >= warmup_steps(frame["step"].to_numpy())]
    ms = frame[["step_ns", "compute_ns", "data_ns"]].to_numpy(np.float64) / 1e6
    exposed = (frame["comm_ns"] - frame["overlap_ns"]).to_numpy(np.float64) / 1e6
    other = ms[:, 0] - np.nan_to_num(ms[:, 1]) - exposed - np.nan_to_num(ms[:, 2])
    return pd.DataFrame(
        {
            "rank": frame["rank"].to_numpy(np.int64),
            "step": frame["step"].to_numpy(np.int64),
            "step_ms": ms[:, 0],
            "compute_ms": ms[:, 1],
            "exposed_comm_ms": exposed,
            "data_ms": ms[:, 2],
            "other_ms": other,
        }
    )


def diff(base: tuple[RunSummary, Report], new: tuple[RunSummary, Report]) -> dict[str, Any]:
    """The comparison of two analysed runs (module doc), as the JSON ``dtprof diff`` writes."""
    (base_run, base_report), (new_run, new_report) = base, new
    b, n = per_step(base_run), per_step(new_run)
    b_steps = b.groupby("step")[list(METRICS)].median()  # each step: its median over the ranks
    n_steps = n.groupby("step")[list(METRICS)].median()
    least = MIN_STEP_SHARE * float(np.nanmedian(b_steps["step_ms"])) if len(b_steps) else 0.0
    return {
        "base": _about(base_report, b_steps),
        "new": _about(new_report, n_steps),
        "test": TEST,
        "metrics": {
            m: compare(b_steps[m].to_numpy(), n_steps[m].to_numpy(), least) for m in METRICS
        },
        "ranks": _ranks(b, n),
        "throughput": _throughput(base_report, new_report),
        "memory": _memory(base_run, new_run),
        "bandwidth": _bandwidth(base_run, new_run),
        "gpu": _gpu(base_report, new_report),
        "findings": _findings(base_report, new_report),
    }


GPU_FIGURES = ("span_ms", "idle_pct", "compute_pct", "non_compute_pct", "comm_overlap_pct")


def _gpu(base: Report, new: Report) -> list[dict[str, Any]]:
    """Per rank in both profiler traces, HTA's figures of each (dtprof.analysis.gpu): the whole
    trace's where it has no steps."""

    def by_rank(report: Report) -> dict[int, dict[str, Any]]:
        return {r["rank"]: r for r in (report.summary.get("gpu") or {}).get("ranks", [])}

    b, n = by_rank(base), by_rank(new)
    return [
        {"rank": rank, **{k: {"base": b[rank].get(k), "new": n[rank].get(k)} for k in GPU_FIGURES}}
        for rank in sorted(set(b) & set(n))
    ]


def _about(report: Report, steps: pd.DataFrame) -> dict[str, Any]:
    return {
        "path": report.trace["path"],
        "ranks": len(report.trace["ranks_analysed"]),
        "steps_compared": len(steps),
    }


def _ranks(b: pd.DataFrame, n: pd.DataFrame) -> list[dict[str, Any]]:
    """Per rank in both runs, the called changes of RANK_METRICS (the rank's own steps; at
    least MIN_STEP_SHARE of its step in the base run)."""
    out = []
    b_by, n_by = dict(tuple(b.groupby("rank"))), dict(tuple(n.groupby("rank")))
    for rank in sorted(set(b_by) & set(n_by)):
        least = MIN_STEP_SHARE * float(np.nanmedian(b_by[rank]["step_ms"]))
        for metric in RANK_METRICS:
            base, new = b_by[rank][metric].to_numpy(), n_by[rank][metric].to_numpy()
            result = compare(base, new, least)
            if result["called"]:
                out.append({"rank": int(rank), "metric": metric, **result})
    return out


def _throughput(base: Report, new: Report) -> dict[str, Any]:
    out = {}
    for key in ("samples_per_s", "tokens_per_s", "mfu_pct"):
        b = (base.summary.get("throughput") or {}).get(key)
        n = (new.summary.get("throughput") or {}).get(key)
        if b is not None or n is not None:
            out[key] = {"base": b, "new": n, "change_pct": _pct(b, n)}
    return out


def _memory(base: RunSummary, new: RunSummary) -> dict[str, Any]:
    """The largest reading of each memory metric over every rank and step, in MiB."""
    out = {}
    for metric in ("rss_bytes", "cuda_allocated_bytes", "cuda_reserved_bytes"):
        b, n = _largest(base.memory, metric), _largest(new.memory, metric)
        if b is not None or n is not None:
            name = metric.replace("_bytes", "_mib")
            out[name] = {"base": b, "new": n, "change_pct": _pct(b, n)}
    return out


def _largest(memory: pa.Table, metric: str) -> float | None:
    if not memory.num_rows:
        return None
    these = rows(memory, values(memory, "metric") == metric)
    return round(float(values(these, "value").max()) / 2**20, 1) if these.num_rows else None


def _bandwidth(base: RunSummary, new: RunSummary) -> list[dict[str, Any]]:
    """Per group, op and size band in both runs: the median time and bus bandwidth of each
    (recomputed: the reports' rows are rounded, too coarse for the change of a slow link)."""
    key = ("group", "op", "band")
    b = {
        tuple(r[k] for k in key): r
        for r in bandwidth_rows(base.matched, collectives=base.collectives)
    }
    out = []
    for row in bandwidth_rows(new.matched, collectives=new.collectives):
        old = b.get(tuple(row[k] for k in key))
        if old is None:
            continue
        out.append(
            {
                **{k: row[k] for k in key},
                "time_ms": {"base": round(old["time_ms"], 3), "new": round(row["time_ms"], 3)},
                "busbw_gbs": {
                    "base": round(old["busbw_gbs"], 3),
                    "new": round(row["busbw_gbs"], 3),
                },
                "busbw_change_pct": _pct(old["busbw_gbs"], row["busbw_gbs"]),
            }
        )
    return out


def _findings(base: Report, new: Report) -> dict[str, list[dict[str, Any]]]:
    """Findings by code and ranks: those only in the new run, and those only in the base."""

    def keyed(report: Report) -> dict[tuple[str, tuple[int, ...]], Any]:
        return {(f.code, tuple(f.ranks)): f for f in report.findings}

    b, n = keyed(base), keyed(new)

    def brief(f: Any) -> dict[str, Any]:
        return {"code": f.code, "severity": f.severity, "ranks": f.ranks, "message": f.message}

    return {
        "appeared": [brief(f) for k, f in n.items() if k not in b],
        "went_away": [brief(f) for k, f in b.items() if k not in n],
    }


def regression(result: dict[str, Any], metric: str, limit_pct: float) -> dict[str, Any]:
    """Whether ``metric`` got worse (longer) by more than ``limit_pct`` with the change called."""
    m = result["metrics"][metric]
    change = m.get("change_pct")
    failed = bool(m["called"] and change is not None and change > limit_pct)
    return {"metric": metric, "limit_pct": limit_pct, "change_pct": change, "failed": failed}
