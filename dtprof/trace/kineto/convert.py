"""Every file of a PyTorch profiler-trace path converted into a dtprof trace, file by file.

Each file is read (natively where the reader is built, else by Python), mapped to dtprof's
tables (:mod:`dtprof.trace.kineto.mapping`), written as one rank's folder and, when asked,
summarized at once (``per_rank``: the analyzer's summary), so nothing is read twice. Files are
converted through :func:`dtprof.parallel.map_items`: in this process when it reads them alone
(one file, or two CPUs at most: then a thread scans them natively ahead of it,
:mod:`dtprof.trace.kineto.scan_ahead`), else in a pool of processes; or by a ``mapper`` (a Dask
cluster's), whose workers write nothing.

Rank of each file: ``distributedInfo.rank``; without it the digits after ``rank`` in the file
name (``trace_rank-3.json``); without those, the file's position in the folder sorted by name.
A fallback is reported on stderr. Two files of one rank are an error. The world size is the
largest of the declared ``distributedInfo.world_size``, the highest rank + 1 and the number of
files, so every rank's meta.json agrees.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

from dtprof.errors import DtprofError
from dtprof.parallel import map_items
from dtprof.trace.kineto.files import rank_from_name, trace_files
from dtprof.trace.kineto.mapping import SEQ_FROM, rank_meta, rank_tables
from dtprof.trace.kineto.read import read_kineto
from dtprof.trace.kineto.scan_ahead import reads_alone
from dtprof.trace.meta import RankMeta, encode, replace
from dtprof.trace.schema import META_FILE, SEALED_PREFIX, TABLES, rank_dir_name

# one converted file: rank, how the rank was told, world size, meta.json, per_rank result
Converted = tuple[int, str, int, RankMeta, Any]
PerRank = Callable[[RankMeta, dict[str, pa.Table]], Any]
Mapper = Callable[[Callable[[Any], Any], list[Any]], list[Any]]  # fn over items, in order
Job = tuple[Path, tuple[int, str], Path | None, PerRank | None]  # _convert_one's arguments


def import_kineto(
    path: Path,
    out: Path | None,
    *,
    progress: bool = False,
    per_rank: PerRank | None = None,
    mapper: Mapper | None = None,
) -> list[tuple[RankMeta, Any]]:
    """Convert every file of a Kineto path into ``out`` (if given); (meta, per_rank result) each,
    in rank order.

    ``out`` appears complete or not at all: it is written beside and renamed into place. A
    ``mapper`` (e.g. a Dask cluster's) runs the files instead of this machine; its workers write
    nothing, only per_rank's results come back.
    """
    files = trace_files(path)
    fallbacks = _fallback_ranks(files)
    if mapper is not None:
        jobs: list[Job] = [(f, fb, None, per_rank) for f, fb in zip(files, fallbacks, strict=True)]
        results, _ = _finish(files, dict(enumerate(mapper(_convert_job, jobs))), None)
        return results
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}") if out is not None else None
    try:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        outs = [tmp / f"file-{i}" if tmp is not None else None for i in range(len(files))]
        jobs = [(f, fb, o, per_rank) for f, fb, o in zip(files, fallbacks, outs, strict=True)]
        converted = map_items(
            _convert_job,
            jobs,
            processes=not reads_alone(len(files)),
            progress=progress,
            name=lambda job: str(job[0]),
            what="profiler traces",
        )
        results, name_folders = _finish(files, dict(enumerate(converted)), tmp)
        name_folders()
        if tmp is not None and out is not None:
            os.replace(tmp, out)
    finally:
        if tmp is not None and tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return results


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
) -> Converted:
    """Parse, map, write (when out is given) and run per_rank on one file."""
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
            try:
                _write_tables(out, tables)
            except OSError as exc:  # the disk full, say: one line, naming the file
                raise DtprofError(
                    f"{file}: cannot write its conversion ({type(exc).__name__}: {exc})"
                ) from None
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
    job: Job,
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
