"""What a path holds (a dtprof trace, PyTorch profiler traces or Flight Recorder dumps), and
the dtprof trace to read for it.

Every reader of a path asks here first: ``trace_kind`` detects, ``resolve`` gives a dtprof
trace directory for any kind (converting profiler traces or dumps once into the cache), and
``convert`` writes one where the user says (``dtprof convert``).
"""

from __future__ import annotations

import os
from pathlib import Path

from dtprof.errors import DtprofError
from dtprof.trace.kineto.cache import cache_path, cached
from dtprof.trace.kineto.convert import import_kineto
from dtprof.trace.kineto.files import KINETO_SUFFIXES, kineto_files
from dtprof.trace.layout import has_rank_dirs


def trace_kind(path: str | os.PathLike[str]) -> str:
    """``dtprof`` (rank=NNNNN folders), ``flight`` (Flight Recorder dumps, or one) or ``kineto``
    (profiler trace files, or one such file)."""
    p = Path(path)
    if not p.exists():
        raise DtprofError(f"{p}: no such directory")
    from dtprof.trace.flight import dump_files, is_dump  # imports this module

    if p.is_file():
        if is_dump(p):
            return "flight"
        if p.name.endswith(KINETO_SUFFIXES):
            return "kineto"
        raise DtprofError(
            f"{p}: not a directory (a dtprof trace is one; profiler traces end in .json[.gz])"
        )
    if has_rank_dirs(p):
        return "dtprof"
    if dump_files(p):
        return "flight"
    if kineto_files(p):
        return "kineto"
    raise DtprofError(
        f"{p}: not a dtprof trace (no rank=NNNNN folders), a folder of PyTorch profiler "
        "traces (*.json, *.json.gz) nor of Flight Recorder dumps"
    )


def resolve(path: str | os.PathLike[str], progress: bool = False) -> Path:
    """A dtprof trace directory for ``path``: itself, or its (cached) conversion."""
    p = Path(path)
    kind = trace_kind(p)
    if kind == "dtprof":
        return p
    if kind == "flight":
        from dtprof.trace.flight import resolve_dumps

        return resolve_dumps(p)
    hit = cached(p)
    if hit is not None:
        return hit
    target = cache_path(p)
    try:
        import_kineto(p, target, progress=progress)
    except OSError as exc:
        raise DtprofError(f"{target}: cannot write the converted trace ({exc})") from None
    return target


def convert(
    path: str | os.PathLike[str], out: str | os.PathLike[str], progress: bool = False
) -> int:
    """``dtprof convert``: write a Kineto path or Flight Recorder dumps as a dtprof trace at
    ``out``; ranks written."""
    src, dst = Path(path), Path(out)
    kind = trace_kind(src)
    if kind == "dtprof":
        raise DtprofError(f"{src}: already a dtprof trace; nothing to convert")
    if dst.exists() and (not dst.is_dir() or any(dst.iterdir())):
        raise DtprofError(f"{dst}: exists and is not an empty directory")
    if dst.is_dir():
        dst.rmdir()
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        if kind == "flight":
            from dtprof.trace.flight import convert_dumps

            return convert_dumps(src, dst)
        return len(import_kineto(src, dst, progress=progress))
    except OSError as exc:
        raise DtprofError(f"{dst}: cannot write ({exc.strerror})") from None
