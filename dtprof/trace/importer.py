"""What a path holds (dtprof trace or PyTorch profiler traces), and importing the latter.

Every reader of a path asks here first: ``trace_kind`` detects, ``resolve`` gives a dtprof
trace directory for either kind (converting a Kineto folder once into the cache), and
``import_kineto`` converts in parallel, optionally running a function on each rank's tables
in the worker that parsed them (the analyzer summarizes there, so nothing is read twice).

Rank of each file: ``distributedInfo.rank``; without it the digits after ``rank`` in the file
name (``trace_rank-3.json``); without those, the file's position in the folder sorted by name.
A fallback is reported on stderr. Two files of one rank are an error. The world size is the
largest of the declared ``distributedInfo.world_size``, the highest rank + 1 and the number of
files, so every rank's meta.json agrees.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

from dtprof.beside import run_beside
from dtprof.errors import DtprofError
from dtprof.trace import kineto_ahead, kineto_native
from dtprof.trace.kineto import rank_from_name, read_kineto
from dtprof.trace.kineto_ahead import (
    KINETO_SUFFIXES,
    cache_path,
    cached,
    kineto_files,
    trace_files,
)
from dtprof.trace.kineto_map import SEQ_FROM, rank_meta, rank_tables
from dtprof.trace.layout import has_rank_dirs
from dtprof.trace.meta import RankMeta, encode, replace
from dtprof.trace.schema import (
    META_FILE,
    SEALED_PREFIX,
    TABLES,
    rank_dir_name,
)

PROGRESS_AFTER_S = 1.0

# one converted file: rank, how the rank was told, world size, meta.json, per_rank result
Converted = tuple[int, str, int, RankMeta, Any]
PerRank = Callable[[RankMeta, dict[str, pa.Table]], Any]
Mapper = Callable[[Callable[[Any], Any], list[Any]], list[Any]]  # fn over items, in order


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


def _fallback_ranks(files: list[Path]) -> list[tuple[int, str]]:
    out = []
    for i, f in enumerate(files):
        named = rank_from_name(f)
        out.append((named, "file name") if named is not None else (i, "file order"))
    return out


def _convert_one(
    file: Path,
    fallback: tuple[int, str],
    out: Path | None,
    per_rank: PerRank | None,
    write: Callable[[Path, dict[str, pa.Table]], Any] | None = None,
) -> Converted:
    """Parse, map, write (when out is given: with ``write``, else _write_tables) and run
    per_rank on one file, in a worker."""
    # millions of short-lived dicts from the parser: the cyclic collector would rescan them
    # over and over (it more than doubles the time); none of them form cycles
    collecting = gc.isenabled()
    gc.disable()
    try:
        kf = read_kineto(file)
        declared = kf.distributed.get("rank")
        rank, how = (declared, "distributedInfo") if type(declared) is int else fallback
        world = kf.distributed.get("world_size")
        tables = rank_tables(kf)
        seq_from = (tables["collectives"].schema.metadata or {}).get(SEQ_FROM, b"trace")
        meta = rank_meta(
            kf,
            rank,
            world if type(world) is int else 0,
            how,
            steps=tables["steps"].num_rows,
            seq_from=seq_from.decode(),
        )
        del kf
        if out is not None:
            (write or _write_tables)(out, tables)
        result = per_rank(meta, tables) if per_rank is not None else None
    except DtprofError:
        raise
    except Exception as exc:  # a structure the mapping did not expect: one line, naming the file
        raise DtprofError(
            f"{file}: not a readable PyTorch profiler trace ({type(exc).__name__}: {exc})"
        ) from None
    finally:
        if collecting:
            gc.enable()
    return rank, how, meta.world_size, meta, result


def _convert_job(
    job: tuple[Path, tuple[int, str], Path | None, PerRank | None],
) -> Converted:
    """_convert_one with its arguments in one tuple, for mappers of one-argument functions."""
    return _convert_one(*job)


def _write_tables(folder: Path, tables: dict[str, pa.Table]) -> None:
    """A rank's tables as sealed segments, lz4-compressed: quicker than zstd both ways, a
    third larger (docs/kineto.md). Only tables with rows get a folder (readers take a missing
    one as empty): where many files were deleted in the last minute (a cache cleared and
    written again), ext4 passes over their inodes to place each new one."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in TABLES:
        if tables[name].num_rows:
            tdir = folder / name
            tdir.mkdir()
            TABLES[name].write_parquet(
                tables[name], tdir / f"{SEALED_PREFIX}000000.parquet", compression="lz4"
            )


