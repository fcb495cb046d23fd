"""GPU check: dtprof's CUDA path on one GPU, in a few minutes (benchmarks/gpu_check.sh runs it).

    python benchmarks/gpu_check.py --out DIR [--work DIR] [--steps 50] [--rounds 8]
                                  [--parts 1,2,3,4,5] [--gpu-modes ...] [--cases ...]

1. **NCCL, a world of one**: a small decoder-style transformer trained with DDP (bf16 autocast)
   under ``dtprof.profile`` with everything on (phases, a user region, DDP's buckets, a
   synchronous and an asynchronous ``all_reduce`` through the Python API, fingerprints, the
   hang watchdog, NVML every 0.2 s, the loss). Checked: every phase, the region and the
   collectives have GPU times; a region around a GPU sleep of known length gets that length
   on the GPU and almost none on the host; the GPU end of a last region against the host time
   right after a ``torch.cuda.synchronize()`` (the anchors' accuracy); in each step the last
   bucket's GPU end comes before the optimizer's GPU start, and no two buckets overlap. NCCL's
   own timing of each collective (``TORCH_NCCL_ENABLE_TIMING``, an on-completion hook) is read
   beside dtprof's, to compare.
2. **Two processes sharing the GPU**, gloo between them, CUDA compute, rank 1's forward given
   SLOW_MS more GPU work (a sleep kernel) each step: the same recording, and the straggler
   named from GPU times.
3. **Overhead**, in a process of its own: the loop of 1 bare and recorded (and recorded with
   one part off at a time, to see where the cost is), blocks interleaved over ``--rounds``
   rounds, each block's first WARM steps left out; then bare and recorded at a batch where
   the GPU, not the host, bounds the step (goal: recorded / bare <= 1.01). Each ratio also
   paired: to the bare block of the same round, since the host's speed drifts between rounds.
   Then the same model sharded by FSDP2 (its collectives through the Python API), bare and
   recorded; each block also gives its peak of allocated CUDA memory.
4. ``dtprof analyze`` on each trace.
5. **Captures and a later attach**, each in a process of its own: a model's step captured
   into a CUDA graph in the "global" mode while dtprof's writer reads events back (with its
   relaxed capture mode, and without it), and the same with no dtprof and with a thread of
   the script's own; DDP's whole step captured on NCCL, bare and recorded; a script that
   knows nothing of dtprof run under ``dtprof run``, its model made on CUDA after recording
   started; a CUDA job with ``gpu_timing=False`` (the backward by the native kernel's hook).

Writes ``gpu_check.json`` (every figure) and ``gpu_check.txt`` (a short table) to ``--out``,
with both reports beside them; the traces go to ``--work``. Exits 0 when it ran to the end;
the checks' verdicts are in the files (a check that fails is a finding about dtprof, not a
reason to lose the others).
"""

from __future__ import annotations

import argparse
import copy
import functools
import itertools
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import dtprof
import dtprof.record.gpu
import dtprof.record.phases
from dtprof.jobs.launch import free_port
from dtprof.trace.reader import read_rank_meta, read_table
from dtprof.trace.schema import TABLES

VOCAB, SEQ, BATCH = 8192, 512, 8
SLEEP_MS = 2.0  # the known GPU work inside the timed region
SLOW_MS = 30.0  # rank 1's extra GPU work in each forward in part 2


class Transformer(nn.Module):
    """Token embedding, pre-norm encoder blocks, a vocabulary head."""

    def __init__(self, width: int, layers: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, width)
        block = nn.TransformerEncoderLayer(
            width, nhead=width // 64, dim_feedforward=4 * width, batch_first=True, norm_first=True
        )
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(tokens)))


class Slowed(nn.Module):
    """A model whose forward first keeps the GPU busy for ``cycles`` clock cycles."""

    def __init__(self, inner: nn.Module, cycles: int) -> None:
        super().__init__()
        self.inner = inner
        self.cycles = cycles

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        torch.cuda._sleep(self.cycles)
        return self.inner(tokens)


def train_step(model: nn.Module, opt: torch.optim.Optimizer, tokens: torch.Tensor) -> torch.Tensor:
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


def sleep_cycles(ms: float) -> int:
    """GPU clock cycles of torch.cuda._sleep that take ``ms`` on this device (measured)."""
    cycles = 10_000_000
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(cycles)  # warm
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    torch.cuda.synchronize()
    return int(cycles * ms / start.elapsed_time(end))


def median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def rank_tables(trace: Path, rank: int) -> dict[str, Any]:
    """One rank's tables as Python lists of dicts, raw (its own monotonic clock), and its meta."""
    folder = trace / f"rank={rank:05d}"
    out = {name: read_table(folder, TABLES[name]).to_pylist() for name in TABLES}
    out["meta"] = read_rank_meta(folder)
    return out


def gpu_figures(t: dict[str, Any], key: Any = None) -> dict[str, Any]:
    """Host vs GPU durations and the launch lag, per ``key(row)`` of gpu_spans (default: kind and
    name; None leaves a row out)."""
    key = key or (lambda r: f"{r['kind']}:{r['name']}")
    by: dict[str, dict[str, list[float]]] = {}
    for r in t["gpu_spans"]:
        k = key(r)
        if k is None:
            continue
        d = by.setdefault(k, {"host_ms": [], "gpu_ms": [], "lag_ms": []})
        d["host_ms"].append((r["end_ns"] - r["start_ns"]) / 1e6)
        d["gpu_ms"].append((r["gpu_end_ns"] - r["gpu_start_ns"]) / 1e6)
        d["lag_ms"].append((r["gpu_start_ns"] - r["start_ns"]) / 1e6)
    return {
        k: {"n": len(d["gpu_ms"]), **{m: median(v) for m, v in d.items()}}
        for k, d in sorted(by.items())
    }


