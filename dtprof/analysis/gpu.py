"""GPU time of one rank from its kernels: HTA's temporal breakdown and communication overlap.

Rules (the definitions of Holistic Trace Analysis 0.5.0; docs/kineto.md compares them):

- Counted: every kernel, memcpy and memset. When the rank has two profiler steps or more, only
  the ones launched before its last step began (that step may be cut short), as HTA does.
- Span: first start to last end of what is counted. Busy: the union of their intervals;
  idle = span - busy. Compute: the union of compute kernels; non-compute = span - compute - idle
  (communication, memory copies and the rest, where no compute kernel runs).
- Overlap: the time during which a communication kernel and a compute kernel both run (union
  against union), over the union of communication kernels.

Deliberately better than HTA: times keep their nanoseconds, where HTA rounds float timestamps
inward to whole microseconds (start up, end down), which drops sub-microsecond kernels.
All sweeps are sorted numpy passes; nothing loops per kernel.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from dtprof.analysis.columns import values
from dtprof.trace.steps import Steps, step_at

GPU_PHASE = "gpu-compute"
NOTE = (
    "GPU figures follow HTA's definitions (temporal breakdown, communication/computation "
    "overlap) but keep nanoseconds where HTA rounds float timestamps inward to whole "
    "microseconds"
)


def union(
    start: np.ndarray, end: np.ndarray, by_start: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """Merge intervals into sorted disjoint ones (touching intervals merge); ``by_start``: they
    are in order of start already."""
    if len(start) == 0:
        return start.astype(np.int64), end.astype(np.int64)
    if by_start:
        s, e = start, end
    else:
        order = np.argsort(start, kind="stable")
        s, e = start[order], end[order]
    reach = np.maximum.accumulate(e)
    new = np.empty(len(s), bool)
    new[0] = True
    new[1:] = s[1:] > reach[:-1]
    first = np.flatnonzero(new)
    return s[first], np.maximum.reduceat(e, first)


def intersection_ns(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> int:
    """Time inside both unions (each given as disjoint intervals in order): |a| + |b| - |a or
    b|, that union swept over the two lists merged by start (their places found by binary
    search: no sort)."""
    if len(a[0]) == 0 or len(b[0]) == 0:
        return 0
    n, m = len(a[0]), len(b[0])
    from_b = np.zeros(n + m, bool)
    from_b[np.searchsorted(a[0], b[0], side="right") + np.arange(m)] = True
    start, end = np.empty(n + m, np.int64), np.empty(n + m, np.int64)
    start[from_b], end[from_b] = b
    start[~from_b], end[~from_b] = a
    s, e = union(start, end, by_start=True)
    return int((a[1] - a[0]).sum() + (b[1] - b[0]).sum() - (e - s).sum())


class Kernels(NamedTuple):
    """One rank's kernels as the figures read them: arrays, times on rank 0's clock."""

    start_ns: np.ndarray  # int64
    end_ns: np.ndarray  # int64
    step: np.ndarray  # int64, the step of the launch; meaningless where not step_known
    step_known: np.ndarray  # bool: the launch was found
    compute: np.ndarray  # bool: a compute kernel
    communication: np.ndarray  # bool: a communication kernel


def counted(kernels: Kernels, steps: pa.Table) -> np.ndarray:
    """Mask of the kernels the figures count: launched before the last step, with >= 2 steps."""
    step_numbers = values(steps, "step")
    if len(np.unique(step_numbers)) < 2:
        return np.ones(len(kernels.start_ns), bool)
    last = step_numbers[np.argsort(values(steps, "start_ns"), kind="quicksort")[-1]]
    return kernels.step_known & (kernels.step != last)


def kernel_figures(rank: int, kernels: Kernels, steps: pa.Table) -> tuple[pa.Table, pa.Table]:
    """One rank's compute phases (the union of its compute kernels as spans named gpu-compute,
    in the step they begin) and its GPU figures (one row: span, idle, compute, non-compute,
    communication and overlap ns, and shares), from its kernels sorted by start once."""
    order = np.argsort(kernels.start_ns, kind="stable")
    start, end = kernels.start_ns[order], kernels.end_ns[order]
    comp, comm = kernels.compute[order], kernels.communication[order]
    s, e = union(start[comp], end[comp], by_start=True)
    by_start = np.argsort(values(steps, "start_ns"), kind="stable")
    in_order = Steps(*(values(steps, c)[by_start] for c in ("step", "start_ns", "end_ns")))
    phases = pa.table(
        {
            "rank": pa.array(np.full(len(s), rank, np.int32)),
            "step": pa.array(step_at(in_order, s), pa.int64()),
            "name": pa.repeat(GPU_PHASE, len(s)),
            "kind": pa.repeat("phase", len(s)),
            "start_ns": pa.array(s, pa.int64()),
            "end_ns": pa.array(e, pa.int64()),
        }
    )
    keep = counted(kernels, steps)[order]
    return phases, _figures(rank, start[keep], end[keep], comp[keep], comm[keep])


def _figures(
    rank: int, start: np.ndarray, end: np.ndarray, comp: np.ndarray, comm: np.ndarray
) -> pa.Table:
    """The GPU figures of the counted kernels, given in order of start (no columns: none)."""
    if len(start) == 0:
        return pa.table({})
    span = int(end.max() - start.min())
    busy_u = union(start, end, by_start=True)
    busy = int((busy_u[1] - busy_u[0]).sum())
    comp_u = union(start[comp], end[comp], by_start=True)
    comm_u = union(start[comm], end[comm], by_start=True)
    compute = int((comp_u[1] - comp_u[0]).sum())
    communication = int((comm_u[1] - comm_u[0]).sum())
    overlap = intersection_ns(comp_u, comm_u)
    idle = span - busy
    row: dict[str, float] = {
        "rank": rank,
        "kernels": len(start),
        "span_ns": span,
        "idle_ns": idle,
        "compute_ns": compute,
        "non_compute_ns": span - compute - idle,
        "comm_ns": communication,
        "overlap_ns": overlap,
    }
    for name in ("idle", "compute", "non_compute"):
        row[f"{name}_pct"] = 100.0 * row[f"{name}_ns"] / span if span else np.nan
    row["comm_overlap_pct"] = 100.0 * overlap / communication if communication else np.nan
    return pa.table({name: [value] for name, value in row.items()})


GPU_FIELDS = (
    "span_ms",
    "idle_pct",
    "compute_pct",
    "non_compute_pct",
    "comm_ms",
    "comm_overlap_pct",
)


def gpu_summary(gpu: pa.Table) -> dict[str, Any]:
    """The report's ``gpu`` block: per-rank figures (ms and percent) and the definitions note."""
    rows = []
    for r in sorted(gpu.to_pylist(), key=lambda r: r["rank"]):
        row: dict[str, Any] = {"rank": int(r["rank"]), "kernels": int(r["kernels"])}
        row["span_ms"] = round(r["span_ns"] / 1e6, 3)
        row["comm_ms"] = round(r["comm_ns"] / 1e6, 3)
        for name in ("idle_pct", "compute_pct", "non_compute_pct", "comm_overlap_pct"):
            value = r[name]
            row[name] = None if value is None or np.isnan(value) else round(float(value), 2)
        rows.append(row)
    return {"gpu": {"ranks": rows, "definitions": NOTE}}
