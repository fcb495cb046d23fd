"""rank-stopped: a rank whose trace ends while the others went on, or that never finished.

Rule: a rank whose last recorded step is at least 2 steps behind the furthest rank, or whose
metadata says it did not finish cleanly (killed: status still "running" after another rank
finished, or after another rank raised from a collective that failed, since a collective fails
when a peer is gone; "raised ..."; "recording stopped: ..."). An error; the rest is analysed as
usual. A killed rank's last steps may still be in its writer's buffer, so it can look as far as
the others: its finding then covers the step after its last one.
Ranks of the job that wrote no trace at all (RunSummary.without_trace) are one error together.
A rank that raised from a collective that failed (a peer gone) while another rank stopped for
its own reason is a consequence: one warning for all of those, naming the ranks they followed.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from dtprof.analysis.columns import codes, groups, values
from dtprof.analysis.report import Finding
from dtprof.analysis.summarize import RunSummary

BEHIND_STEPS = 2


def check(run: RunSummary) -> list[Finding]:
    last = _last_steps(run.steps)
    furthest = int(np.nanmax(list(last.values()))) if last else -1
    statuses = {r: str(m.get("status", "")) for r, m in run.meta.items()}
    failed = _failed_ranks(run.collectives)
    lost_peer = {r for r in failed if statuses.get(r, "").startswith("raised")}
    others_done = any(s == "finished" for s in statuses.values()) or bool(lost_peer)
    stopped = {}
    for rank in run.ranks:
        status = statuses[rank]
        rank_last = int(last[rank]) if rank in last else -1
        unclean = status.startswith(("raised", "recording stopped")) or (
            status == "running" and others_done
        )
        if furthest - rank_last >= BEHIND_STEPS or unclean:
            stopped[rank] = rank_last
    followers = lost_peer & set(stopped)
    causes = sorted((set(stopped) - followers) | set(run.without_trace))
    if not causes:
        followers = set()
    findings = [_without_trace(run)] if run.without_trace else []
    findings += [_stopped(r, stopped[r], furthest, statuses[r]) for r in causes if r in stopped]
    if followers:
        findings.append(_followed(sorted(followers), causes, stopped, statuses))
    return findings


def _last_steps(steps: pa.Table) -> dict[int, float]:
    """Per rank, its last step (NaN where none is known)."""
    if not steps.num_rows:
        return {}
    (ranks,), inverse = groups(values(steps, "rank"))
    last = np.full(len(ranks), np.nan)
    np.fmax.at(last, inverse, values(steps, "step", np.float64))
    return dict(zip(ranks.tolist(), last.tolist(), strict=True))


def _failed_ranks(collectives: pa.Table) -> set[int]:
    """The ranks with a collective recorded as failed: labelled "error", or "<label>;error"
    where it had one."""
    if not collectives.num_rows:
        return set()
    code, labels = codes(collectives, "label")  # test the few labels, not every row
    bad = np.flatnonzero([_failed(str(label)) for label in labels])
    if not len(bad):
        return set()
    return set(np.unique(values(collectives, "rank")[np.isin(code, bad)]).tolist())


def _failed(label: str) -> bool:
    return label == "error" or label.endswith(";error")


def _without_trace(run: RunSummary) -> Finding:
    ranks = run.without_trace
    return Finding(
        code="rank-stopped",
        severity="error",
        ranks=ranks,
        first_step=None,
        last_step=None,
        message=(
            f"rank(s) {', '.join(map(str, ranks))} of {run.world_size} wrote no trace at all: "
            "they never reached dtprof.profile(), or were killed within their first second"
        ),
        suggestion=(
            "read those ranks' logs from the start (an import or CUDA error, a node that never "
            "came up, a launcher that started fewer processes); check the trace path they wrote to"
        ),
        evidence={"without_trace": ranks, "world_size": run.world_size},
    )


def _stopped(rank: int, rank_last: int, furthest: int, status: str) -> Finding:
    why = "was killed or lost" if status == "running" else status
    first = rank_last + 1 if rank_last >= 0 else None
    return Finding(
        code="rank-stopped",
        severity="error",
        ranks=[rank],
        first_step=first,
        last_step=max(furthest, first or 0) if furthest >= 0 else None,
        message=(
            f"rank {rank}'s trace ends at step {rank_last} ({why}) while the furthest "
            f"rank reached step {furthest}"
        ),
        suggestion=(
            f"read rank {rank}'s log around step {rank_last + 1}: an exception, the OOM "
            "killer (dmesg) or a lost node; the hang finding says what the others waited in"
        ),
        evidence={"last_step": rank_last, "furthest_step": furthest, "status": status},
    )


def _followed(
    ranks: list[int], causes: list[int], stopped: dict[int, int], statuses: dict[int, str]
) -> Finding:
    first = min(stopped[r] for r in ranks)
    return Finding(
        code="rank-stopped",
        severity="warning",
        ranks=ranks,
        first_step=first + 1,
        last_step=max(stopped[r] for r in ranks) + 1,
        message=(
            f"rank(s) {', '.join(map(str, ranks))} raised when a collective failed after rank(s) "
            f"{', '.join(map(str, causes))} stopped: a consequence, not a cause"
        ),
        suggestion=f"start from rank {causes[0]}'s finding; these ranks only lost their peer",
        evidence={
            "after": causes,
            "last_step": {r: stopped[r] for r in ranks},
            "status": {r: statuses[r] for r in ranks},
        },
    )
