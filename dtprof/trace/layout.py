"""Names and version numbers of what dtprof writes, in a module that imports nothing."""

from __future__ import annotations

RANK_DIR_PREFIX = "rank="  # a trace directory holds one rank=NNNNN folder per rank
SCHEMA_VERSION = 1  # the trace directory's layout (docs/trace-format.md, Schema version)
IMPORTER_VERSION = 3  # bump when the profiler-trace mapping changes: cached conversions are redone
