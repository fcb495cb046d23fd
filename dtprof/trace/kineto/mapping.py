"""Map one parsed Kineto file onto dtprof's tables (docs/kineto.md states every rule).

- steps: ``ProfilerStep#N`` annotations; the step number is N as the profiler counted it.
- kernels: every kernel, memcpy and memset on the GPU, by device and stream, with its category
  (communication: ``^nccl.*Kernel``, i.e. ``ncclKernel_*`` and ``ncclDevKernel_*``; memory:
  memcpy / memset; other: names with ``Memcpy`` or ``Sync`` inside; compute: the rest) and the
  step of its CUDA launch (found by correlation id).
- collectives: ``record_param_comms`` operators (those that name a collective, hold a
  ``nccl:``/``gloo:`` annotation or launch a communication kernel) and the ``nccl:``/``gloo:``
  annotations outside any of them. Times are those of the communication kernels they
  launched, else the CPU operator's.
- samples: the last ``[memory]`` reading of each step; spans: other user annotations.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from msgspec import UNSET

from dtprof.trace.kineto.events import NO_ARGS, Args, raw_value
from dtprof.trace.kineto.read import COMM_ANNOTATION_RE, STEP_RE, KinetoFile
from dtprof.trace.meta import Clock, ClockEstimate, Imported, RankMeta
from dtprof.trace.schema import SCHEMA_VERSION, TABLES
from dtprof.trace.steps import Steps, step_at

COMM_KERNEL = re.compile(r"^nccl.*Kernel")
MEMORY_KERNEL = re.compile(r"^(Memcpy|Memset|dma)")
OTHER_KERNEL = re.compile(r"(Memcpy|Sync)")  # neither compute nor communication, as HTA counts
STEP = re.compile(STEP_RE, re.ASCII)  # as the readers find steps (re.ASCII: \s and \d ASCII)
COMM_ANNOTATION = re.compile(COMM_ANNOTATION_RE)
P2P_OPS = pa.array(["send", "recv", "isend", "irecv", "recvanysource"])
OP_NAMES = {
    "allreduce": "all_reduce",
    "allreduce_coalesced": "all_reduce_coalesced",
    "allgather": "all_gather",
    "_allgather_base": "all_gather_into_tensor",
    "allgather_into_tensor": "all_gather_into_tensor",
    "allgather_into_tensor_coalesced": "all_gather_into_tensor_coalesced",
    "reducescatter": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter_tensor",
    "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor_coalesced",
    "alltoall": "all_to_all",
    "alltoall_base": "all_to_all_single",
    "all_to_allv": "all_to_all_single",
    "recvanysource": "recv",
}
DTYPE_BYTES = {
    "float": 4, "float32": 4, "double": 8, "float64": 8, "half": 2, "float16": 2,
    "c10::half": 2, "bfloat16": 2, "c10::bfloat16": 2, "int": 4, "int32": 4, "long": 8,
    "int64": 8, "long int": 8, "short": 2, "int16": 2, "char": 1, "signed char": 1,
    "unsigned char": 1, "byte": 1, "int8": 1, "uint8": 1, "bool": 1,
}  # fmt: skip


class Distinct(NamedTuple):
    """A string column as its distinct values and, per row, the place of its value (nulls at
    the place after the last value): a trace repeats a few names thousands of times, so rules
    run once per distinct name."""

    values: list[str | None]
    at: np.ndarray

    @classmethod
    def of(cls, names: pa.Array) -> Distinct:
        coded = pc.dictionary_encode(names)
        indices = coded.indices
        if indices.null_count:
            indices = pc.fill_null(indices, len(coded.dictionary))
        return cls(coded.dictionary.to_pylist(), indices.to_numpy())

    def found(self, pattern: re.Pattern[str]) -> np.ndarray:
        """Whether each distinct value matches (``pattern.search``), and then False (nulls)."""
        return self._per_value(v is not None and pattern.search(v) is not None for v in self.values)

    def matches(self, pattern: re.Pattern[str]) -> np.ndarray:
        """Whether each row's name matches; nulls do not."""
        return self.found(pattern)[self.at]

    def equal(self, value: str) -> np.ndarray:
        """Whether each row's name is ``value``; nulls are not."""
        return self._per_value(v == value for v in self.values)[self.at]

    @staticmethod
    def _per_value(flags: Iterable[bool]) -> np.ndarray:
        return np.array([*flags, False], bool)  # the last: nulls


