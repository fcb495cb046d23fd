"""A plain-text description of what a trace holds, for ``dtprof info``."""

from __future__ import annotations

import numpy as np

from dtprof.trace.meta import RankMeta
from dtprof.trace.reader import Trace, load_trace
from dtprof.trace.schema import TABLES


def describe(path: str) -> str:
    """Ranks, steps, rows per table and clock figures of the trace at ``path``."""
    trace = load_trace(path)
    lines = [f"trace {trace.path}: {len(trace.ranks)} rank(s) of world size {trace.world_size}"]
    lines.append(_ranks_table(trace))
    rows = ", ".join(f"{name} {len(getattr(trace, name)):,}" for name in TABLES)
    lines.append(f"rows: {rows}")
    ways = sorted({_ddp_buckets(meta) for meta in trace.meta.values()} - {""})
    if ways:
        lines.append(f"DDP's buckets recorded {' / '.join(ways)}")
    if len(trace.inflight):
        lines.append(f"in flight at the last flush: {len(trace.inflight)} operation(s)")
    hangs = trace.events[trace.events["kind"] == "hang"]
    for rank, message in zip(hangs["rank"], hangs["message"], strict=True):
        lines.append(f"hang recorded on rank {rank}: {message}")
    return "\n".join(lines)


def _ddp_buckets(meta: RankMeta) -> str:
    """How a rank recorded DDP's buckets, from its metadata; "" where it did not."""
    via = meta.ddp_buckets_via
    if via == "comm_hook":
        return "through a comm hook"
    if via != "dispatcher":
        return ""
    kernel = meta.ddp_buckets_kernel
    if kernel is None:
        return "at the dispatcher"
    why = f" (native: {meta.ddp_buckets_native})" if meta.ddp_buckets_native else ""
    return f"at the dispatcher by the {kernel} kernel{why}"


def _ranks_table(trace: Trace) -> str:
    steps = trace.steps.assign(ms=(trace.steps["end_ns"] - trace.steps["start_ns"]) / 1e6)
    per_rank = steps.groupby("rank")["ms"].agg(["count", "median"])
    header = (
        f"{'rank':>5} {'host':<16} {'device':<8} {'steps':>6} {'median ms':>10} "
        f"{'clock offset ms':>16} {'± ms':>7}  status"
    )
    out = [header]
    for row in trace.ranks.sort_values("rank").itertuples():
        count = int(per_rank["count"].get(row.rank, 0))
        median = per_rank["median"].get(row.rank, np.nan)
        out.append(
            f"{row.rank:>5} {str(row.host)[:16]:<16} {row.device!s:<8} {count:>6} "
            f"{median:>10.2f} {row.clock_offset_ns / 1e6:>16.3f} "
            f"{row.clock_error_ns / 1e6:>7.3f}  {row.status}"
        )
    return "\n".join(out)
