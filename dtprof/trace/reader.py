"""Reading a dtprof trace directory: its tables in Arrow, times on rank 0's clock, and
load_trace(), which gives them as pandas DataFrames.

pandas is imported only where a DataFrame is made: the analyzer works on Arrow and numpy, and
importing pandas was a fifth of a cold ``analyze``.
"""

from __future__ import annotations

import functools
import json
import os
import stat
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from dtprof.errors import DtprofError
from dtprof.trace import live
from dtprof.trace.layout import READABLE_VERSIONS
from dtprof.trace.meta import ClockParams, InflightOp, RankMeta, as_dict, decode
from dtprof.trace.schema import (
    INFLIGHT_FILE,
    LIVE_PREFIX,
    META_FILE,
    RANK_DIR_PREFIX,
    SCHEMA_VERSION,
    SEALED_PREFIX,
    TABLES,
    Table,
)

if TYPE_CHECKING:
    import pandas as pd


def _no_frame() -> pd.DataFrame:
    import pandas as pd

    return pd.DataFrame()


@dataclass
class Trace:
    """A whole run: one DataFrame per table, every table with a ``rank`` column first.

    Times (``*_ns``) are int64 nanoseconds on rank 0's wall clock (Unix epoch).
    """

    path: Path
    ranks: pd.DataFrame
    steps: pd.DataFrame
    spans: pd.DataFrame
    collectives: pd.DataFrame
    scalars: pd.DataFrame
    samples: pd.DataFrame
    fingerprints: pd.DataFrame
    groups: pd.DataFrame
    events: pd.DataFrame
    inflight: pd.DataFrame
    meta: dict[int, RankMeta] = field(default_factory=dict)
    kernels: pd.DataFrame = field(default_factory=_no_frame)  # imported GPU activity
    gpu_spans: pd.DataFrame = field(default_factory=_no_frame)  # CUDA-event times (recorded)

    @property
    def world_size(self) -> int:
        return int(self.ranks["world_size"].max()) if len(self.ranks) else 0


def find_rank_dirs(path: Path) -> list[tuple[int, Path]]:
    """The (rank, folder) pairs of a trace directory, sorted by rank."""
    if not path.exists():
        raise DtprofError(f"{path}: no such directory")
    if not path.is_dir():
        raise DtprofError(f"{path}: not a directory (a dtprof trace is a directory)")
    found: dict[int, Path] = {}
    for entry in list(os.scandir(path)):  # read whole: the iterator closes at its end
        if entry.is_dir() and entry.name.startswith(RANK_DIR_PREFIX):
            number = entry.name[len(RANK_DIR_PREFIX) :]
            if not number.isdigit():
                raise DtprofError(f"{entry.path}: rank folder name is not rank=<number>")
            if int(number) in found:
                raise DtprofError(
                    f"{entry.path}: rank {int(number)} twice (also {found[int(number)].name})"
                )
            found[int(number)] = Path(entry.path)
    if not found:
        raise DtprofError(f"{path}: not a dtprof trace (no rank=NNNNN folders)")
    return sorted(found.items())


MAX_JSON_BYTES = 64 << 20  # meta.json is a few KB, inflight.json one row per operation


