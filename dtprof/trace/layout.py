"""Names and version numbers of what dtprof writes, in a module that imports only os."""

from __future__ import annotations

import os

RANK_DIR_PREFIX = "rank="  # a trace directory holds one rank=NNNNN folder per rank
SCHEMA_VERSION = 2  # the trace directory's layout (docs/trace-format.md, Schema version)
# what load_trace reads: version 1 differs only in its live segments (Arrow IPC streams,
# _live-N.arrows), which are refused by name (dtprof.trace.live.refuse_legacy)
READABLE_VERSIONS = (1, 2)
IMPORTER_VERSION = 4  # bump when the profiler-trace mapping changes: cached conversions are redone


def has_rank_dirs(folder: str | os.PathLike[str]) -> bool:
    """Whether a folder holds rank=NNNNN folders: a dtprof trace."""
    with os.scandir(folder) as entries:
        return any(e.is_dir() and e.name.startswith(RANK_DIR_PREFIX) for e in entries)
