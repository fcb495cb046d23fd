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
import pyarrow as pa

from dtprof.analysis.columns import codes, groups, is_null, rows, values
from dtprof.analysis.report import Finding
from dtprof.analysis.summarize import RunSummary
from dtprof.trace.reader import INFLIGHT_SCHEMA

# what a rank was in: of its inflight.json rows, or of the hang events that name them
ENTERED = pa.schema([INFLIGHT_SCHEMA.field(c) for c in ("rank", "step", "group", "seq", "op")])


def _entered(run: RunSummary) -> pa.Table:
    """Operations ranks were stuck in: inflight.json rows and watchdog hang events, each
    (rank, group, seq) once."""
    parts = [ENTERED.empty_table()]
    if run.inflight.num_rows:
        inflight = rows(run.inflight, is_null(run.inflight, "peer"))
        parts.append(inflight.select(ENTERED.names).cast(ENTERED))
    if run.events.num_rows:
        hangs = rows(run.events, values(run.events, "kind") == "hang")
        extra = []
        for rank, step, detail in zip(
            *(values(hangs, c) for c in ("rank", "step", "detail")), strict=True
        ):
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
        parts.append(pa.Table.from_pylist(extra, schema=ENTERED))
    entered = pa.concat_tables(parts)
    group, _ = codes(entered, "group")  # nulls alike, as pandas' drop_duplicates takes them
    _, inverse = groups(values(entered, "rank"), group, values(entered, "seq"))
    _, first = np.unique(inverse, return_index=True)
    return entered.take(np.sort(first))


def _missing(run: RunSummary) -> list[Finding]:
    entered = _entered(run)
    entered = rows(entered, ~is_null(entered, "group"))  # a null group is in no group-by
    if not entered.num_rows:
        return []
    rank, step, op = values(entered, "rank"), values(entered, "step"), values(entered, "op")
    done_group, done_names = codes(run.collectives, "group")
    done_seq, done_rank = values(run.collectives, "seq"), values(run.collectives, "rank")
    findings = []
    (group_of, seq_of), inverse = groups(values(entered, "group"), values(entered, "seq"))
    for k, (group, seq) in enumerate(zip(group_of.tolist(), seq_of.tolist(), strict=True)):
        these = inverse == k
        joined = set(rank[these].tolist())
        used = done_group == _code(done_names, group)
        completed = set(done_rank[used & (done_seq == seq)].tolist())
        expected = _expected(run, group, set(done_rank[used].tolist()) | joined)
        missing = [r for r in expected if r not in joined | completed]
        if not missing:
            continue
        name = str(op[these][0])
        doing = _last_activity(run, missing)
        what = "; ".join(f"rank {r}: last {d}" for r, d in doing.items())
        findings.append(
            Finding(
                code="hang",
                severity="error",
                ranks=missing,
                first_step=int(step[these].min()),
                last_step=None,
                message=(
                    f"{name} (group {group}, seq {seq}) was entered by rank(s) "
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
                    "seq": seq,
                    "op": name,
                    "joined": sorted(joined),
                    "completed": sorted(completed),
                    "missing": missing,
                    "last_activity": doing,
                },
            )
        )
    return findings


def _code(names: np.ndarray, name: str) -> int:
    """The code of a name among a text column's names; -2 (no row's) when it is not there."""
    at = np.flatnonzero(names == name)
    return int(at[0]) if len(at) else -2


def _expected(run: RunSummary, group: str, seen: set[int]) -> list[int]:
    """The ranks that should join a collective of this group: every rank of the job (those
    without a trace too) for a group as large as the job; for a smaller one, the ranks seen
    using it (which ranks a subgroup holds is not recorded beyond its size)."""
    sizes = {}
    if run.groups.num_rows:
        sizes = dict(zip(values(run.groups, "group"), values(run.groups, "size"), strict=True))
    if int(sizes.get(group, run.world_size)) >= run.world_size:
        return sorted(run.ranks + run.without_trace)
    return sorted(int(r) for r in seen)