def import_kineto(
    path: Path,
    out: Path | None,
    *,
    progress: bool = False,
    per_rank: PerRank | None = None,
    mapper: Mapper | None = None,
) -> list[tuple[RankMeta, Any]]:
    """Convert every file of a Kineto path into ``out`` (if given); (meta, per_rank result) each.

    ``out`` appears complete or not at all: it is written beside and renamed into place. A
    ``mapper`` (e.g. a Dask cluster's) runs the files instead of this machine's processes; its
    workers write nothing, only per_rank's results come back.
    """
    results, finish = start_import(path, out, progress=progress, per_rank=per_rank, mapper=mapper)
    finish()
    return results


def start_import(
    path: Path,
    out: Path | None,
    *,
    progress: bool = False,
    per_rank: PerRank | None = None,
    mapper: Mapper | None = None,
) -> tuple[list[tuple[RankMeta, Any]], Callable[[], None]]:
    """import_kineto's results, and what puts ``out`` in place, to call once: the conversion's
    files may still be being written when this returns (on two CPUs, by a thread, while the
    caller analyses the results). Until then ``out`` is absent; finish() waits for the files,
    names the rank folders and renames the conversion into place, or removes it and raises
    DtprofError when a file could not be written."""
    files = trace_files(path)
    fallbacks = _fallback_ranks(files)
    kineto_native.load()  # built here once, not in each worker; forked workers inherit it
    if mapper is not None:
        jobs = [(f, fb, None, per_rank) for f, fb in zip(files, fallbacks, strict=True)]
        results, _ = _finish(files, dict(enumerate(mapper(_convert_job, jobs))), None)
        return results, lambda: None
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}") if out is not None else None
    if tmp is not None:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    writer = _Writer()

    def discard() -> None:
        writer.close()
        if tmp is not None and tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)

    try:
        done = _run(files, fallbacks, tmp, per_rank, progress, writer)
        results, name_folders = _finish(files, done, tmp)
    except BaseException:
        discard()
        raise

    def finish() -> None:
        try:
            writer.wait()
            name_folders()
            if tmp is not None and out is not None:
                os.replace(tmp, out)
        finally:
            discard()

    return results, finish