def ddp_bucket_test(t: dict[str, Any]) -> Any:
    """Whether a ``gpu_spans`` row of ``t`` times one of DDP's buckets (by the label of the
    collective it times)."""
    labels = {(r["group"], r["seq"]): r["label"] or "" for r in t["collectives"]}
    return lambda r: (
        r["kind"] == "collective" and labels.get((r["group"], r["seq"]), "").startswith("ddp.")
    )


def bucket_figures(t: dict[str, Any]) -> dict[str, Any]:
    """gpu_figures() of the collectives, DDP's buckets apart from the Python API's calls."""
    is_bucket = ddp_bucket_test(t)

    def key(r: dict[str, Any]) -> str | None:
        if r["kind"] != "collective":
            return None
        return "collective:ddp buckets" if is_bucket(r) else "collective:python api"

    return gpu_figures(t, key)


def buckets_before_optimizer(t: dict[str, Any]) -> dict[str, Any]:
    """A check of the buckets' GPU ends against the GPU's own order: DDP makes the compute
    stream wait for every bucket before the optimizer's step, so in each step the last
    bucket's GPU end comes before the optimizer's GPU start (to within the anchor's bound).
    Also: the buckets of a step, in launch order, never overlap on the GPU (one NCCL stream)."""
    is_bucket = ddp_bucket_test(t)
    buckets: dict[int, list[tuple[int, int, int]]] = {}
    optimizer: dict[int, int] = {}
    for r in t["gpu_spans"]:
        if is_bucket(r):
            buckets.setdefault(r["step"], []).append((r["seq"], r["gpu_start_ns"], r["gpu_end_ns"]))
        elif r["kind"] == "phase" and r["name"] == "optimizer":
            optimizer[r["step"]] = r["gpu_start_ns"]
    late_us, overlap_us = [], []
    for step, rows in buckets.items():
        rows.sort()
        if step in optimizer:
            late_us.append((max(end for _, _, end in rows) - optimizer[step]) / 1e3)
        overlap_us += [(a[2] - b[1]) / 1e3 for a, b in itertools.pairwise(rows) if a[2] > b[1]]
    return {
        "steps": len(late_us),
        "last_end_minus_optimizer_start_us": {
            "max": max(late_us, default=None),
            "median": median(late_us) if late_us else None,
        },
        "overlapping_pairs": len(overlap_us),
        "overlap_max_us": max(overlap_us, default=0.0),
    }


def sample_figures(t: dict[str, Any]) -> dict[str, Any]:
    by: dict[str, list[float]] = {}
    for r in t["samples"]:
        by.setdefault(r["metric"], []).append(r["value"])
    return {m: {"n": len(v), "median": median(v), "max": max(v)} for m, v in sorted(by.items())}


def meta_figures(meta: Any) -> dict[str, Any]:
    from dtprof.trace.meta import as_dict

    keep = ("device", "device_name", "backend", "status", "nvml", "gpm", "gpu_timing")
    keep += ("ddp_buckets_via", "ddp_buckets_kernel", "ddp_buckets_native", "disabled_hooks")
    full = as_dict(meta)
    return {k: full.get(k) for k in keep}


def collective_figures(t: dict[str, Any]) -> dict[str, Any]:
    by: dict[str, int] = {}
    for r in t["collectives"]:
        key = f"{r['op']} {r['label'] or ''}".strip()
        by[key] = by.get(key, 0) + 1
    return by


# ---------------------------------------------------------------- part 1 and 3: NCCL, one rank


def part_one(out: Path, steps: int, width: int, layers: int) -> dict[str, Any]:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    os.environ["TORCH_NCCL_ENABLE_TIMING"] = "1"
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=device)
    nccl_ms: dict[str, list[float]] = {}
    hook_error = None

    def on_completion(info: Any) -> None:
        ms = info.active_duration.total_seconds() * 1e3
        nccl_ms.setdefault(str(info.op_type).rsplit(".", 1)[-1], []).append(ms)

    try:
        dist.distributed_c10d._get_default_group()._register_on_completion_hook(on_completion)
    except Exception as exc:
        hook_error = f"{type(exc).__name__}: {exc}"
    torch.manual_seed(0)
    model = DDP(Transformer(width, layers).to(device), device_ids=[0])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1), device=device)
    cycles = sleep_cycles(SLEEP_MS)
    for _ in range(3):  # warm: cuBLAS, NCCL, the allocator
        train_step(model, opt, tokens)
    torch.cuda.synchronize()

    trace = out / "trace_nccl"
    losses = []
    t0 = time.perf_counter()
    with dtprof.profile(
        trace,
        model=model,
        optimizer=opt,
        fingerprint_every=10,
        hang_timeout_s=120,
        gpu_sample_interval_s=0.2,
    ) as prof:
        for _ in range(steps):
            with prof.region("gpu-sleep"):
                torch.cuda._sleep(cycles)
            loss = train_step(model, opt, tokens)
            flag = torch.ones(1, device=device)
            dist.all_reduce(flag)  # synchronous, through the Python API
            work = dist.all_reduce(torch.ones(1 << 20, device=device), async_op=True)
            work.wait()
            prof.log(loss=loss)
            losses.append(loss.detach())
            prof.step()
        with prof.region("probe"):
            torch.cuda._sleep(cycles)
        torch.cuda.synchronize()
        probe_host_end = time.perf_counter_ns()
    recorded_s = time.perf_counter() - t0

    t = rank_tables(trace, 0)
    probe = [r for r in t["gpu_spans"] if r["name"] == "probe"]
    sleep = [r for r in t["gpu_spans"] if r["name"] == "gpu-sleep"]
    figures = gpu_figures(t)
    figures.update(bucket_figures(t))
    logged = {r["step"]: r["value"] for r in t["scalars"] if r["name"] == "loss"}
    result: dict[str, Any] = {
        "trace": str(trace),
        "steps": len(t["steps"]),
        "recorded_s": round(recorded_s, 2),
        "meta": meta_figures(t["meta"]),
        "gpu_spans_rows": len(t["gpu_spans"]),
        "gpu": figures,
        "samples": sample_figures(t),
        "collectives": collective_figures(t),
        "events": [f"{e['kind']}: {e['message']}" for e in t["events"]],
        # read by the writer thread from a copy on its way to the host, never with a sync
        "logged_loss": {
            "steps": len(logged),
            "equal_to_the_loss": [logged.get(i) for i in range(len(losses))]
            == [float(x) for x in losses],
        },
        "sleep_region_ms": {
            "expected_gpu": SLEEP_MS,
            "gpu": median([(r["gpu_end_ns"] - r["gpu_start_ns"]) / 1e6 for r in sleep]),
            "host": median([(r["end_ns"] - r["start_ns"]) / 1e6 for r in sleep]),
        },
        "probe": {
            # after synchronize() returned, the GPU's end of the last region is just behind
            "host_after_sync_minus_gpu_end_us": (
                (probe_host_end - probe[0]["gpu_end_ns"]) / 1e3 if probe else None
            ),
        },
    }
    result["buckets_end_before_the_optimizer"] = buckets_before_optimizer(t)
    time.sleep(1.0)  # the completion hook runs on NCCL's watchdog thread
    result["nccl_own_timing_ms"] = {
        "error": hook_error,
        **{op: {"n": len(v), "median": median(v)} for op, v in nccl_ms.items()},
    }
    dist.barrier()
    dist.destroy_process_group()
    return result


