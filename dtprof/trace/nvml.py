"""What the ``gpu_clock_reasons`` samples hold: NVML's clocks event reasons (formerly "throttle
reasons"), a bit mask, as nvml.h numbers them."""

from __future__ import annotations

CLOCK_REASONS = {
    0x1: "idle",
    0x2: "application clocks setting",
    0x4: "software power cap",
    0x8: "hardware slowdown",
    0x10: "sync boost",
    0x20: "software thermal slowdown",
    0x40: "hardware thermal slowdown",
    0x80: "hardware power brake",
    0x100: "display clock setting",
}
# states that are normal for a GPU at work or at rest; the others hold its clocks below what
# the work asks for
NORMAL_CLOCK_REASONS = 0x1 | 0x2 | 0x10 | 0x100
