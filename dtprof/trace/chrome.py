"""Export a trace as one merged multi-rank timeline in the Chrome trace-event format (Perfetto).

Layout: one process per rank (``pid`` = rank, named ``rank N``), sorted by rank; tracks
(``tid``) within it: 1 steps, 2 phases and regions (pipeline actions on 3), 4 collectives on
the host; a recorded CUDA job's GPU times (``gpu_spans``) on 5 (phases and regions) and 6
(collectives), beside the host's launches; and one track per GPU stream of an imported
profiler trace (``tid`` = 1000 + stream: ``stream N compute``...).
Steps, spans, collectives and kernels are complete events (``ph: X``); the same collective on
every rank, matched by (group, seq), is linked by a flow (``ph: s`` on the first rank to enter,
``ph: f`` on each other), with ids unique across the file. Times are microseconds (floats, ns
kept) from the earliest event of the trace, on the aligned clock ``load_trace`` gives, so ranks
line up. Metadata events (``ph: M``) name processes and threads.
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd

from dtprof.errors import DtprofError
from dtprof.trace.reader import Trace, load_trace

STEP_TID, SPAN_TID, PIPE_TID, COLL_TID, STREAM_TID0 = 1, 2, 3, 4, 1000
GPU_SPAN_TID, GPU_COLL_TID = 5, 6
TRACK_NAMES = {STEP_TID: "steps", SPAN_TID: "phases and regions", PIPE_TID: "pipeline",
               COLL_TID: "collectives (host)"}  # fmt: skip
GPU_TRACK_NAMES = {GPU_SPAN_TID: "phases and regions (GPU)", GPU_COLL_TID: "collectives (GPU)"}


def _complete(
    df: pd.DataFrame, t0: int, tid: np.ndarray | int, name: pd.Series, cat: str,
    args: dict[str, pd.Series] | None = None,
) -> list[dict[str, Any]]:  # fmt: skip
    """X events for the rows of df: columns built whole, then zipped into dicts."""
    if df.empty:
        return []
    ts = (df["start_ns"].to_numpy(np.int64) - t0) / 1000.0
    dur = np.maximum(df["end_ns"].to_numpy(np.int64) - df["start_ns"].to_numpy(np.int64), 0)
    pid = df["rank"].to_numpy(np.int64).tolist()
    tids = np.broadcast_to(np.asarray(tid, np.int64), (len(df),)).tolist()
    arg_cols = {k: v.tolist() for k, v in (args or {}).items()}
    keys = list(arg_cols)
    values = list(zip(*arg_cols.values(), strict=True)) if keys else [()] * len(df)
    return [
        {
            "ph": "X",
            "cat": cat,
            "name": n,
            "pid": p,
            "tid": t,
            "ts": s,
            "dur": d / 1000.0,
            "args": dict(zip(keys, a, strict=True)),
        }
        for n, p, t, s, d, a in zip(
            name.astype(str).tolist(), pid, tids, ts.tolist(), dur.tolist(), values, strict=True
        )
    ]


def _flows(coll: pd.DataFrame, t0: int) -> list[dict[str, Any]]:
    """One flow per collective seen on two ranks or more: from the first arrival to the others."""
    coll = coll[coll["peer"].isna()] if "peer" in coll else coll
    if coll.empty:
        return []
    coll = coll.sort_values(["group", "seq", "start_ns"], kind="stable")
    key = coll.groupby(["group", "seq"], sort=False).ngroup().to_numpy()
    size = np.bincount(key)
    keep = size[key] > 1
    coll, key = coll[keep], key[keep]
    first = np.r_[True, key[1:] != key[:-1]] if len(key) else np.array([], bool)
    ts = ((coll["start_ns"].to_numpy(np.int64) - t0) / 1000.0).tolist()
    out = []
    for k, f, r, t, op in zip(
        key.tolist(),
        first.tolist(),
        coll["rank"].tolist(),
        ts,
        coll["op"].astype(str).tolist(),
        strict=True,
    ):
        ev = {"ph": "s" if f else "f", "cat": "collective", "name": op, "id": int(k) + 1,
              "pid": int(r), "tid": COLL_TID, "ts": t}  # fmt: skip
        if not f:
            ev["bp"] = "e"
        out.append(ev)
    return out


def _metadata(trace: Trace, streams: pd.DataFrame) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    gpu_ranks = set(trace.gpu_spans["rank"].tolist()) if not trace.gpu_spans.empty else set()
    for rank in sorted(int(r) for r in trace.ranks["rank"]):
        meta = trace.meta.get(rank)
        label = f"rank {rank}" + (f" ({meta.host})" if meta and meta.host else "")
        out.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0,
                    "args": {"name": label}})  # fmt: skip
        out.append({"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0,
                    "args": {"sort_index": rank}})  # fmt: skip
        names = dict(TRACK_NAMES)
        if rank in gpu_ranks:
            names.update(GPU_TRACK_NAMES)
        for tid, name in names.items():
            out.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid,
                        "args": {"name": name}})  # fmt: skip
    for row in streams.itertuples():
        out.append({"ph": "M", "name": "thread_name", "pid": int(row.rank), "tid": int(row.tid),
                    "args": {"name": f"GPU {row.device} stream {row.stream}"}})  # fmt: skip
    return out


def chrome_events(trace: Trace) -> list[dict[str, Any]]:
    """Every trace event of the merged timeline (see the module doc for the layout)."""
    timed = [t for t in (trace.steps, trace.spans, trace.collectives, trace.kernels)
             if not t.empty]  # fmt: skip
    if not timed:
        raise DtprofError(f"{trace.path}: nothing timed to export (no steps, spans or kernels)")
    t0 = int(min(int(t["start_ns"].min()) for t in timed))
    events: list[dict[str, Any]] = []
    steps = trace.steps
    events += _complete(steps, t0, STEP_TID, "step " + steps["step"].astype(str), "step")
    spans = trace.spans
    if not spans.empty:
        tid = np.where(spans["kind"].to_numpy() == "pipeline", PIPE_TID, SPAN_TID)
        events += _complete(spans, t0, tid, spans["name"], "span",
                            {"kind": spans["kind"], "step": spans["step"]})  # fmt: skip
    coll = trace.collectives
    if not coll.empty:
        events += _complete(
            coll, t0, COLL_TID, coll["op"], "collective",
            {"group": coll["group"], "seq": coll["seq"], "bytes": coll["bytes"],
             "step": coll["step"]},
        )  # fmt: skip
        events += _flows(coll, t0)
    gpu = trace.gpu_spans
    if not gpu.empty:
        on_gpu = gpu.assign(start_ns=gpu["gpu_start_ns"], end_ns=gpu["gpu_end_ns"])
        tid = np.where(gpu["kind"].to_numpy() == "collective", GPU_COLL_TID, GPU_SPAN_TID)
        launch_us = (gpu["gpu_start_ns"] - gpu["start_ns"]) / 1000.0
        events += _complete(on_gpu, t0, tid, gpu["name"], "gpu",
                            {"kind": gpu["kind"], "step": gpu["step"],
                             "launch_queue_us": launch_us})  # fmt: skip
    kernels = trace.kernels
    streams = pd.DataFrame(columns=["rank", "device", "stream", "tid"])
    if not kernels.empty:
        tid = STREAM_TID0 + kernels["stream"].to_numpy(np.int64)
        events += _complete(kernels, t0, tid, kernels["name"], "gpu",
                            {"category": kernels["category"]})  # fmt: skip
        streams = (
            kernels[["rank", "device", "stream"]]
            .drop_duplicates()
            .assign(tid=lambda d: STREAM_TID0 + d["stream"])
        )
    return _metadata(trace, streams) + events


def export_chrome(path: str | os.PathLike[str], out: str | os.PathLike[str]) -> int:
    """Write the merged timeline of a trace (dtprof or profiler traces) to out[.gz]; events."""
    trace = load_trace(path)
    events = chrome_events(trace)
    doc = orjson.dumps(
        {"traceEvents": events, "displayTimeUnit": "ms",
         "otherData": {"source": str(trace.path), "exported_by": "dtprof export --chrome"}},
        option=orjson.OPT_SERIALIZE_NUMPY,
    )  # fmt: skip
    target = Path(out)
    try:
        if target.name.endswith(".gz"):
            with gzip.open(target, "wb", compresslevel=5) as f:
                f.write(doc)
        else:
            target.write_bytes(doc)
    except OSError as exc:
        raise DtprofError(f"{target}: cannot write ({exc.strerror})") from None
    return len(events)