# what each overhead mode gives profile() (and "env": variables set while it records), None:
# no recording
MODES: dict[str, dict[str, Any] | None] = {
    "bare": None,
    "dtprof": {},
    "dtprof-python-kernel": {"env": {"DTPROF_NATIVE": "0"}},  # DDP's buckets by the Python kernel
    "dtprof-no-gpu-timing": {"gpu_timing": False},
    "dtprof-no-buckets": {"ddp_buckets": False},
    "dtprof-no-nvml": {"gpu_sample_interval_s": 0},
    "dtprof-no-model": {"model": None, "optimizer": None},
    "dtprof-no-log": {"log": False},  # the loop does not call prof.log(loss=...)
    "dtprof-no-gpm": {"no_gpm": True},  # NVML without its GPU performance metrics
    "bare-again": None,  # a second bare block each round: the noise floor
    "dtprof-gpu-phases-only": {"bucket_events": False},  # DDP's buckets not timed on the GPU
    "dtprof-gpu-buckets-only": {"phase_events": False},  # phases not timed on the GPU
    # DDP's buckets through dtprof's comm hook and the Python API, whose end is an event in
    # the future's callback (as for every collective but DDP's buckets on NCCL); and without
    # GPU timing, for the hook's own cost. Each on a twin of the model of its own: a comm hook
    # stays with a DDP model for good.
    "dtprof-comm-hook": {"ddp_buckets": "comm_hook", "twin": "comm-hook"},
    "dtprof-comm-hook-no-gpu-timing": {
        "ddp_buckets": "comm_hook",
        "gpu_timing": False,
        "twin": "comm-hook-no-gpu-timing",
    },
    # no recording; a twin of the model on a group with NCCL's own timing events
    # (TORCH_NCCL_ENABLE_TIMING): what those cost the GPU
    "bare-nccl-timing": {"bare": True, "twin": "nccl-timing", "nccl_timing": True},
}
# the modes of part 3's first loop, batch 8, where the host's launches bound the step: none
# unless asked (--launch-modes bare,bare-again,dtprof): on the lent H200 the bare blocks of
# this loop alone spread by 10%, too noisy for a 1% goal
LAUNCH_BOUND_MODES: list[str] = []
GPU_BOUND_BATCH = 64  # part 3's second loop: a batch whose step the GPU, not the host, bounds
# (NVML, GPM, the phases' hooks and prof.log were each seen to cost nothing here: docs/gpu.md)
GPU_BOUND_MODES = ["bare", "bare-again", "dtprof", "dtprof-no-gpu-timing", "dtprof-python-kernel"]
GPU_BOUND_MODES += ["dtprof-comm-hook", "dtprof-comm-hook-no-gpu-timing"]
# part 3's third loop: the same model sharded by FSDP2 (per block and whole), batch 64, whose
# all-gathers and reduce-scatters go through the Python API (not yet run on a GPU)
FSDP_MODES = ["bare", "bare-again", "dtprof", "dtprof-no-gpu-timing"]