def _table(name: str, columns: dict[str, Any]) -> pa.Table:
    schema = TABLES[name].schema
    n = len(next(iter(columns.values()))) if columns else 0
    arrays = [
        _array(columns[f.name], f.type) if f.name in columns else pa.nulls(n, f.type)
        for f in schema
    ]
    return pa.Table.from_arrays(arrays, schema=schema)


def _array(values: Any, type_: pa.DataType) -> pa.Array:
    if isinstance(values, pa.Array | pa.ChunkedArray):
        return values.cast(type_)
    return pa.array(values, type_)


def _steps(kf: KinetoFile, names: Distinct) -> Steps:
    cpu = kf.cpu
    found = [STEP.search(v) if v is not None else None for v in names.values]
    number = np.array([int(m.group("number")) if m else -1 for m in found] + [-1], np.int64)
    each_number = number[names.at]
    idx = np.flatnonzero(each_number >= 0)
    numbers = each_number[idx]
    # a step's annotations (one a thread, as a rule) span from the first start to the last end
    step, each = np.unique(numbers, return_inverse=True)
    start = np.full(len(step), np.iinfo(np.int64).max)
    end = np.full(len(step), np.iinfo(np.int64).min)
    np.minimum.at(start, each, cpu.ts_ns[idx])
    np.maximum.at(end, each, cpu.end_ns[idx])
    order = np.argsort(start, kind="stable")  # ties by number
    return Steps(step[order], start[order], end[order])


CATEGORIES = pa.array(["compute", "communication", "memory", "other"])  # the kernels' categories
COMPUTE, COMMUNICATION, MEMORY, OTHER = range(4)  # their places in CATEGORIES


def kernel_category(names: pa.Array, cats: pa.Array) -> np.ndarray:
    """Each GPU event's category, as its place in CATEGORIES (rules in the module doc)."""
    memcat = np.asarray(
        pc.is_in(cats, pa.array(["gpu_memcpy", "gpu_memset", "Memcpy", "Memset"])).to_numpy(
            zero_copy_only=False
        ),
        bool,
    )
    distinct = Distinct.of(names)  # the rules run once per distinct name
    by_name = np.full(len(distinct.values) + 1, COMPUTE, np.int8)  # the last: no name
    for rule, category in (
        (OTHER_KERNEL, OTHER),
        (MEMORY_KERNEL, MEMORY),
        (COMM_KERNEL, COMMUNICATION),
    ):
        by_name[distinct.found(rule)] = category  # later rules win
    out = by_name[distinct.at]
    out[memcat & (out != COMMUNICATION)] = MEMORY
    return out


class Launches(NamedTuple):
    """Per GPU event, its CUDA launch (the runtime call with its correlation id)."""

    found: np.ndarray  # whether there is one
    ts_ns: np.ndarray  # its time; 0 where none
    tid: np.ndarray  # its thread (meaningless where none)


def gpu_launches(kf: KinetoFile) -> Launches:
    """Each GPU event's launch, found by correlation id (one sort of the launches per file)."""
    n = len(kf.gpu_correlation)
    order = np.argsort(kf.launch_correlation, kind="stable")
    corr = kf.launch_correlation[order]
    if not len(corr):
        return Launches(np.zeros(n, bool), np.zeros(n, np.int64), np.full(n, -1, np.int64))
    pos = np.minimum(np.searchsorted(corr, kf.gpu_correlation), len(corr) - 1)
    found = np.asarray(corr[pos] == kf.gpu_correlation, bool)
    ts = kf.launch_ts_ns[order][pos]
    return Launches(found, np.where(found, ts, 0), kf.launch_tid[order][pos])


def kernels_table(kf: KinetoFile, steps: Steps, launches: Launches) -> tuple[pa.Table, np.ndarray]:
    """The kernels table, and each GPU event's category."""
    category = kernel_category(kf.gpu.name, kf.gpu_cat)
    step = pa.array(step_at(steps, launches.ts_ns), pa.int64(), mask=~launches.found)
    table = _table(
        "kernels",
        {
            "step": step,
            "device": kf.gpu.pid.astype(np.int32),
            "stream": kf.gpu_stream,
            "name": kf.gpu.name,
            "category": CATEGORIES.take(pa.array(category)),
            "start_ns": kf.gpu.ts_ns,
            "end_ns": kf.gpu.end_ns,
            "correlation": kf.gpu_correlation,
            "bytes": pa.array(kf.gpu_bytes, pa.int64(), mask=kf.gpu_bytes < 0),
        },
    )
    return table, category


