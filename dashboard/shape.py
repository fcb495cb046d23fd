"""Shaping helpers: bin rank x step values into bounded grids, fold many ranks into a band.

Whatever the run's size, a figure gets at most a few hundred thousand numbers: heatmaps are
binned to at most ``MAX_RANK_BINS`` x ``MAX_STEP_BINS`` cells (the worst value of a bin, so one
slow rank still shows), and per-rank lines become a min / median / max band plus the few ranks
furthest from the median.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

MAX_RANK_BINS = 200
MAX_STEP_BINS = 500
MAX_LINES = 8  # ranks drawn one line each; above it, a band and the outliers
MAX_POINTS = 2000  # points per line or scatter


@dataclass(frozen=True)
class Grid:
    """A binned rank x step matrix: z[i, j] covers ranks rank_lo[i]..rank_hi[i], steps likewise."""

    z: np.ndarray
    rank_lo: np.ndarray
    rank_hi: np.ndarray
    step_lo: np.ndarray
    step_hi: np.ndarray

    @property
    def binned(self) -> bool:
        return bool((self.rank_hi > self.rank_lo).any() or (self.step_hi > self.step_lo).any())


def _bins(values: np.ndarray, max_bins: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each value's bin (by position among the distinct values), and each bin's first and last."""
    distinct = np.unique(values)
    pos = np.searchsorted(distinct, values)
    nbins = min(len(distinct), max_bins)
    of_pos = np.arange(len(distinct)) * nbins // max(len(distinct), 1)
    lo = np.full(nbins, distinct.max(initial=0), dtype=np.int64)
    hi = np.zeros(nbins, dtype=np.int64)
    np.minimum.at(lo, of_pos, distinct)
    np.maximum.at(hi, of_pos, distinct)
    return of_pos[pos], lo, hi


def grid(
    values: pd.DataFrame,
    column: str = "value",
    max_ranks: int = MAX_RANK_BINS,
    max_steps: int = MAX_STEP_BINS,
) -> Grid:
    """rank, step, value rows to a Grid; a cell holds the largest value of its bin (NaN: none)."""
    values = values.dropna(subset=[column])
    if values.empty:
        empty = np.zeros(0, dtype=np.int64)
        return Grid(np.zeros((0, 0)), empty, empty, empty, empty)
    rbin, rlo, rhi = _bins(values["rank"].to_numpy(np.int64), max_ranks)
    sbin, slo, shi = _bins(values["step"].to_numpy(np.int64), max_steps)
    z = np.full((len(rlo), len(slo)), -np.inf)
    np.maximum.at(z, (rbin, sbin), values[column].to_numpy(np.float64))
    z[np.isneginf(z)] = np.nan
    return Grid(z, rlo, rhi, slo, shi)


def band(values: pd.DataFrame, max_lines: int = MAX_LINES, label: str = "rank") -> pd.DataFrame:
    """rank, step, value to label, step, value: one line per rank, or a band plus outliers."""
    values = values.dropna(subset=["value"])
    ranks = values["rank"].unique()
    if len(ranks) <= max_lines:
        out = values.assign(label=[f"{label} {r}" for r in values["rank"]])
        return _thin(out[["label", "step", "value"]])
    per_step = values.groupby("step")["value"]
    stats = pd.DataFrame(
        {"min": per_step.min(), "median": per_step.median(), "max": per_step.max()}
    )
    lines = stats.reset_index().melt(id_vars="step", var_name="label", value_name="value")
    lines["label"] = lines["label"].map(lambda s: f"{s} of {len(ranks)} {label}s")
    median = values["step"].map(stats["median"])
    far = (values["value"] - median).abs().groupby(values["rank"]).max()
    outliers = far.nlargest(max(max_lines - 3, 1)).index
    picked = values[values["rank"].isin(outliers)]
    picked = picked.assign(label=[f"{label} {r}" for r in picked["rank"]])
    return _thin(pd.concat([lines, picked[["label", "step", "value"]]], ignore_index=True))


def _thin(lines: pd.DataFrame, max_points: int = MAX_POINTS) -> pd.DataFrame:
    """At most max_points steps per line: every k-th step, the last one kept."""
    steps = np.sort(lines["step"].unique())
    if len(steps) <= max_points:
        return lines.reset_index(drop=True)
    keep = set(steps[:: -(-len(steps) // max_points)]) | {steps[-1]}
    return lines[lines["step"].isin(keep)].reset_index(drop=True)


def rank_bars(
    per_rank: pd.DataFrame, columns: list[str], max_bins: int = MAX_RANK_BINS
) -> pd.DataFrame:
    """label and each column's mean per bar, from one row per rank: the ranks grouped into at
    most max_bins bars of consecutive ranks (labelled ``r`` or ``a-b``)."""
    which, lo, hi = _bins(per_rank["rank"].to_numpy(np.int64), max_bins)
    labels = np.array([f"{a}" if a == b else f"{a}-{b}" for a, b in zip(lo, hi, strict=True)])
    out = per_rank[columns].groupby(labels[which], sort=False).mean()
    return out.rename_axis("label").reset_index()


def step_bars(band: pd.DataFrame, max_bins: int = MAX_STEP_BINS) -> pd.DataFrame:
    """step, min_ms, median_ms, max_ms, one row per step, as at most max_bins rows of
    consecutive steps (each at its first step): the least of the minima, the median of the
    medians, the most of the maxima."""
    if len(band) <= max_bins:
        return band.reset_index(drop=True)
    which = np.arange(len(band)) * max_bins // len(band)
    binned = band.groupby(which).agg(
        {"step": "first", "min_ms": "min", "median_ms": "median", "max_ms": "max"}
    )
    return binned.reset_index(drop=True)


def window(df: pd.DataFrame, steps: tuple[int | None, int | None]) -> pd.DataFrame:
    """Rows with first <= step < last (either end open)."""
    first, last = steps
    if df.empty or "step" not in df:
        return df
    keep = np.ones(len(df), bool)
    if first is not None:
        keep &= df["step"].to_numpy() >= first
    if last is not None:
        keep &= df["step"].to_numpy() < last
    return df[keep]


def only_ranks(df: pd.DataFrame, ranks: list[int] | None) -> pd.DataFrame:
    return df if ranks is None or df.empty else df[df["rank"].isin(ranks)]