def part_three(
    out: Path, steps: int, rounds: int, width: int, layers: int, loops: dict[str, list[str]]
) -> dict[str, Any]:
    """The overhead in a process of its own (no NCCL timing or hooks of part 1's): in each
    loop, the modes of ``loops`` (MODES' names; none: the loop is left out) in blocks of WARM +
    ``steps`` steps, in a random order each round; of each block,
    the steps after WARM, synchronized at both ends: wall ms per step, the process's CPU ms per
    step (every thread), and the host's ms in forward, backward and the optimizer."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=device)
    torch.manual_seed(0)
    model = DDP(Transformer(width, layers).to(device), device_ids=[0])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1), device=device)
    found: dict[str, Any] = {"warm_steps_per_block": WARM, "rounds": rounds, "goal": 1.01}
    if loops["launch"]:
        found["launch_bound"] = timed_loop(
            model, opt, tokens, steps, rounds, loops["launch"], out / "launch-bound"
        )
    if loops["gpu"]:
        big = torch.randint(0, VOCAB, (GPU_BOUND_BATCH, SEQ + 1), device=device)
        found["gpu_bound"] = timed_loop(
            model, opt, big, steps // 3, rounds, loops["gpu"], out / "gpu-bound"
        )
    if loops["fsdp"]:
        try:  # (not yet run on a GPU: a failure here must not lose the loops above)
            sharded, sharded_opt = fsdp_model(width, layers, device)
            big = torch.randint(0, VOCAB, (GPU_BOUND_BATCH, SEQ + 1), device=device)
            found["fsdp"] = timed_loop(
                sharded, sharded_opt, big, steps // 3, rounds, loops["fsdp"], out / "fsdp"
            )
        except Exception as exc:
            found["fsdp"] = {"error": f"{type(exc).__name__}: {exc}"}
    found["host_us"] = host_costs(tokens)
    dist.barrier()
    dist.destroy_process_group()
    return found


WARM = 5  # steps of each block before the timed ones: profile start-up, the FLOP count


def timed_loop(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    tokens: torch.Tensor,
    steps: int,
    rounds: int,
    names: list[str],
    out: Path,
) -> dict[str, Any]:
    """One loop of part 3: WARM steps to warm up, then timed_block() of each mode, ``rounds``
    times, in a random order each round (a rotation would always put the same mode after the
    same other, whose heat or clocks it inherits); their ratios. A mode whose block fails is
    left out from then on, its error under "failed"."""
    for _ in range(WARM):
        train_step(model, opt, tokens)
    got: dict[str, dict[str, list[float]]] = {m: {} for m in names}
    failed: dict[str, str] = {}
    for i in range(rounds):
        order = [m for m in names if m not in failed]
        random.Random(i).shuffle(order)
        for mode in order:
            try:
                block = timed_block(model, opt, tokens, steps, MODES[mode], out / f"{i}_{mode}")
            except Exception as exc:
                failed[mode] = f"{type(exc).__name__}: {exc}"
                print(f"overhead {out.name} {mode} failed: {failed[mode]}", file=sys.stderr)
                continue
            for key, value in block.items():
                got[mode].setdefault(key, []).append(value)
            print(f"overhead {out.name} round {i} {mode}: {block}", file=sys.stderr, flush=True)
    timed = {m: v for m, v in got.items() if m not in failed}
    return {"batch": len(tokens), "steps_per_block": steps, **ratios(timed), "failed": failed}


def host_costs(tensor: torch.Tensor, n: int = 5000) -> dict[str, float]:
    """What some calls on the recording's path cost the host, µs per call (median of 5)."""
    from dtprof.record.profiler import copy_for_later

    events = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    scalar = tensor[0, 0].float()
    calls = {
        "cuda event record": lambda i: events[i].record(),
        "memory_stats_as_nested_dict": lambda i: torch.cuda.memory_stats_as_nested_dict(),
        "is_current_stream_capturing": lambda i: torch.cuda.is_current_stream_capturing(),
        "copy_for_later (prof.log)": lambda i: copy_for_later(scalar),
    }
    found = {}
    for name, call in calls.items():
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            for i in range(n):
                call(i)
            times.append((time.perf_counter() - t0) / n * 1e6)
            torch.cuda.synchronize()
        found[name] = round(statistics.median(times), 3)
    return found


def ratios(got: dict[str, dict[str, list[float]]]) -> dict[str, Any]:
    """Each mode's medians over its blocks, their ratios to bare's, and the median over rounds
    of the wall ratio to the bare block of the same round (drift between rounds cancels)."""
    medians = {m: {k: round(statistics.median(v), 3) for k, v in got[m].items()} for m in got}
    bare, bare_blocks = medians["bare"], got["bare"]["wall_ms"]
    return {
        "medians": medians,
        "ratio_wall": {m: round(medians[m]["wall_ms"] / bare["wall_ms"], 4) for m in got},
        "ratio_cpu": {m: round(medians[m]["cpu_ms"] / bare["cpu_ms"], 4) for m in got},
        "paired_wall": {
            m: round(
                statistics.median(a / b for a, b in zip(v["wall_ms"], bare_blocks, strict=True)), 4
            )
            for m, v in got.items()
        },
        "blocks": got,
    }


def timed_block(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    tokens: torch.Tensor,
    steps: int,
    options: dict[str, Any] | None,
    trace: Path,
) -> dict[str, float]:
    prof: Any = None
    env = dict((options or {}).get("env", {}))
    log = (options or {}).get("log", True)
    os.environ.update(env)
    if options is not None and options.get("twin"):
        model, opt = twin(model, options["twin"], bool(options.get("nccl_timing")))
    if (options or {}).get("bare"):
        options = None
    gpm_sampler = dtprof.record.gpu.GpmSampler
    if (options or {}).get("no_gpm"):
        dtprof.record.gpu.GpmSampler = NoGpm  # type: ignore[misc,assignment]
    phase_mark = dtprof.record.phases.PhaseHooks._mark
    if (options or {}).get("phase_events") is False:
        dtprof.record.phases.PhaseHooks._mark = lambda self: None  # type: ignore[method-assign]
    if options is not None:
        kwargs: dict[str, Any] = {"model": model, "optimizer": opt, **options}
        for key in (
            "env",
            "log",
            "no_gpm",
            "bucket_events",
            "phase_events",
            "twin",
            "bare",
            "nccl_timing",
        ):
            kwargs.pop(key, None)
        prof = dtprof.profile(trace, **kwargs).__enter__()
        if options.get("bucket_events") is False:
            prof.comms._native.ops.set_gpu_timing(False)
    joules = 0.0
    host = {"forward_ms": 0.0, "backward_ms": 0.0, "optimizer_ms": 0.0}
    try:
        for i in range(WARM + steps):
            if i == WARM:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                wall, cpu = time.perf_counter(), time.process_time()
                joules = -energy_j()
                host = dict.fromkeys(host, 0.0)
            t0 = time.perf_counter()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model(tokens[:, :-1])
            loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
            t1 = time.perf_counter()
            loss.backward()
            t2 = time.perf_counter()
            opt.step()
            opt.zero_grad(set_to_none=True)
            t3 = time.perf_counter()
            host["forward_ms"] += t1 - t0
            host["backward_ms"] += t2 - t1
            host["optimizer_ms"] += t3 - t2
            if prof is not None:
                if log:
                    prof.log(loss=loss.detach())
                prof.step()
        torch.cuda.synchronize()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        joules += energy_j()
    finally:
        if prof is not None:
            prof.__exit__(None, None, None)
        for key in env:
            del os.environ[key]
        dtprof.record.gpu.GpmSampler = gpm_sampler  # type: ignore[misc]
        dtprof.record.phases.PhaseHooks._mark = phase_mark  # type: ignore[method-assign]
    found = {
        "wall_ms": wall / steps * 1e3,
        "cpu_ms": cpu / steps * 1e3,
        "watts": joules / wall if joules > 0 else 0.0,  # the GPU's mean power over the block
        "sm_mhz": sm_clock_mhz(),  # at the block's end
        "peak_mb": torch.cuda.max_memory_allocated() / 2**20,
        **{k: v / steps * 1e3 for k, v in host.items()},
    }
    if prof is not None:  # which bucket kernel recorded, and how many buckets have GPU times
        t = rank_tables(trace, 0)
        kernel = str(t["meta"].ddp_buckets_kernel or t["meta"].ddp_buckets_via or "none")
        found["native_kernel"] = float(kernel == "native")
        found["gpu_timed_collectives"] = float(
            sum(r["kind"] == "collective" for r in t["gpu_spans"])
        )
        found["collectives"] = float(len(t["collectives"]))
    return found