class _Writer:
    """The Parquet files of converted ranks, written by a second thread (started at the first):
    Arrow writes without the GIL, on the CPU the scanning thread leaves free once it is done,
    while the command's thread maps and summarizes the next rank."""

    def __init__(self) -> None:
        self._pool: Any = None
        self._writes: list[tuple[Path, Any]] = []  # (the source file, its writing's future)

    def write(self, file: Path, folder: Path, tables: dict[str, pa.Table]) -> None:
        if self._pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self._pool = ThreadPoolExecutor(1, thread_name_prefix="dtprof-write")
        self._writes.append((file, self._pool.submit(_write_tables, folder, tables)))

    def wait(self) -> None:
        """Wait for every write; the first that failed is one DtprofError naming its file."""
        for file, written in self._writes:
            try:
                written.result()
            except Exception as exc:  # the disk full, say: one line, naming the file
                raise DtprofError(
                    f"{file}: cannot write its conversion ({type(exc).__name__}: {exc})"
                ) from None

    def close(self) -> None:
        """Let the writes under way end, drop the others, and stop the thread."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


def _run(
    files: list[Path],
    fallbacks: list[tuple[int, str]],
    tmp: Path | None,
    per_rank: PerRank | None,
    progress: bool,
    writer: _Writer,
) -> dict[int, Converted]:
    """Convert every file: in this process and, with more CPUs, in worker processes beside it
    (dtprof.beside: this one takes files from the last, the workers from the first). Where a
    thread scans every file ahead (kineto_ahead, on two CPUs), this process converts them all
    alone, each scanned file first, scanning one itself when none is ready, and ``writer``
    writes their Parquet files.

    That is the order in which files scanned ahead during the imports (kineto_ahead) were
    scanned, and those stay with this process, but for the first file, whose scan the worker
    forked next inherits. With a scan ahead, this process converts its first file before the
    workers fork, while the scan goes on: they start with the imports' and the first file's
    work done."""
    outs = [tmp / f"file-{i}" if tmp is not None else None for i in range(len(files))]
    jobs = [(f, fb, out, per_rank) for f, fb, out in zip(files, fallbacks, outs, strict=True)]
    started, total, read = time.monotonic(), sum(f.stat().st_size for f in files), 0
    done: dict[int, tuple[int, str, int, RankMeta, Any]] = {}
    ahead = kineto_ahead.current()

    def finished(i: int, result: Converted) -> None:
        nonlocal read
        done[i] = result
        read += files[i].stat().st_size
        if progress and time.monotonic() - started > PROGRESS_AFTER_S:
            print(
                f"dtprof: imported {len(done)}/{len(files)} profiler traces "
                f"({read / 2**20:,.0f} of {total / 2**20:,.0f} MiB)",
                file=sys.stderr,
                flush=True,
            )

    if ahead is not None and ahead.every:  # alone, a thread scanning every file (two CPUs)
        left = list(reversed(range(len(files))))
        while left:
            i = left.pop(ahead.next_of([files[j] for j in left]))
            write = functools.partial(writer.write, files[i])
            finished(i, _convert_one(*jobs[i], write=write))
        return done

    def scanned_here(i: int) -> bool:
        """Whether a file was (or is being) scanned ahead; if not, it is kept from the scan."""
        return ahead is not None and not ahead.reserve(files[i])

    run_beside(
        _convert_job,
        jobs,
        finished,
        keep=scanned_here,
        name=lambda i: str(files[i]),
        first_here=ahead is not None,
    )
    return done


def _finish(
    files: list[Path],
    done: dict[int, tuple[int, str, int, RankMeta, Any]],
    tmp: Path | None,
) -> tuple[list[tuple[RankMeta, Any]], Callable[[], None]]:
    """Check ranks and agree on the world size; and what then writes meta.json and names the
    rank folders (once their tables are written)."""
    owner: dict[int, Path] = {}
    for i in sorted(done):
        rank = done[i][0]
        if rank in owner:
            raise DtprofError(f"{files[i]}: rank {rank} again (also {owner[rank].name})")
        owner[rank] = files[i]
    guessed = [files[i].name for i in sorted(done) if done[i][1] != "distributedInfo"]
    if guessed:
        how = sorted({done[i][1] for i in done if done[i][1] != "distributedInfo"})
        print(
            f"dtprof: warning: {len(guessed)} file(s) without distributedInfo.rank, rank taken "
            f"from the {' or '.join(how)}: {', '.join(guessed[:4])}"
            + (" ..." if len(guessed) > 4 else ""),
            file=sys.stderr,
        )
    world = max([d[2] for d in done.values()] + [max(owner) + 1, len(files)])
    results = []
    for i in sorted(done, key=lambda i: done[i][0]):
        rank, rank_from, _, meta, result = done[i]
        meta = replace(meta, world_size=world)
        done[i] = (rank, rank_from, world, meta, result)
        if result is not None and isinstance(getattr(result, "meta", None), RankMeta):
            # a per-rank summary (dtprof.analysis), made before the world size was known
            result = dataclasses.replace(result, meta=meta)
        results.append((meta, result))

    def name_folders() -> None:
        if tmp is None:
            return
        for i in sorted(done):
            rank, meta, folder = done[i][0], done[i][3], tmp / f"file-{i}"
            (folder / META_FILE).write_bytes(_json(encode(meta)))
            os.replace(folder, tmp / rank_dir_name(rank))

    return results, name_folders


def _json(obj: Any) -> bytes:
    import orjson

    return orjson.dumps(obj, option=orjson.OPT_INDENT_2)


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
