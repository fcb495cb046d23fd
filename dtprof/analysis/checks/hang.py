"""hang: a collective some ranks entered and others never did, or ranks disagree on.

Rule: (1) a collective in flight on some ranks (inflight.json or a hang event) that the
group's other ranks neither have in flight nor completed: those ranks are missing, and their
last recorded activity says what they were doing instead. The group's ranks: the whole job
for a group as large as it (ranks that wrote no trace at all among them), else the ranks seen
using the group. (2) A completed collective whose op or bytes differ between ranks at the same
(group, seq): the ranks called different collectives, which hangs or corrupts data
(all-to-all compares the op only: uneven splits differ in size by design; imported traces
without seq numbers are not compared: a count of calls shifts when profiled windows start
apart). Both are errors.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from dtprof.analysis.report import Finding
from dtprof.analysis.summarize import RunSummary


def _entered(run: RunSummary) -> pd.DataFrame:
    """Operations ranks were stuck in: inflight.json rows and watchdog hang events."""
    rows = run.inflight[run.inflight["peer"].isna()][["rank", "step", "group", "seq", "op"]]
    hangs = run.events[run.events["kind"] == "hang"]
    extra = []
    for rank, step, detail in zip(hangs["rank"], hangs["step"], hangs["detail"], strict=True):
        d = json.loads(detail)
        if d.get("peer") is None:
            extra.append(
                {
                    "rank": int(rank),
                    "step": int(step),
                    "group": str(d["group"]),
                    "seq": int(d["seq"]),
                    "op": str(d["op"]),
                }
            )
    return pd.concat(
        [rows, pd.DataFrame(extra, columns=rows.columns)], ignore_index=True
    ).drop_duplicates(["rank", "group", "seq"])


def _missing(run: RunSummary) -> list[Finding]:
    entered = _entered(run)
    if entered.empty:
        return []
    done = run.collectives[["rank", "group", "seq"]]
    findings = []
    for (group, seq), rows in entered.groupby(["group", "seq"]):
        joined = set(int(r) for r in rows["rank"])
        in_group = done[done["group"] == group]
        completed = set(int(r) for r in in_group[in_group["seq"] == seq]["rank"])
        expected = _expected(run, str(group), set(in_group["rank"].tolist()) | joined)
        missing = [r for r in expected if r not in joined | completed]
        if not missing:
            continue
        op = str(rows["op"].iloc[0])
        doing = {r: _last_activity(run, r) for r in missing}
        what = "; ".join(f"rank {r}: last {d}" for r, d in doing.items())
        findings.append(
            Finding(
                code="hang",
                severity="error",
                ranks=missing,
                first_step=int(rows["step"].min()),
                last_step=None,
                message=(
                    f"{op} (group {group}, seq {seq}) was entered by rank(s) "
                    f"{', '.join(map(str, sorted(joined)))} and never by rank(s) "
                    f"{', '.join(map(str, missing))} ({what})"
                ),
                suggestion=(
                    "find the branch that makes those ranks skip or reorder this collective "
                    "(a rank-dependent condition, an early exit, an exception on that rank); "
                    "their Python stacks are in the hang events"
                ),
                evidence={
                    "group": group,
                    "seq": int(seq),
                    "op": op,
                    "joined": sorted(joined),
                    "completed": sorted(completed),
                    "missing": missing,
                    "last_activity": {int(r): d for r, d in doing.items()},
                },
            )
        )
    return findings


def _expected(run: RunSummary, group: str, seen: set[int]) -> list[int]:
    """The ranks that should join a collective of this group: every rank of the job (those
    without a trace too) for a group as large as the job; for a smaller one, the ranks seen
    using it (which ranks a subgroup holds is not recorded beyond its size)."""
    sizes = dict(zip(run.groups["group"].astype(str), run.groups["size"], strict=True))
    if int(sizes.get(group, run.world_size)) >= run.world_size:
        return sorted(run.ranks + run.without_trace)
    return sorted(int(r) for r in seen)


def _last_activity(run: RunSummary, rank: int) -> str:
    """A rank's last span or region; without any (no hooks, imported dumps), its last
    completed collective and where it was called from."""
    if rank in run.without_trace:
        return "nothing: it wrote no trace"
    last = run.last_span[run.last_span["rank"] == rank]
    if len(last):
        return f"{last['kind'].iloc[0]} {last['name'].iloc[0]} at step {int(last['step'].iloc[0])}"
    coll = run.collectives[run.collectives["rank"] == rank]
    if coll.empty:
        return "nothing recorded"
    c = coll.loc[coll["end_ns"].idxmax()]
    where = f" called from {c['label']}" if isinstance(c["label"], str) else ""
    return f"collective {c['op']} (group {c['group']}, seq {int(c['seq'])}){where}"


def _mismatched(run: RunSummary) -> list[Finding]:
    if any((m.get("imported") or {}).get("seq_from") == "call order" for m in run.meta.values()):
        return []  # seq counted from call order: profiled windows that start apart shift it
    bad = [(g, np.flatnonzero(~g.agree)) for g in run.matched]
    bad = [(g, rows) for g, rows in bad if len(rows)]
    if not bad:
        return []
    g, rows = bad[0]
    group, seq = g.group, int(g.seq[rows[0]])
    coll = run.collectives
    rows_df = coll[(coll["group"] == group) & (coll["seq"] == seq) & coll["peer"].isna()]
    calls = {
        int(r): f"{o} of {b} bytes"
        for r, o, b in zip(rows_df["rank"], rows_df["op"], rows_df["bytes"], strict=True)
    }
    majority = rows_df.groupby(["op", "bytes"], observed=True).size().idxmax()
    odd = sorted(
        int(r)
        for r, o, b in zip(rows_df["rank"], rows_df["op"], rows_df["bytes"], strict=True)
        if (o, b) != majority
    )
    mismatches = sum(len(r) for _, r in bad)
    return [
        Finding(
            code="hang",
            severity="error",
            ranks=odd,
            first_step=int(rows_df["step"].min()),
            last_step=None,
            message=(
                f"ranks disagree on collective (group {group}, seq {seq}): "
                + ", ".join(f"rank {r} called {c}" for r, c in sorted(calls.items()))
                + f"; {mismatches} such mismatch(es) in all"
            ),
            suggestion="make every rank issue the same collectives in the same order and size",
            evidence={"group": group, "seq": seq, "calls": calls, "mismatches": mismatches},
        )
    ]


def check(run: RunSummary) -> list[Finding]:
    return _missing(run) + _mismatched(run)
