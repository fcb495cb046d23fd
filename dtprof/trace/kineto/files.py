"""Which files are PyTorch profiler traces, and the rank a file's name gives (standard library
only: the scan ahead starts before the command's heavier imports)."""

from __future__ import annotations

import re
from pathlib import Path

KINETO_SUFFIXES = (".json", ".json.gz")
RANK_IN_NAME = re.compile(r"rank[-_=.]?(\d+)", re.IGNORECASE)


def kineto_files(folder: Path) -> list[Path]:
    """The ``*.json`` / ``*.json.gz`` files directly in a folder, sorted by name."""
    return sorted(p for p in folder.iterdir() if p.is_file() and p.name.endswith(KINETO_SUFFIXES))


def trace_files(path: Path) -> list[Path]:
    """The profiler-trace files of a path: itself if a file, else those in the folder."""
    return [path] if path.is_file() else kineto_files(path)


def rank_from_name(path: Path) -> int | None:
    """The digits after ``rank`` in a file name (``trace_rank-3.json`` -> 3), else None."""
    found = RANK_IN_NAME.search(path.name)
    return int(found.group(1)) if found else None