def fsdp_model(
    width: int, layers: int, device: torch.device
) -> tuple[nn.Module, torch.optim.Optimizer]:
    """The transformer sharded by FSDP2 over the world (of one): each block, then the whole."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = Transformer(width, layers).to(device)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for block in model.blocks.layers:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


@functools.cache
def twin(model: nn.Module, name: str, nccl_timing: bool) -> tuple[nn.Module, torch.optim.Optimizer]:
    """A copy of ``model`` (DDP) for the modes named ``name``, and its optimizer; with
    ``nccl_timing``, on a group of its own created with NCCL's timing events on."""
    group = None
    if nccl_timing:
        os.environ["TORCH_NCCL_ENABLE_TIMING"] = "1"  # read when the group is made
        try:
            group = dist.new_group([0])
        finally:
            del os.environ["TORCH_NCCL_ENABLE_TIMING"]
    copied = copy.deepcopy(model.module)
    ddp = DDP(copied, device_ids=[0], process_group=group)
    return ddp, torch.optim.AdamW(ddp.parameters(), lr=1e-4)


class NoGpm:
    """In place of dtprof's GPM sampler: a device without GPU performance metrics."""

    def __init__(self, *args: Any) -> None:
        raise RuntimeError("off for this block")


@functools.cache
def _nvml_handle() -> Any:
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml.nvmlDeviceGetHandleByIndex(0)
    except Exception:
        return None


def _nvml_reading(read: Any) -> float:
    """``read(pynvml, handle)`` for the GPU (0 where NVML cannot say)."""
    try:
        import pynvml

        return float(read(pynvml, _nvml_handle()))
    except Exception:
        return 0.0


def energy_j() -> float:
    """The GPU's energy counter in joules (0 where NVML cannot say)."""
    return _nvml_reading(lambda nvml, h: nvml.nvmlDeviceGetTotalEnergyConsumption(h) / 1e3)


def sm_clock_mhz() -> float:
    return _nvml_reading(lambda nvml, h: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM))


# ---------------------------------------------------------------- part 2: two processes, gloo


