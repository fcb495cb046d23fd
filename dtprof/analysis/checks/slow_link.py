"""slow-link: a process group whose transfers run far slower than those of its peers, the groups
of the same shape that move the same data.

Rule: per group, op and message-size band (dtprof.analysis.bandwidth: bus bandwidth from the
last member's arrival to completion, so a late rank's waiting is not counted), the median bus
bandwidth of its calls after the first steps (10%, at least 2), with at least MIN_CALLS of them.
Its peers are the other groups with the same op, band, group size, rank strides (the gaps
between the sorted ranks: the groups of one DeviceMesh dimension share them; point-to-point,
the step from sender to receiver) and number of hosts, so that an intra-node group is never
held against one that crosses nodes. A group is slow when its median is <= 0.5x the median of
its peers' medians. The cost is a what-if: each of its calls at the peers' bandwidth (its time
x own / peers' median), the time saved summed per step, median over the steps; a warning when
that is >= 5% of the median step, an error at >= 25%, else info. It is an upper bound: a
transfer hidden under compute costs less than it takes.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from dtprof.analysis.bandwidth import Transfers, band_label, transfers
from dtprof.analysis.columns import values, warmup_steps
from dtprof.analysis.report import Finding
from dtprof.analysis.summarize import RunSummary

SLOW_RATIO = 0.5
MIN_CALLS = 10
WARN_COST = 0.05
ERROR_COST = 0.25


def check(run: RunSummary) -> list[Finding]:
    step_no = values(run.steps, "step")
    if not len(step_no):
        return []
    skip = warmup_steps(step_no)
    analysed = step_no >= skip
    step_ms = float(np.nanmedian(values(run.steps, "step_ns", np.float64)[analysed])) / 1e6
    hosts = {r: m.host or "" for r, m in run.meta.items()}
    families: dict[tuple, list[tuple[Transfers, np.ndarray]]] = defaultdict(list)
    for x in transfers(run.matched, (skip, None), run.collectives):
        bands = x.band
        for band in np.unique(bands).tolist():
            at = bands == band
            if at.sum() < MIN_CALLS:
                continue
            shape = (x.op, len(x.ranks), int(band), tuple(np.diff(x.ranks).tolist()))
            families[(*shape, len({hosts.get(r, "") for r in x.ranks}))].append((x, at))
    findings = []
    for key, members in families.items():
        if len(members) < 2:
            continue
        medians = np.array([float(np.median(x.busbw[at])) for x, at in members])
        for i, (x, at) in enumerate(members):
            peers = float(np.median(np.delete(medians, i)))
            if medians[i] > SLOW_RATIO * peers:
                continue
            others = [m[0].group for j, m in enumerate(members) if j != i]
            findings.append(_finding(x, at, key[2], medians[i], peers, others, step_ms, hosts))
    return findings


def _finding(
    x: Transfers,
    at: np.ndarray,
    band: int,
    own: float,
    peers: float,
    others: list[str],
    step_ms: float,
    hosts: dict[int, str],
) -> Finding:
    t_ns, step = x.t_ns[at], x.step[at]
    at_peers = t_ns * (own / peers)  # the same bytes at the peers' bandwidth
    saved = t_ns - at_peers
    _, inverse = np.unique(step, return_inverse=True)
    saved_ms = float(np.median(np.bincount(inverse, weights=saved))) / 1e6
    share = saved_ms / step_ms if step_ms > 0 else 0.0
    severity = "error" if share >= ERROR_COST else "warning" if share >= WARN_COST else "info"
    ranks = sorted(x.ranks)
    names = sorted({hosts[r] for r in ranks if hosts.get(r)})
    where = f"ranks {', '.join(map(str, ranks))}" + (f" on {', '.join(names)}" if names else "")
    what = "its point-to-point transfers" if x.op == "p2p" else f"its {x.op} calls"
    peer_text = f"group {others[0]}" if len(others) == 1 else f"{len(others)} groups like it"
    return Finding(
        code="slow-link",
        severity=severity,
        ranks=ranks,
        first_step=int(np.nanmin(step)),
        last_step=int(np.nanmax(step)),
        message=(
            f"group {x.group} ({where}) is a slow link: {what} of {band_label(band)} move "
            f"{own:.3g} GB/s of bus bandwidth, {own / peers:.2f}x the {peers:.3g} GB/s of "
            f"{peer_text}; its {len(t_ns)} calls took {np.median(t_ns) / 1e6:.2f} ms each, "
            f"{np.median(at_peers) / 1e6:.2f} ms at its peers' bandwidth: up to "
            f"{saved_ms:.1f} ms a step ({100 * share:.0f}% of the {step_ms:.0f} ms step)"
        ),
        suggestion=(
            f"test the link under {where} alone (nccl-tests with those ranks, against a "
            "healthy group); look for a link trained down (nvidia-smi nvlink --status, "
            "ibstat: rate and width), a congested or flapping switch port, or NCCL on a "
            "slower transport (NCCL_DEBUG=INFO shows which)"
        ),
        evidence={
            "group": x.group,
            "op": x.op,
            "band": band_label(band),
            "calls": len(t_ns),
            "busbw_gbs": round(own, 4),
            "peers_busbw_gbs": round(peers, 4),
            "ratio": round(own / peers, 4),
            "peer_groups": others,
            "median_call_ms": round(float(np.median(t_ns)) / 1e6, 3),
            "median_call_ms_at_peers": round(float(np.median(at_peers)) / 1e6, 3),
            "saved_ms_per_step": round(saved_ms, 3),
            "step_ms": round(step_ms, 3),
        },
    )