@functools.cache
def _normal_op(name: str) -> str:
    """The collective's name as dtprof writes it, from Kineto's (a file repeats a few)."""
    op = name.split(":", 1)[-1].strip().lower()
    return OP_NAMES.get(op, op)


def _size(args: Args) -> tuple[int, str | None]:
    """(bytes, dtype) from record_param_comms' sizes, else from the first input's dims."""
    dtype, nelems = args.dtype, args.in_msg_nelems
    if isinstance(nelems, int) and isinstance(dtype, str):
        return nelems * DTYPE_BYTES.get(dtype.lower(), 0), dtype.lower()
    if args.input_dims is UNSET or args.input_type is UNSET:  # most: nothing to decode
        return 0, None
    dims, types = raw_value(args.input_dims), raw_value(args.input_type)
    if isinstance(dims, list) and dims and isinstance(dims[0], list) and isinstance(types, list):
        first = str(types[0]).lower() if types else ""
        count = int(np.prod(dims[0])) if all(isinstance(d, int) for d in dims[0]) else 0
        return count * DTYPE_BYTES.get(first, 0), first or None
    return 0, None


ARG_COLUMNS = ("group", "seq", "op", "bytes", "dtype")  # collectives' columns from args
ARG_TYPES = (pa.string(), pa.int64(), pa.string(), pa.int64(), pa.string())
LABELS = pa.array(["cpu", "gpu"])  # a collective's label: timed by its kernels or its call


def collectives_table(
    kf: KinetoFile,
    steps: Steps,
    category: np.ndarray,
    launches: Launches,
    cpu_names: Distinct,
) -> pa.Table:
    """One row per collective call (rules in the module doc), seq from "Seq" or call order."""
    cpu = kf.cpu
    is_rpc = cpu_names.equal("record_param_comms")
    is_ann = cpu_names.matches(COMM_ANNOTATION)
    names = cpu.name.to_pylist() if (is_rpc | is_ann).any() else []
    comm = _comm_launches(kf, category, launches)
    fields: dict[str, list[Any]] = {c: [] for c in ARG_COLUMNS}
    times: list[dict[str, np.ndarray]] = []
    for tid in np.unique(cpu.tid[is_rpc | is_ann]):
        on = cpu.tid == tid
        kernels = _thread_kernels(comm, tid)
        times.append(_thread_collectives(cpu, names, on & is_rpc, on & is_ann, kernels, fields))
    if not fields["op"]:
        return TABLES["collectives"].empty
    joined = {key: np.concatenate([t[key] for t in times]) for key in times[0]}
    order = np.argsort(joined["start_ns"], kind="stable")
    rows = pa.array(order)
    group, seq, op, nbytes, dtype = (
        pa.array(fields[c], type_).take(rows)
        for c, type_ in zip(ARG_COLUMNS, ARG_TYPES, strict=True)
    )
    p2p = np.asarray(pc.is_in(op, P2P_OPS).to_numpy(zero_copy_only=False), bool)
    # call order: the calls before each one in its group, collectives and p2p counted apart
    key = pc.dictionary_encode(group).indices.to_numpy() * 2 + p2p
    traced = np.asarray(seq.is_valid().to_numpy(zero_copy_only=False), bool)
    table = _table(
        "collectives",
        {
            "step": step_at(steps, joined["cpu_ns"][order]),
            "group": group,
            "seq": np.where(traced, seq.fill_null(0).to_numpy(), _calls_before(key)),
            "op": op,
            "bytes": nbytes,
            "dtype": dtype,
            "peer": pa.array(np.full(len(p2p), -1, np.int32), mask=~p2p),
            "start_ns": joined["start_ns"][order],
            "end_ns": joined["end_ns"][order],
            "label": LABELS.take(pa.array(joined["on_gpu"][order].astype(np.int8))),
        },
    )
    seq_from = b"trace" if traced.all() else b"call order"
    return table.replace_schema_metadata({SEQ_FROM: seq_from})


