"""poor-overlap: communication that runs while no compute does, on every step.

Rule: per rank, communication time is the union of the transfer intervals of its collectives on
the whole world, seen on every rank, each from the moment the last member entered (waiting for
a late rank is the straggler's, not overlap's); overlapped time is the part of it during a
forward, backward or optimizer phase (HTA's definition: overlapped / all communication). The
exposed rest as a share of the step is flagged at >= 25% (warning; >= 50%: error) on the ranks
where it happens. The first steps (10%, at least 2) are skipped.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dtprof.analysis.checks.straggler import arrivals, warmup_steps
from dtprof.analysis.report import Finding
from dtprof.analysis.summarize import RunSummary

WARN_EXPOSED = 0.25
ERROR_EXPOSED = 0.50


def transfer_intervals(collectives: pd.DataFrame, world_size: int) -> pd.DataFrame:
    """rank, step, start_ns, end_ns of each collective's transfer: from the last member's entry.

    Only collectives seen on every rank count: with a member missing (a --ranks subset, a
    stopped rank) waiting cannot be told from transfer. p2p is left out.
    """
    coll = arrivals(collectives, world_size)
    start = coll["last_start_ns"].to_numpy()
    return pd.DataFrame(
        {
            "rank": coll["rank"].to_numpy(),
            "step": coll["step"].to_numpy(),
            "start_ns": start,
            "end_ns": np.maximum(start, coll["end_ns"].to_numpy()),
        }
    )


def overlap_per_rank(comm: pd.DataFrame, compute: pd.DataFrame) -> pd.DataFrame:
    """Per rank: communication ns (union) and the ns of it during compute, by an event sweep."""

    def events(df: pd.DataFrame, comm_delta: int, comp_delta: int) -> pd.DataFrame:
        n = len(df)
        return pd.DataFrame(
            {
                "rank": np.concatenate([df["rank"].to_numpy()] * 2),
                "t": np.concatenate([df["start_ns"].to_numpy(), df["end_ns"].to_numpy()]),
                "dcomm": np.repeat([comm_delta, -comm_delta], n),
                "dcomp": np.repeat([comp_delta, -comp_delta], n),
            }
        )

    ev = pd.concat([events(comm, 1, 0), events(compute, 0, 1)], ignore_index=True)
    ev = ev.sort_values(["rank", "t"], kind="stable").reset_index(drop=True)
    by_rank = ev.groupby("rank")
    comm_on = by_rank["dcomm"].cumsum().to_numpy() > 0
    comp_on = by_rank["dcomp"].cumsum().to_numpy() > 0
    dt = by_rank["t"].shift(-1).to_numpy() - ev["t"].to_numpy()
    dt = np.nan_to_num(dt, nan=0.0)
    ev["comm_ns"] = np.where(comm_on, dt, 0.0)
    ev["overlap_ns"] = np.where(comm_on & comp_on, dt, 0.0)
    return ev.groupby("rank")[["comm_ns", "overlap_ns"]].sum()


def check(run: RunSummary) -> list[Finding]:
    if run.collectives.empty or run.phases.empty or run.steps.empty:
        return []
    skip = warmup_steps(run.steps["step"])
    comm = transfer_intervals(run.collectives[run.collectives["step"] >= skip], run.world_size)
    compute = run.phases[run.phases["step"] >= skip]
    if comm.empty:
        return []
    per = overlap_per_rank(comm, compute)
    step_ns = run.steps[run.steps["step"] >= skip].groupby("rank")["step_ns"].sum()
    per["overlap_fraction"] = per["overlap_ns"] / per["comm_ns"].where(per["comm_ns"] > 0)
    per["exposed_comm_fraction"] = (per["comm_ns"] - per["overlap_ns"]) / step_ns
    bad = per[per["exposed_comm_fraction"] >= WARN_EXPOSED]
    if bad.empty:
        return []
    exposed = float(bad["exposed_comm_fraction"].median())
    overlap = float(bad["overlap_fraction"].median())
    ranks = sorted(int(r) for r in bad.index)
    analysed = sorted(run.steps.loc[run.steps["step"] >= skip, "step"].unique())
    return [
        Finding(
            code="poor-overlap",
            severity="error" if exposed >= ERROR_EXPOSED else "warning",
            ranks=ranks,
            first_step=int(analysed[0]),
            last_step=int(analysed[-1]),
            message=(
                f"communication is exposed for {exposed:.0%} of each step on "
                f"{len(ranks)} rank(s): only {overlap:.0%} of it runs while compute does"
            ),
            suggestion=(
                "let communication start during backward: DDP with its default buckets "
                "(bucket_cap_mb ~25) instead of one all-reduce after backward(), or async "
                "collectives waited on only when their result is needed"
            ),
            evidence={
                "overlap_fraction": round(overlap, 4),
                "exposed_comm_fraction": round(exposed, 4),
                "per_rank": {
                    int(r): {
                        "overlap_fraction": round(float(row["overlap_fraction"]), 4),
                        "exposed_comm_fraction": round(float(row["exposed_comm_fraction"]), 4),
                    }
                    for r, row in per.iterrows()
                },
            },
        )
    ]
