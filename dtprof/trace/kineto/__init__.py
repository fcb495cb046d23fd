"""PyTorch profiler (Kineto) traces, read as they are (docs/kineto.md).

- ``files``: which files of a path are profiler traces, and the rank a file name gives;
- ``cache``: where the conversion of a set of files is kept;
- ``events`` and ``read``: a file decoded by Python (msgspec) into the columns the mapping reads;
- ``native``: the same columns from the native reader (``cpp/``, built at install), when built;
- ``scan_ahead``: a thread that scans the files natively while the command imports its
  libraries;
- ``mapping``: the columns as dtprof's tables and the rank's metadata: every rule, once;
- ``convert``: every file of a path converted into a dtprof trace, file by file.

Nothing here is imported by this package itself: ``scan_ahead`` needs only the standard
library, so that a command can start it before numpy and pyarrow are loaded.
"""