def _calls_before(key: np.ndarray) -> np.ndarray:
    """For each row, how many rows before it have the same key (groupby's cumcount)."""
    order = np.argsort(key, kind="stable")
    first = np.flatnonzero(np.r_[True, np.diff(key[order]) != 0])
    counts = np.diff(np.r_[first, len(key)])
    out = np.empty(len(key), np.int64)
    out[order] = np.arange(len(key)) - np.repeat(first, counts)
    return out


def _comm_launches(
    kf: KinetoFile, category: np.ndarray, launches: Launches
) -> tuple[np.ndarray, ...]:
    """Communication kernels with a known launch: (launch tid, launch ns, start ns, end ns)."""
    lk = np.flatnonzero((category == COMMUNICATION) & launches.found)
    return launches.tid[lk], launches.ts_ns[lk], kf.gpu.ts_ns[lk], kf.gpu.end_ns[lk]


def _thread_kernels(launches: tuple[np.ndarray, ...], tid: int) -> tuple[np.ndarray, ...]:
    """The communication kernels that thread tid launched, in launch order (ties as found):
    (launch ns, start ns, end ns)."""
    launch_tid, k_launch, k_start, k_end = launches
    mine = np.flatnonzero(launch_tid == tid)
    order = mine[np.argsort(k_launch[mine], kind="stable")]
    return k_launch[order], k_start[order], k_end[order]


def _thread_collectives(
    cpu: Any,
    names: list[str],
    is_rpc: np.ndarray,
    is_ann: np.ndarray,
    kernels: tuple[np.ndarray, ...],
    fields: dict[str, list[Any]],
) -> dict[str, np.ndarray]:
    """One thread's collectives: its record_param_comms operators by start, then the annotations
    outside any of them. Appends the columns read from their args to ``fields`` (a light loop
    over their records) and returns their times, computed for all rows at once."""
    rpc = _by_start(cpu, np.flatnonzero(is_rpc))
    ann = _by_start(cpu, np.flatnonzero(is_ann))
    child, outside = _nest(cpu, rpc, ann)
    events = np.concatenate([rpc, outside])
    on_gpu, k_start, k_end = _kernel_spans(kernels, cpu.ts_ns[events], cpu.end_ns[events])
    rpc_args = [cpu.args[r] or NO_ARGS for r in rpc.tolist()]
    keep = np.ones(len(events), bool)
    # a bookkeeping record_param_comms names no collective, holds no annotation, launches none
    keep[: len(rpc)] = [bool(args.collective_name) for args in rpc_args]
    keep[list(child)] = True
    keep |= on_gpu
    ops, own, sizes = [], [], []  # each collective's name, args, and the args of its size
    for j in np.flatnonzero(keep[: len(rpc)]).tolist():
        args, a = rpc_args[j], child.get(j)
        named = args.collective_name
        ops.append(str(named) if named else names[a] if a is not None else "unknown")
        own.append(args)
        sized = args.in_msg_nelems is not None or a is None
        sizes.append(args if sized else cpu.args[a] or NO_ARGS)
    for a in outside.tolist():
        ops.append(names[a])
        own.append(NO_ARGS)
        sizes.append(cpu.args[a] or NO_ARGS)
    _add_args(fields, ops, own, sizes)
    events, on_gpu = events[keep], on_gpu[keep]
    return {
        "cpu_ns": cpu.ts_ns[events],
        "start_ns": np.where(on_gpu, k_start[keep], cpu.ts_ns[events]),
        "end_ns": np.where(on_gpu, k_end[keep], cpu.end_ns[events]),
        "on_gpu": on_gpu,
    }


def _by_start(cpu: Any, idx: np.ndarray) -> np.ndarray:
    """CPU event indices ordered by start time, ties kept in trace order."""
    return idx[np.argsort(cpu.ts_ns[idx], kind="stable")]


