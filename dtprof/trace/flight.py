"""Import PyTorch Flight Recorder dumps: one file per rank, pickle or JSON, as a dtprof trace.

Flight Recorder keeps a ring buffer of each process group's collectives. Its dumps come as
files named ``<prefix><rank>`` (what ``TORCH_FR_DUMP_TEMP_FILE`` / the NCCL dump on timeout
write, a pickle) or as the bytes of ``torch._C._distributed_c10d._dump_fr_trace()`` (pickle)
and ``_dump_fr_trace_json()`` (JSON) saved by the job itself. The rank is the number at the end
of the file name; the dump holds none.

A pickle is never loaded with ``pickle.load``: the unpickler below refuses every global (class,
function, module), so only plain dicts, lists, tuples, strings, numbers, bytes and None come
out, and a crafted file cannot run code.

Mapping: an entry is complete when its state is ``completed`` or its sequence number is at most
its group's ``last_completed_collective`` in ``pg_status`` (gloo leaves every entry
``scheduled``, so the counters decide there); complete entries become ``collectives`` rows, the
others are in flight (``inflight.json``) and, with their Python frames, ``hang`` events as the
watchdog writes them. Times are Flight Recorder's wall clock; there are no steps (step 0).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import re
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from dtprof import __version__
from dtprof.errors import DtprofError
from dtprof.trace.meta import Imported, InflightOp, RankMeta, encode
from dtprof.trace.schema import (
    INFLIGHT_FILE,
    META_FILE,
    SCHEMA_VERSION,
    SEALED_PREFIX,
    TABLES,
    rank_dir_name,
)

MAX_DUMP_BYTES = 1 << 30  # a ring buffer of 20,000 entries with frames is tens of MB
FLIGHT_VERSION = 1  # bump when the mapping changes: cached conversions are then redone
_JSON_HEAD = re.compile(
    rb'^\s*\{\s*"(comm_lib_version|entries|pg_config|pg_status|nccl_comm_state|version)"'
)
_RANK_IN_NAME = re.compile(r"(\d+)(\.(json|pkl|pickle))?$")
_P2P_PEERS = re.compile(r"(\d+)\s*(->|<-)\s*(\d+)")
_MAX_ELEMENTS = 1 << 62
# Flight Recorder's dtype names (c10 ScalarType) -> torch's, with their size in bytes
_DTYPES = {
    "Float": ("float32", 4),
    "Double": ("float64", 8),
    "Half": ("float16", 2),
    "BFloat16": ("bfloat16", 2),
    "Int": ("int32", 4),
    "Long": ("int64", 8),
    "Short": ("int16", 2),
    "Char": ("int8", 1),
    "Byte": ("uint8", 1),
    "Bool": ("bool", 1),
    "ComplexFloat": ("complex64", 8),
    "ComplexDouble": ("complex128", 16),
    "Float8_e4m3fn": ("float8_e4m3fn", 1),
    "Float8_e5m2": ("float8_e5m2", 1),
}


class _PlainUnpickler(pickle.Unpickler):
    """Loads plain containers and scalars only: every class, function or module is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refused to load {module}.{name} (only plain data is read)")


