"""poor-overlap and communication-bound: communication that runs while no compute does.

Rule: per rank, communication time is the union of the transfer intervals of its collectives
(those every member of their group recorded), each from the moment the last member entered
(waiting for a late rank is the straggler's, not overlap's); overlapped time is the part of it
during a forward, backward or optimizer phase (HTA's definition: overlapped / all
communication), and exposed time the rest, as a share of the step.

The job's exposure is read on its critical path: each rank's exposed share weighted by how often
it arrived last at the collectives (a tie counts for every rank in it; straggler's
last_arrival_shares). The rank that arrives last decides when a transfer runs; a rank that
waits for a late one sees every transfer after its own compute has ended, exposed because of
the straggler, not because the job cannot overlap. Flagged at >= 25% (warning; >= 50%: error),
on the ranks exposed at least that much that arrived last at some collective. The first steps
(10%, at least 2) are skipped, and at least MIN_STEPS must remain: the exposure of a step or
two (a job that stopped early) says nothing of how the job overlaps.

Not all exposure is overlap's to fix. For DDP (buckets reduced under backward) and FSDP
(gathers and scatters under forward and backward), communication at least as long as the
compute it could run under bounds the step however well it overlaps: the finding is then
communication-bound (info: the job's shape, amortized by more compute per byte), else
poor-overlap, its suggestion read from the buckets DDP used. Other jobs get poor-overlap: how
they issue their collectives (one per tensor, after backward) sets how long those take.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from dtprof.analysis.arrivals import last_arrival_shares
from dtprof.analysis.columns import group_sum, groups, rows, values, warmup_steps
from dtprof.analysis.overlap import comm_overlap
from dtprof.analysis.report import Finding
from dtprof.analysis.summarize import COMPUTE_PHASES, RunSummary

WARN_EXPOSED = 0.25
ERROR_EXPOSED = 0.50
MIN_STEPS = 5  # analysed steps at least, as straggler asks
# what a model's communication can run under, where the wrapper says how it communicates: DDP
# reduces buckets as backward makes them, FSDP gathers and scatters around forward and backward
HIDING = {"ddp": ("backward",), "fsdp2": ("forward", "backward")}


def check(run: RunSummary) -> list[Finding]:
    if not (run.collectives.num_rows and run.phases.num_rows and run.steps.num_rows):
        return []
    step = values(run.steps, "step")
    skip = warmup_steps(step)
    if len(np.unique(step[step >= skip])) < MIN_STEPS:
        return []
    compute = rows(run.phases, values(run.phases, "step") >= skip)
    per = comm_overlap(run, skip, compute.select(["rank", "start_ns", "end_ns"]))
    if not per:
        return []
    ranks = np.array(list(per), np.int64)
    comm_ns, overlap_ns = (np.array(c, np.float64) for c in zip(*per.values(), strict=True))
    steps = rows(run.steps, values(run.steps, "step") >= skip)
    step_ns = _per_rank_sum(values(steps, "rank"), values(steps, "step_ns", np.float64), ranks)
    kinds = {m.model_kind for m in run.meta.values()}
    kind = str(kinds.pop()) if len(kinds) == 1 else ""
    ddp = kind == "ddp"
    hiding = rows(compute, np.isin(values(compute, "name"), HIDING.get(kind, COMPUTE_PHASES)))
    length = values(hiding, "end_ns", np.float64) - values(hiding, "start_ns", np.float64)
    hide_ns = _per_rank_sum(values(hiding, "rank"), length, ranks)
    shares = last_arrival_shares(run, skip)
    weight = np.array([shares.get(r, 0.0) for r in per], np.float64)
    if weight.sum() <= 0:
        return []
    exposed_ns = comm_ns - overlap_ns
    # what even perfect overlap leaves exposed: communication longer than the compute it
    # could run under
    unavoidable_ns = np.minimum(np.maximum(comm_ns - np.nan_to_num(hide_ns), 0), exposed_ns)
    with np.errstate(all="ignore"):
        overlap_fraction = np.where(comm_ns > 0, overlap_ns / comm_ns, np.nan)
        exposed_fraction = exposed_ns / step_ns
        unavoidable_fraction = unavoidable_ns / step_ns

    def on_critical_path(fraction: np.ndarray) -> float:
        # a rank without a figure (no transfer, no step time) adds nothing
        return float(np.nansum(_nan_to_zero(fraction) * weight) / weight.sum())

    exposed = on_critical_path(exposed_fraction)
    if exposed < WARN_EXPOSED:
        return []
    unavoidable = on_critical_path(unavoidable_fraction)
    overlap = on_critical_path(overlap_fraction)
    analysed = np.unique(values(steps, "step"))
    n_steps = max(len(analysed), 1)
    figures = Exposure(
        ranks=ranks,
        weight=weight,
        exposed=exposed,
        unavoidable=unavoidable,
        overlap=overlap,
        comm_ms=on_critical_path(comm_ns / n_steps) / 1e6,
        hide_ms=on_critical_path(np.nan_to_num(hide_ns) / n_steps) / 1e6,
        hiding_phase="backward" if ddp else "forward and backward" if kind in HIDING else "compute",
        buckets=_ddp_buckets(run, skip) if ddp else None,
        per_rank={
            r: {
                "overlap_fraction": round(o, 4),
                "exposed_comm_fraction": round(e, 4),
                "unavoidable_exposed_fraction": round(u, 4),
                "last_arrival_share": round(w, 4),
            }
            for r, o, e, u, w in zip(
                ranks.tolist(),
                overlap_fraction.tolist(),
                exposed_fraction.tolist(),
                unavoidable_fraction.tolist(),
                weight.tolist(),
                strict=True,
            )
        },
    )
    first, last = int(analysed[0]), int(analysed[-1])
    if kind in HIDING and figures.comm_ms >= figures.hide_ms:
        return [_communication_bound(figures, exposed_fraction, first, last)]
    return [_poor_overlap(figures, exposed_fraction, first, last)]


@dataclass(frozen=True)
class Exposure:
    """How exposed communication is on the critical path, and how much of it overlap could
    hide: the figures both findings give."""

    ranks: np.ndarray
    weight: np.ndarray  # per rank: its share of last arrivals
    exposed: float  # share of the step
    unavoidable: float  # share of the step left exposed even with perfect overlap
    overlap: float  # share of communication under compute
    comm_ms: float  # per step
    hide_ms: float  # compute per step that communication could run under
    hiding_phase: str
    buckets: dict[str, float] | None  # DDP: buckets a step, MB a step, the largest's MB
    per_rank: dict[int, dict[str, float]]

    def evidence(self) -> dict[str, Any]:
        return {
            "overlap_fraction": round(self.overlap, 4),
            "exposed_comm_fraction": round(self.exposed, 4),
            "unavoidable_exposed_fraction": round(self.unavoidable, 4),
            "comm_ms_per_step": round(self.comm_ms, 3),
            f"{self.hiding_phase}_ms_per_step": round(self.hide_ms, 3),
            "ddp_buckets": self.buckets,
            "per_rank": self.per_rank,
        }


def _exposed_ranks(figures: Exposure, fraction: np.ndarray) -> list[int]:
    return sorted(figures.ranks[(fraction >= WARN_EXPOSED) & (figures.weight > 0)].tolist())


def _poor_overlap(figures: Exposure, fraction: np.ndarray, first: int, last: int) -> Finding:
    ranks = _exposed_ranks(figures, fraction)
    fixable = figures.exposed - figures.unavoidable
    b = figures.buckets
    if b is None:
        suggestion = (
            "let communication start while compute still runs: DDP's gradient buckets, or "
            "async collectives launched as soon as their input is ready and waited on only "
            "when their result is needed (FSDP: forward and backward prefetch)"
        )
    elif b["largest_mb"] >= 0.5 * b["total_mb"]:
        one = "every gradient" if b["per_step"] <= 1 else f"{b['largest_mb']:.2f} of its"
        suggestion = (
            f"DDP put {one} {b['total_mb']:.2f} MB of gradients a step in one bucket, ready only "
            f"when backward is (nearly) done: lower bucket_cap_mb to about "
            f"{b['total_mb'] / 4:.2g} so that buckets are reduced while backward goes on"
        )
    else:
        suggestion = (
            f"DDP's {b['per_step']:.0f} buckets a step (the largest {b['largest_mb']:.2f} MB) "
            "are reduced after backward: look for what delays them (find_unused_parameters, a "
            "comm hook that waits, gradients made ready in one go by a custom autograd "
            "function), or try static_graph=True"
        )
    return Finding(
        code="poor-overlap",
        severity="error" if figures.exposed >= ERROR_EXPOSED else "warning",
        ranks=ranks,
        first_step=first,
        last_step=last,
        message=(
            f"communication is exposed for {figures.exposed:.0%} of each step on the critical "
            f"path ({len(ranks)} rank(s)): only {figures.overlap:.0%} of its "
            f"{figures.comm_ms:.1f} ms a step runs while compute does, though it could run under "
            f"{figures.hide_ms:.1f} ms of {figures.hiding_phase}; better overlap would win back "
            f"about {fixable:.0%} of the step"
        ),
        suggestion=suggestion,
        evidence=figures.evidence(),
    )


def _communication_bound(figures: Exposure, fraction: np.ndarray, first: int, last: int) -> Finding:
    ranks = _exposed_ranks(figures, fraction)
    b = figures.buckets
    used = ""
    if b is not None:
        used = f" (DDP, {b['per_step']:.0f} bucket(s), {b['total_mb']:.2f} MB a step)"
    return Finding(
        code="communication-bound",
        severity="info",
        ranks=ranks,
        first_step=first,
        last_step=last,
        message=(
            f"communication takes {figures.comm_ms:.1f} ms a step{used} against "
            f"{figures.hide_ms:.1f} ms of {figures.hiding_phase} it could run under: it is "
            f"exposed for {figures.exposed:.0%} of each step on the critical path, and even "
            f"perfect overlap would leave {figures.unavoidable:.0%} of the step exposed"
        ),
        suggestion=(
            "make each step do more compute per byte communicated: a larger per-rank batch "
            "(compute grows, gradient bytes do not), gradient accumulation over several "
            "micro-batches with model.no_sync() (one all-reduce per optimizer step), or fewer "
            "bytes (a bf16 compression comm hook)"
        ),
        evidence=figures.evidence(),
    )


def _per_rank_sum(rank: np.ndarray, x: np.ndarray, ranks: np.ndarray) -> np.ndarray:
    """Per rank of ``ranks``, the sum of x over its rows (NaN skipped; NaN for a rank with no
    rows)."""
    (present,), inverse = groups(rank)
    total = group_sum(inverse, len(present), x)
    at = np.searchsorted(present, ranks)
    found = (at < len(present)) & (present[np.minimum(at, len(present) - 1)] == ranks)
    out = np.full(len(ranks), np.nan)
    out[found] = total[at[found]]
    return out


def _ddp_buckets(run: RunSummary, first_step: int) -> dict[str, float] | None:
    """DDP's gradient buckets as recorded, medians over ranks and steps: buckets a step, MB a
    step and the largest bucket's MB; None when no bucket was recorded."""
    coll = run.collectives
    label = values(coll, "label")
    is_bucket = np.array([isinstance(x, str) and x.startswith("ddp.bucket") for x in label])
    keep = is_bucket & (values(coll, "step") >= first_step)
    if not keep.any():
        return None
    buckets = rows(coll, keep)
    (_, _), inverse = groups(values(buckets, "rank"), values(buckets, "step"))
    size = values(buckets, "bytes", np.float64)
    largest = np.zeros(int(inverse.max()) + 1)
    np.maximum.at(largest, inverse, size)
    return {
        "per_step": float(np.median(np.bincount(inverse))),
        "total_mb": float(np.median(np.bincount(inverse, weights=size))) / 1e6,
        "largest_mb": float(np.median(largest)) / 1e6,
    }


def _nan_to_zero(x: np.ndarray) -> np.ndarray:
    """x with 0 for NaN (infinities kept)."""
    return np.where(np.isnan(x), 0.0, x)