def _last_activity(run: RunSummary, ranks: list[int]) -> dict[int, str]:
    """Per rank, its last span or region; without any (no hooks, imported dumps), its last
    completed collective and where it was called from."""
    spans = run.last_span
    span_rank = values(spans, "rank") if spans.num_rows else np.zeros(0, np.int32)
    has_span = set(span_rank.tolist())
    last = _last_collectives(run.collectives, [r for r in ranks if r not in has_span])
    out = {}
    for r in ranks:
        if r in run.without_trace:
            out[r] = "nothing: it wrote no trace"
        elif r in has_span:
            span = spans.slice(int(np.flatnonzero(span_rank == r)[0]), 1).to_pylist()[0]
            out[r] = f"{span['kind']} {span['name']} at step {int(span['step'])}"
        elif r in last:
            c = last[r]
            where = f" called from {c['label']}" if isinstance(c["label"], str) else ""
            out[r] = f"collective {c['op']} (group {c['group']}, seq {int(c['seq'])}){where}"
        else:
            out[r] = "nothing recorded"
    return out


def _last_collectives(coll: pa.Table, ranks: list[int]) -> dict[int, dict]:
    """Per rank of these, the row of the collective that completed last (the first of
    equals)."""
    if not ranks or not coll.num_rows:
        return {}
    coll = rows(coll, np.isin(values(coll, "rank"), ranks) & ~is_null(coll, "end_ns"))
    rank = values(coll, "rank")
    order = np.lexsort((-values(coll, "end_ns"), rank))  # stable: equals in the rows' order
    found, first = np.unique(rank[order], return_index=True)
    return dict(zip(found.tolist(), coll.take(order[first]).to_pylist(), strict=True))


def _mismatched(run: RunSummary) -> list[Finding]:
    if any(m.imported and m.imported.seq_from == "call order" for m in run.meta.values()):
        return []  # seq counted from call order: profiled windows that start apart shift it
    bad = [(g, np.flatnonzero(~g.agree)) for g in run.matched]
    bad = [(g, at) for g, at in bad if len(at)]
    if not bad:
        return []
    g, at = bad[0]
    group, seq = g.group, int(g.seq[at[0]])
    coll = run.collectives
    code, names = codes(coll, "group")
    pick = (code == _code(names, group)) & (values(coll, "seq") == seq) & is_null(coll, "peer")
    op_code = codes(coll, "op")[0][pick]
    coll = rows(coll, pick)
    rank, op, size = values(coll, "rank"), values(coll, "op"), values(coll, "bytes")
    calls = {int(r): f"{o} of {b} bytes" for r, o, b in zip(rank, op, size, strict=True)}
    # the most common (op, bytes); of equals, the first by op (_op_order), then bytes
    op_place = _op_order(run)[op_code]
    known = (op_code >= 0) & ~np.isnan(size.astype(np.float64))
    (places, sizes), inverse = groups(op_place[known], size[known])
    top = int(np.argmax(np.bincount(inverse)))
    odd = sorted(rank[(op_place != places[top]) | (size != sizes[top])].tolist())
    mismatches = sum(len(at) for _, at in bad)
    return [
        Finding(
            code="hang",
            severity="error",
            ranks=odd,
            first_step=int(np.nanmin(values(coll, "step"))),
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


def _op_order(run: RunSummary) -> np.ndarray:
    """Per op code (and then -1, for code -1: null), the op's place in the order the pandas
    analyzer grouped ops in, which ties between calls follow: the order of first use when
    every rank used the same ops (the ranks' columns stayed categorical), else the names'."""
    code, names = codes(run.collectives, "op")
    known = code >= 0
    (rank, _), _ = groups(values(run.collectives, "rank")[known], code[known])
    used = len(np.unique(code[known]))
    every = len(rank) == len(run.ranks) * used and len(np.unique(rank)) == len(run.ranks)
    place = np.arange(len(names)) if every else np.argsort(np.argsort(names, kind="stable"))
    return np.append(place, -1)


def check(run: RunSummary) -> list[Finding]:
    return _missing(run) + _mismatched(run)
