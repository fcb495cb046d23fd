"""Analysis: per-rank summaries, cross-rank checks, and the Report they make."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import BrokenExecutor, Executor, ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

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
    summarize_folders,
    summarize_ranks,
)
from dtprof.errors import DtprofError
from dtprof.trace.reader import find_rank_dirs

__all__ = ["Finding", "Report", "analyze"]
T = TypeVar("T")


def analyze(
    path: str | os.PathLike[str],
    *,
    steps: tuple[int | None, int | None] | None = None,
    ranks: list[int] | None = None,
    progress: bool = False,
    scheduler: str | None = None,
    workers: int | None = None,
) -> Report:
    """Analyse a trace directory: every check on every rank (or the chosen steps and ranks).

    Each rank is summarized in this process's threads or processes, or, given a Dask
    `scheduler` address or a number of local Dask `workers`, on that cluster.
    """
    root = Path(path)
    started = time.monotonic()
    # None: a dtprof trace. Profiler traces' conversion may still be being written beside the
    # analysis: finish_cache() puts it in place at the end.
    imported, finish_cache = summarize_imported(root, progress, scheduler, workers)
    try:
        report = _analyze(root, imported, started, steps, ranks, progress, scheduler, workers)
    except BaseException:
        with contextlib.suppress(Exception):  # the analysis' error is the one to show
            finish_cache()
        raise
    finish_cache()
    return report


def _analyze(
    root: Path,
    imported: list[RankSummary] | None,
    started: float,
    steps: tuple[int | None, int | None] | None,
    ranks: list[int] | None,
    progress: bool,
    scheduler: str | None,
    workers: int | None,
) -> Report:
    """analyze() with the profiler traces' summaries made (None: not profiler traces)."""
    summaries: list[RankSummary | RunSummary]
    if imported is None:
        rank_dirs = find_rank_dirs(root)
        if ranks is not None:
            rank_dirs = [(r, d) for r, d in rank_dirs if r in set(ranks)]
        folders = [d for _, d in rank_dirs]
        if folders and (scheduler or workers):
            from dtprof.analysis.cluster import dask_map

            paths = [str(f.resolve()) for f in folders]
            batches = [paths[i : i + RANKS_PER_TASK] for i in range(0, len(paths), RANKS_PER_TASK)]
            summaries = dask_map(
                summarize_ranks,
                batches,
                scheduler=scheduler,
                workers=workers,
                progress=progress,
                what=f"tasks of up to {RANKS_PER_TASK} ranks",
            )
        else:
            summaries = _summarize(folders, progress) if folders else []
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
    return Report(trace=_trace_info(root, run), summary=_summary(run), findings=findings)


RELEASE_FROM_ROWS = 1_000_000  # a run this large gives back the heap its parts held
PROCESSES_FROM = 32  # ranks; below that, starting processes costs more than it saves
PROGRESS_AFTER_S = 1.0  # loading that takes longer shows its progress on stderr


RANKS_PER_TASK = 16  # with processes: ranks summarized and combined by one task


def _summarize(folders: list[Path], progress: bool) -> list[RankSummary | RunSummary]:
    """summarize_rank on every rank folder: for a few, in this process and beside it; for
    many, in a process pool, a batch of ranks per task combined there."""
    if len(folders) < PROCESSES_FROM or (os.cpu_count() or 1) < 2:
        return list(summarize_folders(folders, _Progress(len(folders), progress).add))
    batches = [folders[i : i + RANKS_PER_TASK] for i in range(0, len(folders), RANKS_PER_TASK)]
    return list(map_ranks(summarize_ranks, batches, progress, count=len, name=lambda b: b[0]))


def map_ranks(
    fn: Callable[[Any], T],
    folders: list[Any],
    progress: bool = False,
    count: Callable[[Any], int] | None = None,
    name: Callable[[Any], str] = str,
) -> list[T]:
    """fn on each rank's item (a folder, or what fn takes), in order: in threads for a few
    ranks, in processes for many (fn must then be a module-level function). ``count`` says
    how many ranks an item holds (default 1), for the progress line; ``name`` names an item in
    the error when a worker process dies (the kernel's OOM killer, a signal)."""
    cpus = os.cpu_count() or 1
    sizes = [count(f) if count else 1 for f in folders]
    total = sum(sizes)
    pool: Executor
    if total >= PROCESSES_FROM and cpus > 1:  # ranks, not items: an item may hold a batch
        from concurrent.futures import ProcessPoolExecutor  # with multiprocessing: 7 ms to import

        workers = min(cpus, len(folders))
        # items in chunks of up to 4, but never so few chunks that a worker has none
        pool, chunk = ProcessPoolExecutor(workers), max(1, min(4, len(folders) // (2 * workers)))
    else:
        pool, chunk = ThreadPoolExecutor(max_workers=min(8, cpus * 2)), 1
    shown = _Progress(total, progress)
    summaries: list[T] = []
    try:
        with pool:
            for size, summary in zip(sizes, pool.map(fn, folders, chunksize=chunk), strict=True):
                summaries.append(summary)
                shown.add(size)
    except BrokenExecutor:  # a process pool's worker died
        # the pool fails every item not finished: the dead worker's is the first of them or one
        # after it, and map() hands results in order, so that is as near as it can name it
        raise DtprofError(
            f"{name(folders[len(summaries)])}: a worker process died while reading this rank "
            "or one after it (killed, perhaps for lack of memory)"
        ) from None
    return summaries


class _Progress:
    """``dtprof: read N/M ranks`` on stderr once loading is slow: every 64 ranks, and the last."""

    def __init__(self, total: int, on: bool) -> None:
        self.total, self.on = total, on
        self.started, self.done, self.shown = time.monotonic(), 0, 0

    def add(self, ranks: int = 1) -> None:
        self.done += ranks
        late = time.monotonic() - self.started > PROGRESS_AFTER_S
        if self.on and late and (self.done - self.shown >= 64 or self.done == self.total):
            print(f"dtprof: read {self.done}/{self.total} ranks", file=sys.stderr, flush=True)
            self.shown = self.done


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


def _summary(run: RunSummary) -> dict[str, Any]:
    """Per rank: steps, median step, compute and data time, and the rest of the step (each a
    median over the rank's steps that have it)."""
    steps = run.steps
    if not steps.num_rows:
        return {"ranks": []}
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
    out = {"ranks": rows, "median_step_ms": _round(nan_median(np.array(step_ms)))}
    if run.gpu.num_rows:
        out.update(gpu_summary(run.gpu))
    return out


def _round(value: float) -> float | None:
    return None if np.isnan(value) else round(float(value), 3)