def worker(rank: int, world: int, port: int, trace: Path, steps: int, width: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(0)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    device = torch.device("cuda", 0)
    net: nn.Module = Transformer(width, 2).to(device)
    if rank == 1:
        net = Slowed(net, sleep_cycles(SLOW_MS))
    model = DDP(net, device_ids=[0])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, VOCAB, (BATCH // 2, SEQ + 1), device=device)
    train_step(model, opt, tokens)
    torch.cuda.synchronize()
    with dtprof.profile(trace, model=model, optimizer=opt, gpu_sample_interval_s=0.2) as prof:
        for _ in range(steps):
            loss = train_step(model, opt, tokens)
            prof.log(loss=loss)
            prof.step()
    dist.barrier()
    dist.destroy_process_group()


def part_two(out: Path, steps: int, width: int) -> dict[str, Any]:
    trace = out / "trace_gloo"
    args = ["--port", str(free_port()), "--trace", str(trace), "--steps", str(steps)]
    args += ["--width", str(width)]
    procs = [
        subprocess.Popen([sys.executable, __file__, "--worker", str(rank), *args])
        for rank in range(2)
    ]
    codes = [p.wait(timeout=240) for p in procs]
    result: dict[str, Any] = {"trace": str(trace), "exit_codes": codes}
    for rank in range(2):
        t = rank_tables(trace, rank)
        result[f"rank{rank}"] = {
            "steps": len(t["steps"]),
            "meta": meta_figures(t["meta"]),
            "gpu": gpu_figures(t),
            "collectives": collective_figures(t),
            "events": [f"{e['kind']}: {e['message']}" for e in t["events"]],
        }
    return result


def overhead(work: Path, a: argparse.Namespace) -> dict[str, Any]:
    found = work / "overhead.json"
    args = ["--overhead", str(found), "--trace", str(work / "overhead_traces")]
    args += ["--rounds", str(a.rounds), "--width", str(a.width), "--layers", str(a.layers)]
    args += ["--launch-modes", a.launch_modes, "--gpu-modes", a.gpu_modes]
    args += ["--fsdp-modes", a.fsdp_modes]
    env = {k: v for k, v in os.environ.items() if k != "TORCH_NCCL_ENABLE_TIMING"}
    subprocess.run([sys.executable, __file__, *args], check=True, timeout=330, env=env)
    result: dict[str, Any] = json.loads(found.read_text())
    return result


# ---------------------------------------------------------------- part 5: captures, attach


def capture_race(trace: Path, who: str) -> dict[str, Any]:
    """A model's whole step captured with ``torch.cuda.graph`` (its default "global" capture
    mode), taking 0.3 s, while another thread calls CUDA. ``who``: "none" (nothing else: the
    capture itself works), "plain" (a thread of this script queries an event: the hazard
    itself, without dtprof), "dtprof" (dtprof records; its writer ticks every 10 ms and renews
    its anchor, an event recorded and waited for, at each tick), "dtprof-unguarded" (the same,
    with the writer out of the relaxed capture mode)."""
    import threading

    import dtprof.record.gpu_timing as gt

    torch.cuda.set_device(0)
    model = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(64, 1024, device="cuda")

    def eager_steps(prof: Any = None) -> None:
        for _ in range(3):
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if prof is not None:
                prof.log(loss=loss)
                prof.step()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream, as CUDA graphs want
        eager_steps()
    torch.cuda.current_stream().wait_stream(side)
    result: dict[str, Any] = {"who": who}
    stop = threading.Event()
    query_errors: list[str] = []
    prof: Any = None
    if who == "plain":
        event = torch.cuda.Event()
        event.record()

        def keep_querying() -> None:
            while not stop.is_set():
                try:
                    event.query()
                except Exception as exc:
                    query_errors.append(str(exc).splitlines()[0])
                    return
                time.sleep(0.002)

        threading.Thread(target=keep_querying, daemon=True).start()
    elif who.startswith("dtprof"):
        import contextlib

        gt.ANCHOR_EVERY_S = 0.0  # an anchor at each of the writer's ticks
        if who == "dtprof-unguarded":
            gt.relaxed_capture_mode = contextlib.nullcontext  # type: ignore[assignment]
        prof = dtprof.profile(
            trace, model=model, optimizer=opt, flush_interval_s=0.01, gpu_sample_interval_s=0.05
        ).__enter__()
        eager_steps(prof)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            static_loss = model(x).square().mean()
            static_loss.backward()
            opt.step()
            time.sleep(0.3)  # a long capture: the other thread calls CUDA meanwhile
        result["capture"] = "ok"
        for _ in range(5):
            graph.replay()
            if prof is not None:
                prof.step()
        torch.cuda.synchronize()
        result["replays"] = "ok"
    except Exception as exc:
        result["capture"] = f"failed: {str(exc).splitlines()[0]}"
    stop.set()
    result["query_errors"] = query_errors[:3]
    if prof is not None:
        prof.__exit__(None, None, None)
        t = rank_tables(trace, 0)
        result["meta"] = meta_figures(t["meta"])
        result["steps"] = len(t["steps"])
        result["events"] = [f"{e['kind']}: {e['message']}"[:300] for e in t["events"]]
    return result


def capture_ddp(trace: Path, recorded: bool) -> dict[str, Any]:
    """DDP's whole step captured into a CUDA graph on NCCL (a world of one), as PyTorch's notes
    on CUDA graphs describe it (DDP made on a side stream, 11 eager steps first), with an
    asynchronous all-reduce through the Python API inside; bare, or recorded by dtprof (DDP's
    buckets by the native kernel)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "0"
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=device)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        net = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024)).cuda()
        model = DDP(net, device_ids=[0])
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(64, 1024, device=device)
    flag = torch.ones(1 << 16, device=device)
    result: dict[str, Any] = {"recorded": recorded}
    prof: Any = None
    if recorded:
        prof = dtprof.profile(trace, model=model, optimizer=opt).__enter__()

    def step() -> torch.Tensor:
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        dist.all_reduce(flag, async_op=True).wait()
        return loss.detach()

    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(11):
            step()
            opt.zero_grad(set_to_none=True)
            if prof is not None:
                prof.step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            static_loss = step()
        result["capture"] = "ok"
        losses = []
        for _ in range(10):
            graph.replay()
            losses.append(static_loss.clone())
            if prof is not None:
                prof.step()
        torch.cuda.synchronize()
        result["replays"] = "ok"
        result["losses_fall"] = float(losses[-1]) < float(losses[0])
    except Exception as exc:
        result["capture"] = f"failed: {str(exc).splitlines()[0]}"
    if prof is not None:
        prof.__exit__(None, None, None)
        t = rank_tables(trace, 0)
        result["meta"] = meta_figures(t["meta"])
        result["steps"] = len(t["steps"])
        result["collectives"] = collective_figures(t)
        result["gpu_timed_collectives"] = sum(r["kind"] == "collective" for r in t["gpu_spans"])
        result["events"] = [f"{e['kind']}: {e['message']}"[:300] for e in t["events"]]
    dist.barrier()
    dist.destroy_process_group()
    return result


def attach_script() -> None:
    """A training script that knows nothing of dtprof: ``dtprof run`` attaches to its model
    (made on CUDA after recording started) through the optimizer's step."""
    torch.manual_seed(0)
    model = Transformer(512, 2).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, VOCAB, (4, SEQ + 1), device="cuda")
    for _ in range(30):
        train_step(model, opt, tokens)
        time.sleep(0.02)  # the NVML sampler (every second by default) gets a few samples
    torch.cuda.synchronize()


def attach(trace: Path) -> dict[str, Any]:
    """``dtprof run -- python3 <this script> --case attach-script``: NVML, the GPU timer and
    the backward hook when the model reaches the recording only once the script has made it."""
    command = [sys.executable, "-m", "dtprof", "run", "--trace", str(trace), "--"]
    command += [sys.executable, __file__, "--case", "attach-script"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=150)
    result: dict[str, Any] = {"exit_code": done.returncode, "output": done.stderr[-600:]}
    t = rank_tables(trace, 0)
    result["meta"] = meta_figures(t["meta"])
    result["phase_timing"] = t["meta"].phase_timing
    result["steps"] = len(t["steps"])
    result["gpu"] = gpu_figures(t)
    result["samples"] = sorted({r["metric"] for r in t["samples"]})
    return result


def no_gpu_timing(trace: Path) -> dict[str, Any]:
    """A CUDA job with gpu_timing=False: the backward phase by the native kernel's C++ hook."""
    torch.manual_seed(0)
    model = Transformer(512, 2).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, VOCAB, (4, SEQ + 1), device="cuda")
    train_step(model, opt, tokens)
    with dtprof.profile(trace, model=model, optimizer=opt, gpu_timing=False) as prof:
        for _ in range(10):
            train_step(model, opt, tokens)
            prof.step()
    t = rank_tables(trace, 0)
    spans: dict[str, int] = {}
    for r in t["spans"]:
        spans[r["name"]] = spans.get(r["name"], 0) + 1
    return {
        "meta": meta_figures(t["meta"]),
        "phase_timing": t["meta"].phase_timing,
        "steps": len(t["steps"]),
        "spans": spans,
        "gpu_spans_rows": len(t["gpu_spans"]),
    }


