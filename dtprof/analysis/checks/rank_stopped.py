"""rank-stopped: a rank whose trace ends while the others went on, or that never finished.

Rule: a rank whose last recorded step is at least 2 steps behind the furthest rank, or whose
metadata says it did not finish cleanly (killed: status still "running" after another rank
finished, or after another rank raised from a collective that failed, since a collective fails
when a peer is gone; "raised ..."; "recording stopped: ..."). An error; the rest is analysed as
usual. A killed rank's last steps may still be in its writer's buffer, so it can look as far as
the others: its finding then covers the step after its last one. A killed rank's buffered last
steps may also be lost: it took part in every collective of the whole job's group that another
rank completed, so it was alive at least up to the last step of those.
Ranks of the job that wrote no trace at all (RunSummary.without_trace) are one error together.
A rank that raised from a collective that failed (a peer gone) while another rank stopped for
its own reason is a consequence: one warning for all of those, naming the ranks they followed.
A rank that raised says what (meta.json's ``exception``: type, message, the user's frame).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from dtprof.analysis.columns import codes, groups, is_null, values
from dtprof.analysis.report import Finding
from dtprof.analysis.summarize import RunSummary
from dtprof.trace.meta import RankMeta, as_dict

BEHIND_STEPS = 2


def check(run: RunSummary) -> list[Finding]:
    last = _last_steps(run.steps)
    furthest = int(np.nanmax(list(last.values()))) if last else -1
    statuses = {r: m.status for r, m in run.meta.items()}
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
    # a killed rank's last buffered steps may be lost: the others saw it alive later
    alive = {
        r: max(s, _alive_until(run, r)) if statuses[r] == "running" else s
        for r, s in stopped.items()
    }
    followers = lost_peer & set(stopped)
    causes = sorted((set(stopped) - followers) | set(run.without_trace))
    if not causes:
        followers = set()
    findings = [_without_trace(run)] if run.without_trace else []
    findings += [
        _stopped(r, stopped[r], alive[r], furthest, run.meta[r]) for r in causes if r in stopped
    ]
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


def _alive_until(run: RunSummary, rank: int) -> int:
    """The last step at which another rank completed a collective of a group as large as the
    job (so ``rank`` took part in it); -1 when none."""
    coll = run.collectives
    if not coll.num_rows or run.world_size < 2:
        return -1
    whole = {
        str(g)
        for g, size in zip(values(run.groups, "group"), values(run.groups, "size"), strict=True)
        if int(size) >= run.world_size
    }
    code, names = codes(coll, "group")
    whole_codes = np.flatnonzero([str(n) in whole for n in names])
    done = (
        np.isin(code, whole_codes)
        & (values(coll, "rank") != rank)
        & ~is_null(coll, "end_ns")
        & is_null(coll, "peer")
    )
    label_code, labels = codes(coll, "label")
    failed = np.flatnonzero([_failed(str(label)) for label in labels])
    done &= ~np.isin(label_code, failed)
    steps = values(coll, "step", np.float64)[done]
    steps = steps[~np.isnan(steps)]
    return int(steps.max()) if len(steps) else -1


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


def _stopped(rank: int, rank_last: int, alive: int, furthest: int, meta: RankMeta) -> Finding:
    status, exception = meta.status, meta.exception
    first = alive + 1
    suggestion = (
        f"read rank {rank}'s log around step {first}: the exception, the OOM killer (dmesg) "
        "or a lost node; the hang finding says what the others waited in"
    )
    if exception:
        where = ""
        if exception.file:
            where = f" in {exception.function} ({Path(exception.file).name}:{exception.line})"
        text = exception.message.partition(": ")[2]
        why = f"raised {exception.type}{where} at step {exception.step}: {text}"
        suggestion = (
            f"start from rank {rank}'s {exception.type}{where}: its traceback is in its "
            "log, and what it raised is in its meta.json"
        )
    else:
        why = "was killed or lost" if status == "running" else status
    ended = f"after step {alive}" if alive >= 0 else "before its first step"
    reached = (
        f"the furthest rank reached step {furthest}" if furthest >= 0 else "no rank ended a step"
    )
    return Finding(
        code="rank-stopped",
        severity="error",
        ranks=[rank],
        first_step=first,
        last_step=max(furthest, first),
        message=f"rank {rank} stopped {ended}: it {why}; {reached}",
        suggestion=suggestion,
        evidence={
            "last_step": rank_last,
            "alive_until_step": alive,
            "furthest_step": furthest,
            "status": status,
            "exception": as_dict(exception) if exception else None,
        },
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