def _head(path: Path, n: int = 256) -> bytes:
    try:
        with open(path, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return b""
            return f.read(n)
    except OSError:
        return b""


def is_dump(path: Path) -> bool:
    """Whether a file looks like a Flight Recorder dump (a pickle, or FR's JSON object)."""
    head = _head(path)
    return (len(head) > 1 and head[0] == 0x80 and 2 <= head[1] <= 5) or bool(_JSON_HEAD.match(head))


def dump_files(folder: Path) -> list[Path]:
    """The Flight Recorder dumps directly in a folder, sorted by name."""
    try:
        entries = sorted(folder.iterdir())
    except OSError:
        return []
    return [p for p in entries if not p.name.startswith(".") and p.is_file() and is_dump(p)]


def read_dump(path: Path) -> dict[str, Any]:
    """One dump as plain Python data, checked to be a Flight Recorder dump."""
    try:
        with open(path, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise DtprofError(f"{path}: not a regular file")
            data = f.read(MAX_DUMP_BYTES + 1)
    except OSError as exc:
        raise DtprofError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if len(data) > MAX_DUMP_BYTES:
        raise DtprofError(f"{path}: larger than {MAX_DUMP_BYTES >> 20} MiB, not read")
    pickled = data[:1] == b"\x80"
    try:
        dump = _PlainUnpickler(io.BytesIO(data)).load() if pickled else json.loads(data)
    except RecursionError:
        raise DtprofError(f"{path}: nested too deeply to be a Flight Recorder dump") from None
    except MemoryError:  # a length in the file far beyond the file: garbage, not a dump
        raise DtprofError(
            f"{path}: not a readable Flight Recorder dump (it declares more data than memory holds)"
        ) from None
    except Exception as e:  # damaged opcodes raise anything (AttributeError, SystemError, ...)
        said = " ".join(str(e).split())  # one line
        raise DtprofError(f"{path}: not a readable Flight Recorder dump ({said})") from None
    if not isinstance(dump, dict) or not isinstance(dump.get("entries", []), list):
        raise DtprofError(f"{path}: not a Flight Recorder dump (no list of entries)")
    return dump


def rank_of(path: Path) -> int:
    """The rank a dump belongs to: the number at the end of its name (``..._rank_3``)."""
    found = _RANK_IN_NAME.search(path.name)
    if found is None:
        raise DtprofError(
            f"{path}: no rank at the end of the file name (name dumps <prefix><rank>, "
            "as TORCH_FR_DUMP_TEMP_FILE does)"
        )
    return int(found.group(1))


@dataclass(frozen=True)
class Entry:
    """One Flight Recorder entry, checked and normalized."""

    group: str
    seq: int
    op: str
    bytes: int
    dtype: str | None
    peer: int | None
    start_ns: int
    end_ns: int
    complete: bool
    label: str | None
    thread: str
    frames: list[dict[str, Any]]


def _int(value: Any, default: int = 0) -> int:
    if isinstance(value, bool) or value is None:
        return default
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.lstrip("-").isdigit():
        return int(value)
    raise ValueError(f"not an integer: {value!r:.40}")


def _bytes(sizes: Any, dtypes: Any) -> tuple[int, str | None]:
    if not isinstance(sizes, list) or not isinstance(dtypes, list):
        return 0, None
    total = 0
    for shape, dtype in zip(sizes, dtypes, strict=False):
        _, itemsize = _DTYPES.get(str(dtype), (str(dtype).lower(), 1))
        n = 1
        for dim in shape if isinstance(shape, list) else []:
            n *= _int(dim)
            if n < 0 or n > _MAX_ELEMENTS:  # checked as it grows: a long shape stays cheap
                raise ValueError(f"tensor size {shape!r:.60} out of range")
        total += n * itemsize
    first = _DTYPES.get(str(dtypes[0]), (str(dtypes[0]).lower(), 1))[0] if dtypes else None
    return min(total, (1 << 63) - 1), first


def _call_site(frames: list[dict[str, Any]]) -> str | None:
    """The innermost frame outside torch: where the program called the collective."""
    for f in frames:
        file = str(f.get("filename", ""))
        if "/torch/" not in file:
            return f"{os.path.basename(file)}:{f.get('line')} in {f.get('name')}"
    return None


def _last_completed(dump: dict[str, Any]) -> dict[str, int]:
    status = dump.get("pg_status") or {}
    out = {}
    if isinstance(status, dict):
        for group, counters in status.items():
            if isinstance(counters, dict):
                out[str(group)] = _int(counters.get("last_completed_collective"), -1)
    return out


def entries(dump: dict[str, Any]) -> list[Entry]:
    """Every entry of a dump, normalized (ValueError on one that makes no sense)."""
    done = _last_completed(dump)
    out = []
    for i, e in enumerate(dump.get("entries", [])):
        if not isinstance(e, dict):
            raise ValueError(f"entry {i} is not a mapping")
        pg = e.get("process_group") or ("", "")
        group = str(pg[0]) if isinstance(pg, (list, tuple)) and pg else str(pg)
        name = str(e.get("profiling_name", ""))
        kind = name.split(":", 1)[-1].strip()
        op = kind.split(" ", 1)[0] or "unknown"
        p2p = bool(e.get("is_p2p"))
        peer = None
        peers = _P2P_PEERS.search(kind)
        if p2p and peers:
            peer = int(peers.group(3) if peers.group(2) == "->" else peers.group(1))
        seq = _int(e.get("p2p_seq_id") if p2p else e.get("collective_seq_id"))
        nbytes, dtype = _bytes(e.get("input_sizes"), e.get("input_dtypes"))
        start = _int(e.get("time_created_ns"))
        end = _int(e.get("time_discovered_completed_ns")) or start
        state = str(e.get("state", ""))
        complete = state == "completed" or (
            seq <= done[group] if group in done and not p2p else bool(e.get("retired"))
        )
        raw_frames = e.get("frames") or []
        frames = (
            [f for f in raw_frames if isinstance(f, dict)] if isinstance(raw_frames, list) else []
        )
        out.append(
            Entry(
                group=group,
                seq=seq,
                op=op,
                bytes=nbytes,
                dtype=dtype,
                peer=peer,
                start_ns=start,
                end_ns=max(end, start),
                complete=complete,
                label=_call_site(frames),
                thread=str(e.get("thread_name") or e.get("thread_id") or "main"),
                frames=frames,
            )
        )
    return out


def _group_ranks(dump: dict[str, Any], groups: set[str]) -> dict[str, list[int]]:
    """Members of each group from pg_config; gloo leaves the name empty there (one group)."""
    config = dump.get("pg_config") or {}
    out: dict[str, list[int]] = {}
    if not isinstance(config, dict):
        return out
    nameless = []
    for key, value in config.items():
        if not isinstance(value, dict):
            continue
        ranks = value.get("ranks")
        if isinstance(ranks, str):
            ranks = json.loads(ranks) if ranks.strip().startswith("[") else None
        if not isinstance(ranks, list) or not all(type(r) is int for r in ranks):
            continue
        name = str(value.get("name") or key)
        if name:
            out[name] = ranks
        else:
            nameless.append(ranks)
    unnamed = sorted(groups - set(out))
    if len(nameless) == 1 and len(unnamed) == 1:
        out[unnamed[0]] = nameless[0]
    return out


def _tables(items: list[Entry], groups: dict[str, list[int]], backend: str) -> dict[str, pa.Table]:
    done = [e for e in items if e.complete]
    coll = [
        (0, e.group, e.seq, e.op, e.bytes, e.dtype, e.peer, e.start_ns, e.end_ns, False, e.label)
        for e in done
    ]
    events = []
    for e in items:
        if e.complete or e.peer is not None:
            continue
        detail = {
            "group": e.group,
            "seq": e.seq,
            "op": e.op,
            "bytes": e.bytes,
            "dtype": e.dtype,
            "peer": None,
            "start_ns": e.start_ns,
            "waited_s": None,
            "label": e.label,
            "source": "flight recorder",
            "stacks": [
                {
                    "thread": e.thread,
                    "frames": [
                        {
                            "file": str(f.get("filename", "")),
                            "line": f.get("line"),
                            "function": str(f.get("name", "")),
                            "code": "",
                        }
                        for f in reversed(e.frames)
                    ],
                }
            ],
        }
        message = f"{e.op} (group {e.group}, seq {e.seq}) in flight in the Flight Recorder dump"
        events.append((0, e.start_ns, "hang", message, json.dumps(detail)))
    group_rows = [(g, backend, r) for g, r in sorted(groups.items())]
    rows: dict[str, list[tuple[Any, ...]]] = {
        "collectives": coll,
        "events": events,
        "groups": group_rows,
    }
    out = {}
    for name, table in TABLES.items():
        data = rows.get(name, [])
        if data:
            columns = list(zip(*data, strict=True))
            out[name] = pa.table(
                [pa.array(c, type=col.type) for c, col in zip(columns, table.columns, strict=True)],
                schema=table.schema,
            )
        else:
            out[name] = table.empty
    return out


def _inflight(items: list[Entry]) -> list[InflightOp]:
    return [
        InflightOp(
            step=0,
            group=e.group,
            seq=e.seq,
            op=e.op,
            bytes=e.bytes,
            dtype=e.dtype,
            peer=e.peer,
            start_ns=e.start_ns,
            async_op=False,
            label=e.label,
        )
        for e in items
        if not e.complete
    ]


def _meta(path: Path, rank: int, world: int, dump: dict[str, Any], backend: str) -> RankMeta:
    return RankMeta(
        schema_version=SCHEMA_VERSION,
        rank=rank,
        world_size=world,
        backend=backend,
        device="cpu" if backend == "gloo" else None,
        status="flight recorder dump",
        model_kind="none",
        imported=Imported(
            format="flight-recorder",
            file=str(path),
            rank_from="file name",
            flight_recorder_version=str(dump.get("version", "")),
            entries=len(dump.get("entries", [])),
        ),
    )


def convert_dumps(folder: Path, out: Path) -> int:
    """Write the dumps of ``folder`` as a dtprof trace at ``out`` (complete or not at all)."""
    files = dump_files(folder) if folder.is_dir() else [folder]
    if not files:
        raise DtprofError(f"{folder}: no Flight Recorder dumps")
    owner: dict[int, Path] = {}
    loaded = []
    for f in files:
        rank = rank_of(f)
        if rank in owner:
            raise DtprofError(f"{f}: rank {rank} again (also {owner[rank].name})")
        owner[rank] = f
        dump = read_dump(f)
        try:
            items = entries(dump)
            groups = _group_ranks(dump, {e.group for e in items})
        except (ValueError, TypeError, AttributeError, RecursionError) as exc:
            raise DtprofError(f"{f}: not a readable Flight Recorder dump ({exc})") from None
        names = [e for e in dump["entries"] if isinstance(e, dict)]
        first = str(names[0].get("profiling_name", "")) if names else ""
        backend = first.split(":", 1)[0] if ":" in first else "unknown"
        loaded.append((f, rank, dump, items, groups, backend))
    world = max(
        [max(owner) + 1, len(files)]
        + [max(r) + 1 for *_, groups, _ in loaded for r in groups.values() if r]
    )
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        for f, rank, dump, items, groups, backend in loaded:
            rdir = tmp / rank_dir_name(rank)
            for name, table in _tables(items, groups, backend).items():
                (rdir / name).mkdir(parents=True, exist_ok=True)
                if table.num_rows:
                    TABLES[name].write_parquet(
                        table, rdir / name / f"{SEALED_PREFIX}000000.parquet"
                    )
            meta = _meta(f, rank, world, dump, backend)
            (rdir / META_FILE).write_text(json.dumps(encode(meta), indent=1))
            (rdir / INFLIGHT_FILE).write_text(json.dumps(encode(_inflight(items)), indent=1))
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(out, ignore_errors=True)
        os.replace(tmp, out)
    except OSError as exc:
        raise DtprofError(f"{out}: cannot write the converted trace ({exc.strerror})") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return len(loaded)


def resolve_dumps(path: Path) -> Path:
    """A dtprof trace for Flight Recorder dumps: converted once into the cache, then reused."""
    from dtprof.cache import cache_root

    files = dump_files(path) if path.is_dir() else [path]
    key = hashlib.sha1(f"{__version__}/{SCHEMA_VERSION}/{FLIGHT_VERSION}".encode())
    for f in files:
        st = f.stat()
        key.update(f"{f.resolve()}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    target = cache_root() / "flight" / key.hexdigest()[:20]
    if not target.is_dir():
        convert_dumps(path, target)
    return target