CASES = {
    "capture-race-none": lambda trace: capture_race(trace, "none"),
    "capture-race-plain": lambda trace: capture_race(trace, "plain"),
    "capture-race-dtprof": lambda trace: capture_race(trace, "dtprof"),
    "capture-race-dtprof-unguarded": lambda trace: capture_race(trace, "dtprof-unguarded"),
    "capture-ddp-bare": lambda trace: capture_ddp(trace, False),
    "capture-ddp-dtprof": lambda trace: capture_ddp(trace, True),
    "attach": attach,
    "no-gpu-timing": no_gpu_timing,
}
# part 5's cases by default: dtprof's own; the controls (no dtprof, the writer unguarded) are
# for telling a failure's cause apart, and run when named
DEFAULT_CASES = ["capture-race-dtprof", "capture-ddp-dtprof", "attach", "no-gpu-timing"]


def part_five(work: Path, cases: list[str]) -> dict[str, Any]:
    """Each of ``cases`` (CASES' names) in a process of its own (a broken capture may leave
    CUDA unusable)."""
    work.mkdir(parents=True, exist_ok=True)
    found: dict[str, Any] = {}
    for name in cases:
        result = work / f"case_{name}.json"
        trace = work / f"trace_{name}"
        command = [sys.executable, __file__, "--case", name, "--trace", str(trace)]
        command += ["--result", str(result)]
        t0 = time.perf_counter()
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=150)
            found[name] = (
                json.loads(result.read_text())
                if result.exists()
                else {"exit_code": done.returncode, "error": done.stderr[-1500:]}
            )
        except Exception as exc:
            found[name] = {"error": f"{type(exc).__name__}: {exc}"}
        found[name]["seconds"] = round(time.perf_counter() - t0, 1)
        print(f"case {name}: {json.dumps(found[name])[:400]}", file=sys.stderr, flush=True)
    return found


# ---------------------------------------------------------------- part 4: analyze


def analyze(trace: Path, out: Path, name: str) -> dict[str, Any]:
    text = subprocess.run(
        [sys.executable, "-m", "dtprof", "analyze", str(trace)], capture_output=True, text=True
    )
    (out / f"report_{name}.txt").write_text(text.stdout + text.stderr)
    js = subprocess.run(
        [sys.executable, "-m", "dtprof", "analyze", str(trace), "--format", "json"],
        capture_output=True,
        text=True,
    )
    try:
        report = json.loads(js.stdout)
    except ValueError:
        return {"exit_code": js.returncode, "error": (js.stderr or js.stdout)[-2000:]}
    findings = [
        {k: f.get(k) for k in ("code", "severity", "ranks", "message", "suggestion")}
        for f in report.get("findings", [])
    ]
    return {"exit_code": js.returncode, "findings": findings}


def table_one(one: dict[str, Any]) -> list[str]:
    lines = ["part 1, NCCL world of one: host vs GPU (medians, ms)"]
    lines.append(f"{'what':<32}{'n':>5}{'host':>10}{'gpu':>10}{'lag':>10}")
    for key, f in one["gpu"].items():
        cells = [f.get(k) for k in ("host_ms", "gpu_ms", "lag_ms")]
        text = "".join(f"{c:>10.3f}" if c is not None else f"{'-':>10}" for c in cells)
        lines.append(f"{key:<32}{f['n']:>5}{text}")
    s = one["sleep_region_ms"]
    lines.append(
        f"region around a {s['expected_gpu']} ms GPU sleep: gpu {s['gpu']} ms, host {s['host']} ms"
    )
    lines.append(
        f"probe: host after sync - GPU end = {one['probe']['host_after_sync_minus_gpu_end_us']} us"
    )
    lines.append(f"NCCL's own timing (ms): {one['nccl_own_timing_ms']}")
    lines.append(f"buckets' GPU ends vs the optimizer: {one['buckets_end_before_the_optimizer']}")
    lines.append(f"gpu_timing: {one['meta'].get('gpu_timing')}")
    lines.append(f"DDP buckets: {one['meta'].get('ddp_buckets_kernel')} kernel")
    lines.append(f"logged loss: {one['logged_loss']}")
    lines.append(f"nvml: {one['meta'].get('nvml')}  gpm: {one['meta'].get('gpm')}")
    for m, f in one["samples"].items():
        lines.append(f"  sample {m:<28} n={f['n']:<4} median={f['median']:.4g} max={f['max']:.4g}")
    return lines


def table_three(o: dict[str, Any]) -> list[str]:
    lines = [
        f"part 3, overhead (medians of {o['rounds']} blocks, ms per step; ratios to bare, "
        f"paired: to the same round's bare block; goal {o['goal']})"
    ]
    keys = ["wall_ms", "cpu_ms", "forward_ms", "backward_ms", "optimizer_ms", "watts", "sm_mhz"]
    keys += ["peak_mb"]
    for loop in ("launch_bound", "gpu_bound", "fsdp"):
        if loop not in o:
            continue
        r = o[loop]
        if "error" in r:
            lines.append(f"{loop}: {r['error']}")
            continue
        lines.append(f"{loop.replace('_', '-')} loop, batch {r['batch']}:")
        head = f"{'mode':<32}" + "".join(f"{k:>13}" for k in keys)
        lines.append(head + f"{'wall x':>9}{'cpu x':>9}{'paired x':>10}")
        for mode, m in r["medians"].items():
            cells = "".join(f"{m.get(k, 0.0):>13.3f}" for k in keys)
            x = [r["ratio_wall"][mode], r["ratio_cpu"][mode]]
            lines.append(
                f"{mode:<32}{cells}{x[0]:>9.3f}{x[1]:>9.3f}{r['paired_wall'][mode]:>10.3f}"
            )
        for mode, error in r.get("failed", {}).items():
            lines.append(f"{mode:<32}failed: {error}")
    lines.append(f"host us per call: {o['host_us']}")
    return lines


