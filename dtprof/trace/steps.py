"""Steps as intervals of a rank's clock, and the step each moment falls in: how the profiler
trace mapping assigns events to steps, and the analysis a GPU span to the step it started in."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class Steps(NamedTuple):
    """Steps in order of start (ties by number): numbers and times, ns."""

    step: np.ndarray
    start_ns: np.ndarray
    end_ns: np.ndarray


def step_at(steps: Steps, ts_ns: np.ndarray) -> np.ndarray:
    """The step that began last at or before each time; -1 before the first step."""
    if not len(steps.step):
        return np.full(len(ts_ns), -1, np.int64)
    pos = np.searchsorted(steps.start_ns, ts_ns, side="right") - 1
    return np.where(pos >= 0, steps.step[np.maximum(pos, 0)], -1)
