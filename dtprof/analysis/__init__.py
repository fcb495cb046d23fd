"""Analysis: per-rank summaries, cross-rank checks, and the Report they make."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from dtprof.analysis.bandwidth import bandwidth_summary, link_peak
from dtprof.analysis.causes import link
from dtprof.analysis.checks import CHECKS
from dtprof.analysis.columns import nan_median, values
from dtprof.analysis.gpu import gpu_summary
from dtprof.analysis.imported import summarize_imported
from dtprof.analysis.report import Finding, Report
from dtprof.analysis.summarize import (
    RankSummary,
    RunSummary,
    combine,
    ranks_without_trace,
    release_memory,
    summarize_ranks,
)
from dtprof.analysis.throughput import throughput
from dtprof.errors import DtprofError
from dtprof.parallel import PROCESSES_FROM, PROGRESS_AFTER_S, map_items
from dtprof.trace.reader import find_rank_dirs

__all__ = ["Finding", "Report", "analyze", "analyze_run"]


def analyze(
    path: str | os.PathLike[str],
    *,
    steps: tuple[int | None, int | None] | None = None,
    ranks: list[int] | None = None,
    progress: bool = False,
    scheduler: str | None = None,
    workers: int | None = None,
    peak_tflops: float | None = None,
    link_gbps: str | None = None,
) -> Report:
    """Analyse a trace directory: every check on every rank (or the chosen steps and ranks).

    Each rank is summarized in this process's threads or processes, or, given a Dask
    `scheduler` address or a number of local Dask `workers`, on that cluster. MFU is measured
    against ``peak_tflops`` where given, else against the device's peak from dtprof's table;
    collectives' bus bandwidth against ``link_gbps`` (Gb/s, or a link's name from
    dtprof.analysis.bandwidth.LINKS) where given.
    """
    root = Path(path)
    if link_gbps is not None:
        try:
            link_peak(link_gbps)
        except ValueError as exc:
            raise DtprofError(f"link {link_gbps!r}: {exc}") from None
    started = time.monotonic()
    imported = summarize_imported(root, progress, scheduler, workers)  # None: a dtprof trace
    _, report = _analyze(
        root, imported, started, steps, ranks, progress, scheduler, workers, peak_tflops, link_gbps
    )
    return report


def analyze_run(path: str | os.PathLike[str], progress: bool = False) -> tuple[RunSummary, Report]:
    """analyze() of a whole trace, with the run summary its report was made from (what
    ``dtprof diff`` compares step by step)."""
    root = Path(path)
    started = time.monotonic()
    imported = summarize_imported(root, progress, None, None)
    return _analyze(root, imported, started, None, None, progress, None, None)


def _analyze(
    root: Path,
    imported: list[RankSummary] | None,
    started: float,
    steps: tuple[int | None, int | None] | None,
    ranks: list[int] | None,
    progress: bool,
    scheduler: str | None,
    workers: int | None,
    peak_tflops: float | None = None,
    link_gbps: str | None = None,
) -> tuple[RunSummary, Report]:
    """analyze() with the profiler traces' summaries made (None: not profiler traces): the
    combined run and its report."""
    summaries: list[RankSummary | RunSummary]
    if imported is None:
        rank_dirs = find_rank_dirs(root)
        if ranks is not None:
            rank_dirs = [(r, d) for r, d in rank_dirs if r in set(ranks)]
        folders = [d for _, d in rank_dirs]
        # elsewhere (a pool, Dask) in tasks of RANKS_PER_TASK ranks, each summarized and
        # combined by one worker, so that fewer, larger parts travel back; here in one task,
        # so that the ranks are combined once
        processes = len(folders) >= PROCESSES_FROM
        elsewhere = processes or scheduler or workers
        paths = [str(f.resolve()) if scheduler or workers else f for f in folders]
        per_task = RANKS_PER_TASK if elsewhere else max(len(paths), 1)
        batches = [paths[i : i + per_task] for i in range(0, len(paths), per_task)]
        summaries = map_items(
            summarize_ranks,
            batches,
            processes=processes,
            scheduler=scheduler,
            workers=workers,
            progress=progress,
            count=len,
            name=lambda batch: str(batch[0]),
        )
    else:
        summaries = [s for s in imported if ranks is None or s.rank in set(ranks)]
    if not summaries:
        raise DtprofError(f"{root}: none of the ranks {sorted(set(ranks or []))} is in this trace")
    read_s = time.monotonic() - started
    run = _window(combine(summaries), steps)
    run = replace(run, without_trace=ranks_without_trace(run, ranks))
    del summaries  # the per-rank tables: the combined ones replace them
    if sum(t.num_rows for t in (run.steps, run.phases, run.collectives)) >= RELEASE_FROM_ROWS:
        release_memory()
    findings = link([finding for check in CHECKS for finding in check(run)])
    if progress and time.monotonic() - started > PROGRESS_AFTER_S:
        print(
            f"dtprof: read {len(run.ranks)} ranks in {read_s:.1f} s, combined and checked them "
            f"in {time.monotonic() - started - read_s:.1f} s",
            file=sys.stderr,
            flush=True,
        )
    return run, Report(
        trace=_trace_info(root, run),
        summary=_summary(run, peak_tflops, link_gbps),
        findings=findings,
    )


RELEASE_FROM_ROWS = 1_000_000  # a run this large gives back the heap its parts held
RANKS_PER_TASK = 16  # ranks summarized and combined by one task (of a pool or of Dask)


def _window(run: RunSummary, steps: tuple[int | None, int | None] | None) -> RunSummary:
    return run if steps is None else run.steps_between(*steps)


def _trace_info(root: Path, run: RunSummary) -> dict[str, Any]:
    any_meta = next(iter(run.meta.values()))
    return {
        "path": str(root),
        "world_size": run.world_size,
        "ranks_analysed": run.ranks,
        "ranks_without_trace": run.without_trace,
        "steps": len(np.unique(values(run.steps, "step"))),
        "backend": any_meta.backend,
        "model_kind": any_meta.model_kind,
    }


def _summary(
    run: RunSummary, peak_tflops: float | None = None, link_gbps: str | None = None
) -> dict[str, Any]:
    """Per rank: steps, median step, compute and data time, and the rest of the step (each a
    median over the rank's steps that have it); throughput and MFU where the run has them; the
    collectives' bandwidth; the GPU figures of profiler traces."""
    steps = run.steps
    if not steps.num_rows:  # a profiler trace without steps: its GPU figures, the whole trace
        return {"ranks": [], **(gpu_summary(run.gpu) if run.gpu.num_rows else {})}
    rank = values(steps, "rank")
    order = np.argsort(rank, kind="stable")
    ranks, starts = np.unique(rank[order], return_index=True)
    ends = [*starts[1:], len(order)]
    times = {
        name: values(steps, f"{name}_ns", np.float64)[order] for name in ("step", "compute", "data")
    }
    rows, step_ms = [], []
    for r, lo, hi in zip(ranks.tolist(), starts.tolist(), ends, strict=True):
        ms = {f"{name}_ms": nan_median(v[lo:hi]) / 1e6 for name, v in times.items()}
        other = ms["step_ms"] - np.nan_to_num(ms["compute_ms"]) - np.nan_to_num(ms["data_ms"])
        rows.append(
            {
                "rank": int(r),
                "steps": int(hi - lo),
                **{c: _round(v) for c, v in ms.items()},
                "other_ms": _round(other),
            }
        )
        step_ms.append(ms["step_ms"])
    out: dict[str, Any] = {"ranks": rows, "median_step_ms": _round(nan_median(np.array(step_ms)))}
    rates = throughput(run, peak_tflops)
    if rates is not None:
        out["throughput"] = rates
    if run.collectives.num_rows:
        out.update(bandwidth_summary(run.matched, run.collectives, link_gbps))
    if run.gpu.num_rows:
        out.update(gpu_summary(run.gpu))
    if run.gpu_timing.num_rows:
        out["gpu_timing"] = {
            "rows": [
                {k: _round(v) if isinstance(v, float) else v for k, v in row.items()}
                for row in run.gpu_timing.to_pylist()
            ],
            "definitions": GPU_TIMING_DEFINITIONS,
        }
    return out


GPU_TIMING_DEFINITIONS = (
    "host ms: the interval on the host, which on a GPU is its launch; GPU ms: between CUDA "
    "events at its start and end on its stream; launch queue: GPU start - host start. The "
    "checks read the GPU's times of compute phases and collectives"
)


def _round(value: float) -> float | None:
    return None if np.isnan(value) else round(float(value), 3)
