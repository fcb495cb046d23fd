"""Build tiny PyTorch profiler (Kineto) traces inline, in both timestamp conventions."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import orjson

ABS_T0_US = 1_700_000_000_000_000  # absolute stamps of older traces: Unix epoch microseconds
BASE_NS = 1_700_000_000_000_000_000  # baseTimeNanoseconds of newer traces
STEP_US = 1000
MAIN_TID, COMM_TID, PID = 100, 101, 4242
COMPUTE_STREAM, NCCL_STREAM = 7, 14
NCCL_OLD = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)"
NCCL_NEW = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"


def trace(
    rank: int | None,
    *,
    world: int = 2,
    steps: int = 3,
    relative: bool = False,
    nccl: str = NCCL_OLD,
    step_us: float = STEP_US,
    compute_us: float = 400.0,
    comm_start_us: float = 300.0,
    comm_us: float = 400.0,
    op: str = "allreduce",
    float_offset_us: float = 0.0,
    seq: bool = False,
) -> dict[str, Any]:
    """A rank's trace: per step one compute kernel, one NCCL all-reduce, one memcpy, memory.

    Defaults, per step of 1000 µs: compute 100-500, NCCL 300-700 (half of it overlapped),
    memcpy 600-650, nothing else; kernels launched in the last step are not counted (HTA).
    """
    t0 = 0.0 if relative else float(ABS_T0_US)
    events: list[dict[str, Any]] = []
    corr = 1000
    for s in range(steps):
        t = t0 + s * step_us + float_offset_us
        ts = (lambda x: x) if relative or float_offset_us else int
        events.append(_x("user_annotation", f"ProfilerStep#{s}", PID, MAIN_TID, ts(t), step_us))
        corr += 1
        events.append(_launch(ts(t + 10), corr))
        events.append(
            _gpu("kernel", "void gemm_kernel<float>(float*)", COMPUTE_STREAM, ts(t + 100),
                 compute_us, corr)
        )  # fmt: skip
        rpc_args = {"Collective name": op, "In msg nelems": 1024, "dtype": "Float",
                    "Group size": world, "Process Group Name": "0"}  # fmt: skip
        if seq:
            rpc_args["Seq"] = s
        events.append(_x("cpu_op", "record_param_comms", PID, COMM_TID, ts(t + 20), 30, rpc_args))
        events.append(_x("user_annotation", f"nccl:{op}", PID, COMM_TID, ts(t + 22), 20))
        corr += 1
        events.append(_launch(ts(t + 25), corr, tid=COMM_TID))
        events.append(_gpu("kernel", nccl, NCCL_STREAM, ts(t + comm_start_us), comm_us, corr))
        corr += 1
        events.append(_launch(ts(t + 30), corr, name="cudaMemcpyAsync"))
        events.append(
            _gpu("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", COMPUTE_STREAM, ts(t + 600), 50,
                 corr, bytes=4096)
        )  # fmt: skip
        events.append(
            {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": PID,
             "tid": MAIN_TID, "ts": ts(t + 700),
             "args": {"Device Type": 1, "Device Id": 0, "Bytes": 512,
                      "Total Allocated": (s + 1) * 2**20, "Total Reserved": 2**30}}
        )  # fmt: skip
        events.append({"ph": "f", "id": corr, "pid": 0, "tid": 7, "ts": ts(t + 600),
                       "cat": "ac2g", "name": "ac2g", "bp": "e"})  # fmt: skip
    events.append({"name": "process_name", "ph": "M", "pid": PID, "tid": 0,
                   "args": {"name": "python"}})  # fmt: skip
    events.append({"ph": "X", "cat": "Trace", "ts": t0, "dur": 1, "pid": "Spans",
                   "tid": "PyTorch Profiler", "name": "PyTorch Profiler (0)"})  # fmt: skip
    doc: dict[str, Any] = {"schemaVersion": 1, "deviceProperties": [], "traceEvents": events}
    if rank is not None:
        doc["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": world}
    if relative:
        doc["baseTimeNanoseconds"] = BASE_NS
    return doc


def _x(cat: str, name: str, pid: Any, tid: Any, ts: float, dur: float,
       args: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur,
            "args": args or {"External id": 1}}  # fmt: skip


def _launch(ts: float, corr: int, tid: int = MAIN_TID, name: str = "cudaLaunchKernel") -> Any:
    return _x("cuda_runtime", name, PID, tid, ts, 5, {"correlation": corr, "cbid": 211})


def _gpu(cat: str, name: str, stream: int, ts: float, dur: float, corr: int, **extra: Any) -> Any:
    args = {"device": 0, "stream": stream, "correlation": corr, **extra}
    return _x(cat, name, 0, stream, ts, dur, args)


def ranks(folder: Path, world: int) -> Path:
    """A folder of ``world`` ranks' traces, ``rank0.json`` on."""
    for rank in range(world):
        write(folder, f"rank{rank}.json", trace(rank, world=world))
    return folder


def write(folder: Path, name: str, doc: dict[str, Any], layout: str = "profiler") -> Path:
    """Write one trace file, gzipped when the name ends in .gz: laid out over lines as the
    profiler writes it (``profiler``), or all on one line (``compact``)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    raw = orjson.dumps(doc, option=orjson.OPT_INDENT_2 if layout == "profiler" else 0)
    path.write_bytes(gzip.compress(raw) if name.endswith(".gz") else raw)
    return path
