"""Build small traces by hand in the real format, for unit tests of the reader and checks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dtprof.record.writer import TraceWriter, write_json_atomic
from dtprof.trace.schema import META_FILE, SCHEMA_VERSION, rank_dir_name


def rank_meta(
    rank: int,
    world_size: int,
    *,
    base: int = 0,
    offset_ns: int = 0,
    end: tuple[int, int] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    clock: dict[str, Any] = {
        "mono_to_wall_ns": base,
        "method": "none",
        "start": {"mono_ns": 0, "offset_ns": offset_ns, "error_ns": 10},
    }
    if end is not None:
        clock["end"] = {"mono_ns": end[0], "offset_ns": end[1], "error_ns": 10}
    return {
        "schema_version": SCHEMA_VERSION,
        "rank": rank,
        "world_size": world_size,
        "host": "test",
        "device": "cpu",
        "backend": "gloo",
        "status": "finished",
        "clock": clock,
        **extra,
    }


def write_rank(
    trace: Path, meta: dict[str, Any], tables: dict[str, list[tuple[Any, ...]]], seal: bool = True
) -> Path:
    """Write one rank's folder: its meta.json and the given rows per table."""
    folder = trace / rank_dir_name(int(meta["rank"]))
    folder.mkdir(parents=True, exist_ok=True)
    writer = TraceWriter(folder)
    for name, rows in tables.items():
        writer.buffers[name].extend(rows)
    writer.flush(seal=seal)
    write_json_atomic(folder / META_FILE, meta)
    return folder


def fr_entry(seq: int, **extra: Any) -> dict[str, Any]:
    """One Flight Recorder entry as gloo writes it: an all-reduce still "scheduled"."""
    return {
        "collective_seq_id": seq,
        "p2p_seq_id": 0,
        "is_p2p": False,
        "process_group": ("0", "default_pg"),
        "profiling_name": "gloo:all_reduce",
        "input_sizes": [[4]],
        "input_dtypes": ["Float"],
        "state": "scheduled",
        "retired": False,
        "time_created_ns": 10**18 + seq,
        **extra,
    }