def _nest(cpu: Any, rpc: np.ndarray, ann: np.ndarray) -> tuple[dict[int, int], np.ndarray]:
    """Annotations against the record_param_comms (both by start) of one thread: the first
    annotation inside each operator (operator position -> annotation index), and the
    annotations inside none, which are collectives of their own."""
    if not len(rpc):  # a thread of annotations alone (gloo, older builds)
        return {}, ann
    parent = np.searchsorted(cpu.ts_ns[rpc], cpu.ts_ns[ann], side="right") - 1
    inside = (parent >= 0) & (cpu.ts_ns[ann] <= cpu.end_ns[rpc][np.maximum(parent, 0)])
    child: dict[int, int] = {}
    for a, p in zip(ann[inside].tolist(), parent[inside].tolist(), strict=True):
        child.setdefault(p, a)
    return child, ann[~inside]


def _kernel_spans(
    kernels: tuple[np.ndarray, ...], ts_ns: np.ndarray, end_ns: np.ndarray
) -> tuple[np.ndarray, ...]:
    """For CPU intervals [ts_ns, end_ns], from the kernels launched within them (launch order):
    whether there is one, the first kernel start and the last kernel end (the last two are
    meaningless where there is none)."""
    launch, start, end = kernels
    lo = np.searchsorted(launch, ts_ns, side="left")
    hi = np.searchsorted(launch, end_ns, side="right")
    first = _reduce_ranges(np.minimum, start, lo, hi)
    last = _reduce_ranges(np.maximum, end, lo, hi)
    return hi > lo, first, last


def _reduce_ranges(
    ufunc: np.ufunc, values: np.ndarray, lo: np.ndarray, hi: np.ndarray
) -> np.ndarray:
    """``ufunc.reduce(values[lo[i]:hi[i]])`` for every i, meaningless where ``hi[i] <= lo[i]``.

    One ``reduceat`` over the interleaved bounds lo0, hi0, lo1, hi1, ...: its even results are
    the ranges wanted, its odd ones (hi_i to lo_i+1) are dropped. A padding element keeps
    ``hi == len(values)`` a valid index there.
    """
    if not len(lo):
        return values[:0]
    padded = np.concatenate([values, np.zeros(1, values.dtype)])
    bounds = np.stack([lo, hi], axis=1).reshape(-1)
    return ufunc.reduceat(padded, bounds)[::2]


def _add_args(
    fields: dict[str, list[Any]], names: list[str], args: list[Args], size_args: list[Args]
) -> None:
    """Append the collectives' columns read from their args: group, seq, op and size (a null
    key counts as a missing one)."""
    ops = [_normal_op(name) for name in names]
    sized = [_size(a) for a in size_args]
    seqs = [a.seq_ if a.seq_ is not None else a.seq for a in args]
    fields["group"] += [
        str(a.process_group_name)
        if a.process_group_name is not None
        else str(a.pg_name)
        if a.pg_name is not None
        else "0"
        for a in args
    ]
    fields["seq"] += [seq if isinstance(seq, int) else None for seq in seqs]
    fields["op"] += ops
    fields["bytes"] += [nbytes for nbytes, _ in sized]
    fields["dtype"] += [dtype for _, dtype in sized]


