"""rank-stopped: a rank whose trace ends while the others went on, or that never finished.

Rule: a rank whose last recorded step is at least 2 steps behind the furthest rank, or whose
metadata says it did not finish cleanly (killed: status still "running" after the others
finished; "raised ..."; "recording stopped: ..."). An error; the rest is analysed as usual.
"""

from __future__ import annotations

from dtprof.analysis.report import Finding
from dtprof.analysis.summarize import RunSummary

BEHIND_STEPS = 2


def check(run: RunSummary) -> list[Finding]:
    last = run.steps.groupby("rank")["step"].max() if not run.steps.empty else None
    furthest = int(last.max()) if last is not None and len(last) else -1
    statuses = {r: str(m.get("status", "")) for r, m in run.meta.items()}
    others_done = any(s == "finished" for s in statuses.values())
    findings = []
    for rank in run.ranks:
        status = statuses[rank]
        rank_last = int(last[rank]) if last is not None and rank in last.index else -1
        behind = furthest - rank_last
        unclean = status.startswith(("raised", "recording stopped")) or (
            status == "running" and others_done
        )
        if behind < BEHIND_STEPS and not unclean:
            continue
        why = "was killed or lost" if status == "running" else status
        findings.append(
            Finding(
                code="rank-stopped",
                severity="error",
                ranks=[rank],
                first_step=rank_last + 1 if rank_last >= 0 else None,
                last_step=furthest if furthest >= 0 else None,
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
        )
    return findings
