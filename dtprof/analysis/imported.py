"""Summaries of imported (PyTorch profiler) traces: from the cache, or made while converting."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

from dtprof.analysis.summarize import (
    RankSummary,
    summarize_frames,
    summarize_rank,
)
from dtprof.parallel import map_items
from dtprof.trace.importer import resolve, trace_kind
from dtprof.trace.kineto.cache import cache_path, cached
from dtprof.trace.kineto.convert import import_kineto
from dtprof.trace.meta import RankMeta
from dtprof.trace.reader import find_rank_dirs


def summarize_tables(meta: RankMeta, tables: dict[str, pa.Table]) -> RankSummary:
    """summarize_frames on an importer's tables (runs in the import worker)."""
    return summarize_frames(meta, tables, [])


def summarize_imported(
    root: Path,
    progress: bool = False,
    scheduler: str | None = None,
    workers: int | None = None,
) -> list[RankSummary] | None:
    """Every rank's summary of a Kineto path (or Flight Recorder dumps), or None when ``root`` is
    a dtprof trace.

    A cached conversion is read like any dtprof trace; otherwise the files are converted into
    the cache and summarized by the workers that parsed them. On Dask (a ``scheduler`` address
    or local ``workers``) each file is parsed and summarized on the cluster, and only the
    summaries come back: nothing is cached.
    """
    kind = trace_kind(root)
    if kind == "flight":  # converted once into the cache, then read like any dtprof trace
        return [summarize_rank(d) for _, d in find_rank_dirs(resolve(root))]
    if kind != "kineto":
        return None
    if scheduler or workers:

        def on_dask(fn: Callable[[Any], Any], items: list[Any]) -> list[Any]:
            return map_items(
                fn,
                [(f.resolve(), *rest) for f, *rest in items],
                scheduler=scheduler,
                workers=workers,
                progress=progress,
                what="profiler traces",
            )

        results = import_kineto(root, None, per_rank=summarize_tables, mapper=on_dask)
        return [summary for _, summary in results]
    hit = cached(root)
    if hit is not None:
        return [summarize_rank(d) for _, d in find_rank_dirs(hit)]
    target: Path | None = cache_path(root)
    try:
        assert target is not None
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError:
        target = None  # no cache: analyse anyway
    results = import_kineto(root, target, progress=progress, per_rank=summarize_tables)
    return [summary for _, summary in results]