def samples_table(kf: KinetoFile, steps: Steps) -> pa.Table:
    """The last ``[memory]`` reading of each step: allocated and reserved, CUDA and CPU.

    Per (step, device), in that order, allocated then reserved: the last reading that has the
    value (readings in time order, ties in file order), stamped with the group's last time."""
    if not len(kf.memory_ts_ns):
        return TABLES["samples"].empty
    order = np.argsort(kf.memory_ts_ns, kind="stable")
    ts = kf.memory_ts_ns[order]
    cuda = (kf.memory_device_type[order] == 1).astype(np.int64)
    key = step_at(steps, ts) * 2 + cuda  # (step, device): a group
    by_key = np.argsort(key, kind="stable")  # the groups in order, each in time order
    key, ts = key[by_key], ts[by_key]
    ends = _run_ends(key)  # each group's last reading
    group_key, group_ts = key[ends], ts[ends]
    parts = []
    for what, values in (
        ("allocated", kf.memory_allocated[order][by_key]),
        ("reserved", kf.memory_reserved[order][by_key]),
    ):
        has = np.flatnonzero(~np.isnan(values))
        last = has[_run_ends(key[has])]  # each group's last reading with the value
        at = np.searchsorted(group_key, key[last])  # its group: the keys are sorted and unique
        metric = np.array([f"cpu_{what}_bytes", f"cuda_{what}_bytes"], object)[key[last] % 2]
        parts.append((key[last] // 2, group_ts[at], metric, values[last]))
    step, ts_ns, metric, value = (np.concatenate(column) for column in zip(*parts, strict=True))
    return _table("samples", {"step": step, "ts_ns": ts_ns, "metric": metric, "value": value})


def _run_ends(values: np.ndarray) -> np.ndarray:
    """Where each run of equal values ends (its last index)."""
    if not len(values):
        return np.zeros(0, np.int64)
    return np.flatnonzero(np.append(values[1:] != values[:-1], True))


def spans_table(kf: KinetoFile, steps: Steps, names: Distinct) -> pa.Table:
    """User annotations other than steps and communication: regions at depth 0."""
    cpu = kf.cpu
    annotation = pc.fill_null(pc.equal(kf.cpu_cat, "user_annotation"), False)  # null: no cat
    keep = np.asarray(annotation.to_numpy(zero_copy_only=False), bool)
    keep &= ~names.matches(STEP) & ~names.matches(COMM_ANNOTATION)
    idx = np.flatnonzero(keep)
    return _table(
        "spans",
        {
            "step": step_at(steps, cpu.ts_ns[idx]),
            "name": cpu.name.take(pa.array(idx, pa.int64())),
            "kind": pa.repeat("region", len(idx)),
            "start_ns": cpu.ts_ns[idx],
            "end_ns": cpu.end_ns[idx],
            "depth": np.zeros(len(idx), np.int16),
        },
    )


def groups_table(kf: KinetoFile) -> pa.Table:
    """Process groups from distributedInfo.pg_config, when the trace has it."""
    config = kf.distributed.get("pg_config")
    rows = []
    if isinstance(config, list):
        for pg in config:
            ranks = pg.get("ranks") if isinstance(pg, dict) else None
            if isinstance(ranks, str):
                ranks = [int(r) for r in ranks.strip("[]").split(",") if r.strip().isdigit()]
            if isinstance(ranks, list) and "pg_name" in pg:
                backend = str(pg.get("backend_config", "")).rsplit(":", 1)[-1] or None
                rows.append((str(pg["pg_name"]), backend, [int(r) for r in ranks]))
    return _table(
        "groups",
        {
            "group": [r[0] for r in rows],
            "backend": [r[1] for r in rows],
            "ranks": [r[2] for r in rows],
        },
    )


SEQ_FROM = b"dtprof.seq_from"  # collectives' schema metadata: "trace" or "call order"


def rank_tables(kf: KinetoFile) -> dict[str, pa.Table]:
    """Every dtprof table of one Kineto file, times as written (ns, relative to base_ns)."""
    names = Distinct.of(kf.cpu.name)
    steps = _steps(kf, names)
    launches = gpu_launches(kf)
    kernels, category = kernels_table(kf, steps, launches)
    tables = {name: t.empty for name, t in TABLES.items()}
    tables.update(
        steps=_table("steps", steps._asdict()),
        kernels=kernels,
        collectives=collectives_table(kf, steps, category, launches, names),
        samples=samples_table(kf, steps),
        spans=spans_table(kf, steps, names),
        groups=groups_table(kf),
    )
    return tables


def rank_meta(
    kf: KinetoFile, rank: int, world_size: int, rank_from: str, steps: int, seq_from: str
) -> RankMeta:
    """meta.json of an imported rank: clock base from baseTimeNanoseconds, source noted."""
    devices = np.unique(kf.gpu.pid[kf.gpu.pid >= 0])
    backend = kf.distributed.get("backend")
    return RankMeta(
        schema_version=SCHEMA_VERSION,
        rank=rank,
        world_size=world_size,
        backend=backend if isinstance(backend, str) else None,
        device=f"cuda:{int(devices[0])}" if len(devices) else "cpu",
        status="finished",
        model_kind="none",
        clock=Clock(mono_to_wall_ns=kf.base_ns, start=ClockEstimate(0, 0)),
        steps=steps,
        imported=Imported(
            format="kineto",
            file=str(kf.path),
            rank_from=rank_from,
            seq_from=seq_from,
            events=kf.events,
            kineto_schema_version=kf.header.get("schemaVersion"),
            reader=kf.reader,
        ),
    )