def table_two(two: dict[str, Any]) -> list[str]:
    lines = [f"part 2, gloo two ranks on one GPU: exit codes {two['exit_codes']}"]
    for rank in (0, 1):
        r = two.get(f"rank{rank}", {})
        for key, f in r.get("gpu", {}).items():
            host, gpu = f["host_ms"], f["gpu_ms"]
            lines.append(f"  rank {rank} {key:<28} n={f['n']:<4} host={host:.3f} gpu={gpu:.3f}")
    return lines


def table_five(cases: dict[str, Any]) -> list[str]:
    lines = ["part 5, captures and a later attach:"]
    for name, c in cases.items():
        keep = ["capture", "replays", "query_errors", "region_gpu_ms", "losses_fall", "steps"]
        keep += ["collectives", "gpu_timed_collectives", "phase_timing", "spans", "error"]
        said = {k: c[k] for k in keep if k in c}
        meta = c.get("meta") or {}
        said.update({k: meta[k] for k in ("gpu_timing", "disabled_hooks") if meta.get(k)})
        if name == "attach":
            said.update(nvml=meta.get("nvml"), gpu=list(c.get("gpu", {})), samples=c["samples"])
        lines.append(f"  {name}: {json.dumps(said, default=str)[:900]}")
    return lines


def table(summary: dict[str, Any]) -> str:
    """The short text form of the summary: each part that ran and did not fail."""
    lines = [f"device: {summary['device']}, torch {summary['torch']}"]
    parts = [("nccl_one_rank", table_one), ("overhead", table_three)]
    parts += [("gloo_two_ranks", table_two), ("cases", table_five)]
    for key, render in parts:
        found = summary.get(key)
        if found is None:
            continue
        lines.append("")
        if "error" in found and len(found) == 1:
            lines.append(f"{key}: failed\n{found['error']}")
            continue
        lines.extend(render(found))
    for name, a in summary["analyze"].items():
        lines.append(f"analyze {name}: exit {a.get('exit_code')}")
        for f in a.get("findings", []):
            lines.append(f"  {f['severity']} {f['code']} {f['ranks']}: {f['message'][:160]}")
    return "\n".join(lines) + "\n"


def names(listed: str) -> list[str]:
    return [name for name in listed.split(",") if name]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", type=Path)
    p.add_argument("--work", type=Path, help="where the traces go (default: OUT/work)")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--worker", type=int)
    p.add_argument("--overhead", type=Path, help="(part 3 in its own process: its JSON here)")
    p.add_argument("--port", type=int)
    p.add_argument("--trace", type=Path)
    p.add_argument("--parts", default="1,2,3,4,5", help="which parts to run (default: all)")
    p.add_argument("--launch-modes", default=",".join(LAUNCH_BOUND_MODES), help="part 3, batch 8")
    p.add_argument("--gpu-modes", default=",".join(GPU_BOUND_MODES), help="part 3, batch 64")
    p.add_argument("--fsdp-modes", default=",".join(FSDP_MODES), help="part 3, FSDP2, batch 64")
    p.add_argument("--cases", default=",".join(DEFAULT_CASES), help="part 5's cases")
    p.add_argument("--case", choices=[*CASES, "attach-script"], help="(one case of part 5)")
    p.add_argument("--result", type=Path, help="(where a case writes its JSON)")
    a = p.parse_args()
    if a.case == "attach-script":
        attach_script()
        return
    if a.case is not None:
        a.result.write_text(json.dumps(CASES[a.case](a.trace), default=str))
        return
    if a.worker is not None:
        worker(a.worker, 2, a.port, a.trace, a.steps, a.width)
        return
    if a.overhead is not None:
        loops = {"launch": names(a.launch_modes), "gpu": names(a.gpu_modes)}
        loops["fsdp"] = names(a.fsdp_modes)
        found = part_three(a.trace, 30, a.rounds, a.width, a.layers, loops)
        a.overhead.write_text(json.dumps(found))
        return
    out: Path = a.out
    out.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }
    steps = a.steps

    def run(name: str, fn: Any) -> None:
        t0 = time.perf_counter()
        try:
            summary[name] = fn()
        except Exception as exc:
            import traceback

            summary[name] = {"error": traceback.format_exc()[-3000:]}
            print(f"{name} failed: {exc}", file=sys.stderr)
        print(f"{name}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)

    work = a.work or out / "work"
    parts = set(a.parts.split(","))
    if "1" in parts:
        run("nccl_one_rank", lambda: part_one(work, steps, a.width, a.layers))
    if "2" in parts:
        run("gloo_two_ranks", lambda: part_two(work, 30, 512))
    if "5" in parts:
        run("cases", lambda: part_five(work, names(a.cases)))
    if "3" in parts:
        run("overhead", lambda: overhead(work, a))
    summary["analyze"] = {}
    for name in ("nccl", "gloo"):
        trace = work / f"trace_{name}"
        if "4" not in parts or not trace.exists():
            continue
        run(f"analyze_{name}", lambda trace=trace, name=name: analyze(trace, out, name))
        summary["analyze"][name] = summary.pop(f"analyze_{name}")
    (out / "gpu_check.json").write_text(json.dumps(summary, indent=1, default=str))
    try:
        (out / "gpu_check.txt").write_text(table(summary))
    except Exception:
        import traceback

        (out / "gpu_check.txt").write_text(traceback.format_exc())
    print((out / "gpu_check.txt").read_text())


if __name__ == "__main__":
    main()