def read_json(file: Path) -> Any:
    """A small JSON file of a trace: a regular file, at most MAX_JSON_BYTES, not too deep."""
    try:
        with open(file, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise DtprofError(f"{file}: not a regular file")
            data = f.read(MAX_JSON_BYTES + 1)
    except FileNotFoundError:
        raise DtprofError(f"{file}: missing (is this rank's folder complete?)") from None
    except OSError as exc:
        raise DtprofError(f"{file}: not readable ({exc.strerror or exc})") from None
    if len(data) > MAX_JSON_BYTES:
        raise DtprofError(f"{file}: larger than {MAX_JSON_BYTES >> 20} MiB, not read")
    try:
        return json.loads(data)
    except RecursionError:
        raise DtprofError(f"{file}: nested too deeply") from None
    except ValueError as exc:
        raise DtprofError(f"{file}: not readable JSON ({exc})") from None


def read_meta(folder: Path) -> RankMeta:
    """A rank's meta.json, checked for the schema version and the types of its fields."""
    file = folder / META_FILE
    meta = read_json(file)
    if not isinstance(meta, dict) or "schema_version" not in meta or "rank" not in meta:
        raise DtprofError(f"{file}: not a dtprof rank metadata file")
    version = meta["schema_version"]
    if version not in READABLE_VERSIONS:
        newer = isinstance(version, int) and version > SCHEMA_VERSION
        hint = "; upgrade dtprof" if newer else ""
        readable = " and ".join(map(str, READABLE_VERSIONS))
        raise DtprofError(
            f"{file}: trace schema version {version!r:.40}, this dtprof reads {readable}{hint}"
        )
    try:
        return decode(meta, RankMeta)
    except ValueError as exc:
        raise DtprofError(f"{file}: {exc}") from None


def read_table(folder: Path, table: Table) -> pa.Table:
    """One rank's table: sealed Parquet parts plus the open segment's whole frames."""
    tdir = folder / table.name
    pieces: list[pa.Table] = []
    if not tdir.is_dir():
        return table.empty
    sealed: dict[int, Path] = {}
    unsealed: dict[int, Path] = {}
    entries = list(os.scandir(tdir))
    live.refuse_legacy(tdir, [entry.name for entry in entries])
    for entry in entries:
        name = entry.name
        if name.startswith((SEALED_PREFIX, LIVE_PREFIX)) and not entry.is_file():
            raise DtprofError(f"{entry.path}: not a regular file")
        if name.startswith(SEALED_PREFIX) and name.endswith(".parquet"):
            sealed[_segment_number(entry.path, name, SEALED_PREFIX)] = Path(entry.path)
        elif name.startswith(LIVE_PREFIX) and name.endswith(live.SUFFIX):
            unsealed[_segment_number(entry.path, name, LIVE_PREFIX)] = Path(entry.path)
    for number in sorted(set(sealed) | set(unsealed)):
        if number in sealed:  # a sealed part wins over a segment left by a crash mid-seal
            pieces.append(_read_parquet(sealed[number], table))
            continue
        rows = _read_live(unsealed[number], table)
        if rows is None:  # sealed by the running job since the folder was listed
            part = tdir / f"{SEALED_PREFIX}{number:06d}.parquet"
            rows = _read_parquet(part, table) if part.exists() else table.empty
        pieces.append(rows)
    if not pieces:
        return table.empty
    return pa.concat_tables(pieces)


def _segment_number(path: str, name: str, prefix: str) -> int:
    digits = name[len(prefix) :].split(".")[0]
    if not digits.isdigit():
        raise DtprofError(f"{path}: unexpected file name in a trace table folder")
    return int(digits)


def _read_parquet(path: Path, table: Table) -> pa.Table:
    try:
        # ParquetFile.read skips the dataset layer of read_table: a few times faster on the
        # small parts a trace is made of
        with pq.ParquetFile(path) as part:
            data = part.read()
    except (OSError, pa.ArrowException) as exc:
        raise DtprofError(f"{path}: not a readable Parquet file ({exc})") from None
    return conform_table(path, data, table)


def _read_live(path: Path, table: Table) -> pa.Table | None:
    """Every whole frame of a live segment (a torn last one is left); None when the segment
    is gone (sealed in the meantime)."""
    try:
        return live.read(path, table)[0]
    except FileNotFoundError:
        return None


def conform_table(path: Path, data: pa.Table, table: Table) -> pa.Table:
    """``data`` as ``table`` declares it (its columns, in order, cast); a mismatch names path."""
    missing = [c for c in table.column_names if c not in data.column_names]
    if missing:
        raise DtprofError(f"{path}: table {table.name} lacks column(s) {', '.join(missing)}")
    data = data.select(table.column_names)
    try:
        return data.cast(table.schema)
    except (pa.ArrowException, ValueError) as exc:
        raise DtprofError(f"{path}: column types do not match table {table.name} ({exc})") from None


# inflight.json rows, as load_trace() returns them
INFLIGHT_DTYPES = {
    "rank": "int32",
    "step": "int64",
    "group": "str",
    "seq": "int64",
    "op": "str",
    "bytes": "int64",
    "dtype": "str",
    "peer": "Int32",
    "start_ns": "int64",
    "async_op": "bool",
    "label": "str",
}

INFLIGHT_SCHEMA = pa.schema(
    [
        ("rank", pa.int32()),
        ("step", pa.int64()),
        ("group", pa.string()),
        ("seq", pa.int64()),
        ("op", pa.string()),
        ("bytes", pa.int64()),
        ("dtype", pa.string()),
        ("peer", pa.int32()),
        ("start_ns", pa.int64()),
        ("async_op", pa.bool_()),
        ("label", pa.string()),
    ]
)


@functools.cache
def _nullable_ints() -> dict[pa.DataType, Any]:
    """Columns that may be null (peer, stage, microbatch) stay integers in pandas, not floats."""
    import pandas as pd

    return {pa.int16(): pd.Int16Dtype(), pa.int32(): pd.Int32Dtype()}


def clock_params(meta: RankMeta | None) -> ClockParams:
    """How one rank's times map onto rank 0's clock (None: a rank that says nothing of it).

    Drift is applied only when the exit estimate differs from the start estimate by more than
    their error bounds together; otherwise the estimate with the smaller error holds throughout.
    """
    if meta is None:
        return ClockParams(0, 0.0, 0.0, 0.0)
    clock = meta.clock
    base, start, end = clock.mono_to_wall_ns, clock.start, clock.end
    off0, t0 = float(start.offset_ns), float(start.mono_ns)
    if end is None or end.mono_ns <= t0:
        return ClockParams(base, off0, t0, 0.0)
    off1, t1 = float(end.offset_ns), float(end.mono_ns)
    if abs(off1 - off0) <= start.error_ns + end.error_ns:
        return ClockParams(base, off0 if start.error_ns <= end.error_ns else off1, t0, 0.0)
    return ClockParams(base, off0, t0, (off1 - off0) / (t1 - t0))


def read_rank_meta(folder: Path) -> RankMeta:
    """A rank folder's meta.json, checked against the rank in the folder's name."""
    meta = read_meta(folder)
    named = folder.name[len(RANK_DIR_PREFIX) :]
    if not folder.name.startswith(RANK_DIR_PREFIX) or not named.isdigit():
        raise DtprofError(f"{folder}: rank folder name is not rank=<number>")
    if meta.rank != int(named):
        raise DtprofError(
            f"{folder / META_FILE}: says rank {meta.rank} but the folder is rank {int(named)}"
        )
    return meta


def rank_table(
    table: Table, by_rank: list[tuple[int, pa.Table]], params: dict[int, ClockParams]
) -> pa.Table:
    """One table of some ranks in Arrow: a rank column first, times on rank 0's clock (nulls
    stay null)."""
    if not any(t.num_rows for _, t in by_rank):  # many tables of a trace are empty
        return _empty_table(table)
    present = by_rank[0][1].schema.names  # all of the table's columns, or some
    times = [c for c in table.time_columns if c in present]
    parts = [
        aligned(t, times, params[r]).add_column(
            0, "rank", pa.array(np.full(t.num_rows, r, np.int32))
        )
        for r, t in by_rank
    ]
    return pa.concat_tables(parts) if len(parts) > 1 else parts[0]


@functools.cache
def _empty_table(table: Table) -> pa.Table:
    return table.empty.add_column(0, "rank", pa.array([], pa.int32()))


def aligned(t: pa.Table, times: list[str], params: ClockParams) -> pa.Table:
    """t (one rank's rows) with its times on rank 0's clock: moved by one number when the
    rank's clock does not drift, else each by the offset at its own time."""
    base, off0, t0, slope = params
    if not slope:
        return shifted(t, times, params)
    for name in times:
        i = t.schema.get_field_index(name)
        column = t.column(i)
        local = pc.fill_null(column, 0).to_numpy().astype(np.int64)
        # the wall-clock anchor (~1.8e18 ns) stays int64: float64 would round it to 256 ns
        offset = np.rint(off0 + slope * (local.astype(np.float64) - t0)).astype(np.int64)
        missing = column.is_null().to_numpy(zero_copy_only=False) if column.null_count else None
        t = t.set_column(i, name, pa.array(local + int(base) - offset, pa.int64(), mask=missing))
    return t


def _constant_shift(params: ClockParams) -> int:
    """What moves a rank's stamps onto rank 0's clock when its clock does not drift (ns)."""
    base, off0, _, _ = params
    return int(base) - int(np.rint(off0))


def shifted(t: pa.Table, times: list[str], params: ClockParams) -> pa.Table:
    """t with its times moved onto rank 0's clock by the rank's constant offset (no drift)."""
    shift = pa.scalar(_constant_shift(params), pa.int64())
    for name in times:
        i = t.schema.get_field_index(name)
        t = t.set_column(i, name, pc.add(t.column(i), shift))
    return t


def table_frame(
    table: Table, by_rank: list[tuple[int, pa.Table]], params: dict[int, ClockParams]
) -> pd.DataFrame:
    """rank_table() as pandas: times with nulls stay integers (nullable)."""
    return arrow_frame(rank_table(table, by_rank, params), table.time_columns)


def arrow_frame(data: pa.Table, integers: Sequence[str]) -> pd.DataFrame:
    """An Arrow table as pandas: int16 and int32 columns (peer, stage, microbatch) as nullable
    integers but the rank, those of ``integers`` that hold nulls too (as floats, times near
    1.7e18 ns would round), dictionaries as categories."""
    import pandas as pd

    ranks = data.column("rank").to_numpy() if "rank" in data.column_names else None
    df = data.to_pandas(types_mapper=_nullable_ints().get)
    if ranks is not None:  # never null: plain int32, not the nullable kind
        df["rank"] = ranks
    for name in integers:  # with nulls: nullable integers, not floats
        column = data.column(name) if name in data.column_names else None
        if column is not None and column.null_count and pa.types.is_integer(column.type):
            values = pc.fill_null(column, 0).to_numpy()
            missing = column.is_null().to_numpy(zero_copy_only=False)
            df[name] = pd.arrays.IntegerArray(values, missing)
    return df


def inflight_table(
    by_rank: list[tuple[int, list[InflightOp]]], params: dict[int, ClockParams]
) -> pa.Table:
    """inflight.json rows of some ranks in Arrow, start_ns on rank 0's clock."""
    parts = [
        aligned(
            pa.Table.from_pylist(
                [dict(as_dict(op), rank=rank) for op in ops], schema=INFLIGHT_SCHEMA
            ),
            ["start_ns"],
            params[rank],
        )
        for rank, ops in by_rank
        if ops
    ]
    if not parts:  # the usual case, once per rank
        return INFLIGHT_SCHEMA.empty_table()
    return pa.concat_tables(parts) if len(parts) > 1 else parts[0]


def inflight_frame(
    by_rank: list[tuple[int, list[InflightOp]]], params: dict[int, ClockParams]
) -> pd.DataFrame:
    """inflight_table() as pandas."""
    return arrow_frame(inflight_table(by_rank, params), ["start_ns"]).astype(INFLIGHT_DTYPES)


def _load_rank(folder: Path) -> tuple[RankMeta, dict[str, pa.Table], list[InflightOp]]:
    meta = read_rank_meta(folder)
    tables = {name: read_table(folder, t) for name, t in TABLES.items()}
    return meta, tables, read_inflight(folder)


def read_inflight(folder: Path) -> list[InflightOp]:
    """A rank's inflight.json: the operations it had entered and not seen complete."""
    file = folder / INFLIGHT_FILE
    if not file.exists():
        return []
    rows = read_json(file)
    if not isinstance(rows, list):
        raise DtprofError(f"{file}: not a list of operations")
    try:
        return decode(rows, list[InflightOp])
    except ValueError as exc:
        raise DtprofError(f"{file}: not a list of operations ({exc})") from None


def load_trace(path: str | os.PathLike[str], threads: int | None = None) -> Trace:
    """Read every rank of a trace directory (or of PyTorch profiler traces); times aligned."""
    import pandas as pd

    from dtprof.trace.importer import resolve  # imports this module

    root = Path(path)
    rank_dirs = find_rank_dirs(resolve(root) if root.exists() else root)
    workers = threads or min(8, (os.cpu_count() or 2) * 2)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        loaded = list(pool.map(lambda rd: _load_rank(rd[1]), rank_dirs))

    metas = {rank: meta for (rank, _), (meta, _, _) in zip(rank_dirs, loaded, strict=True)}
    sizes = {m.world_size for m in metas.values()}
    if len(sizes) > 1:
        raise DtprofError(
            f"{root}: ranks disagree on the world size ({sorted(sizes)}); "
            "are two runs mixed in one directory?"
        )
    params = {rank: clock_params(meta) for rank, meta in metas.items()}

    frames: dict[str, pd.DataFrame] = {}
    for name, table in TABLES.items():
        by_rank = [
            (rank, tables[name])
            for (rank, _), (_, tables, _) in zip(rank_dirs, loaded, strict=True)
        ]
        frames[name] = table_frame(table, by_rank, params)
    groups = frames["groups"]
    if not groups.empty:
        groups = groups.drop(columns="rank").drop_duplicates("group").reset_index(drop=True)
        groups["ranks"] = groups["ranks"].map(lambda r: [int(x) for x in r])
    frames["groups"] = groups

    inflight = inflight_frame(
        [(rank, rows) for (rank, _), (_, _, rows) in zip(rank_dirs, loaded, strict=True)], params
    )

    ranks = pd.DataFrame([_rank_row(meta) for meta in metas.values()])
    return Trace(path=root, ranks=ranks, inflight=inflight, meta=metas, **frames)


def _rank_row(meta: RankMeta) -> dict[str, Any]:
    params = clock_params(meta)
    return {
        "rank": meta.rank,
        "world_size": meta.world_size,
        "host": meta.host,
        "pid": meta.pid,
        "device": meta.device,
        "backend": meta.backend,
        "model_kind": meta.model_kind,
        "status": meta.status,
        "steps": meta.steps,
        "clock_offset_ns": int(params.offset_ns),
        "clock_error_ns": int(meta.clock.start.error_ns),
        "clock_drift_ppm": params.drift * 1e6,
        "pipeline_schedule": meta.pipeline.schedule if meta.pipeline else None,
        "started_at": meta.started_at,
        "ended_at": meta.ended_at,
    }
