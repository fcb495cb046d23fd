"""What NVML saw of a slow rank's GPU: clocks below the other ranks', and the reasons the
driver gave for holding them down (power cap, thermal or hardware slowdown). The straggler's
suggestion names them where they are there, so that a throttled GPU is told from a slow host.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from dtprof.analysis.columns import values
from dtprof.trace.nvml import CLOCK_REASONS, NORMAL_CLOCK_REASONS

SLOW_CLOCK = 0.95  # a median SM clock at or below this share of the other ranks' is slow
HELD_SHARE = 0.2  # a slowdown reason in at least this share of a rank's samples is named


def clock_note(device: pa.Table, rank: int, first: int, last: int) -> tuple[bool, str] | None:
    """What NVML saw of ``rank``'s GPU clocks in steps first..last: (True, how they were held
    down: "its SM clock was 1,410 MHz against 1,980 MHz on the other ranks; the driver held its
    clocks down by hardware thermal slowdown in 62% of its samples"), or (False, that they were
    not: "its SM clock was 1,980 MHz, the other ranks' 1,980 MHz, and no slowdown reason held
    it down"), or None where NVML did not sample that rank (CPU jobs)."""
    if not device.num_rows:
        return None
    step = values(device, "step")
    inside = (step >= first) & (step <= last)
    metric, ranks = values(device, "metric")[inside], values(device, "rank")[inside]
    value = values(device, "value", np.float64)[inside]
    notes = []
    clock = metric == "gpu_sm_clock_mhz"
    own = value[clock & (ranks == rank)]
    if not len(own):
        return None
    own_mhz = float(np.median(own))
    others = [np.median(value[clock & (ranks == r)]) for r in np.unique(ranks[clock]) if r != rank]
    others_mhz = float(np.median(others)) if others else None
    if others_mhz is not None and own_mhz <= SLOW_CLOCK * others_mhz:
        notes.append(
            f"its SM clock was {own_mhz:,.0f} MHz against {others_mhz:,.0f} MHz on the other ranks"
        )
    masks = value[(metric == "gpu_clock_reasons") & (ranks == rank)].astype(np.int64)
    held = [
        (float(np.mean((masks & bit) != 0)), name)
        for bit, name in CLOCK_REASONS.items()
        if not bit & NORMAL_CLOCK_REASONS and len(masks)
    ]
    named = [f"{name} in {share:.0%}" for share, name in sorted(held, reverse=True)
             if share >= HELD_SHARE]  # fmt: skip
    if named:
        notes.append(f"the driver held its clocks down by {', '.join(named)} of its samples")
    if notes:
        return True, "; ".join(notes)
    beside = f", the other ranks' {others_mhz:,.0f} MHz" if others_mhz is not None else ""
    return False, f"its SM clock was {own_mhz:,.0f} MHz{beside}, and no slowdown reason held it"
