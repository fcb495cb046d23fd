"""The situations a job can play: healthy and sick DDP, FSDP2, pipelines, test faults."""

from __future__ import annotations

import argparse
import signal
import time
from collections.abc import Callable
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import dtprof
from dtprof.jobs import models


def _mlp(args: argparse.Namespace) -> nn.Sequential:
    per_row = args.device_ms / 1000 / args.batch
    return models.mlp(args.width, args.depth, seed=args.seed, device_s_per_row=per_row)


def _ddp(args: argparse.Namespace, **kwargs: object) -> tuple[nn.Module, torch.optim.Optimizer]:
    model = DDP(
        _mlp(args),
        bucket_cap_mb=args.bucket_mb,
        **kwargs,  # type: ignore[arg-type]
    )
    return model, torch.optim.SGD(model.parameters(), lr=0.05)


def healthy_ddp(args: argparse.Namespace) -> None:
    """Four equal DDP replicas."""
    from dtprof.jobs.worker import train_loop

    model, opt = _ddp(args)
    train_loop(args, model, opt)


def straggler_ddp(args: argparse.Namespace) -> None:
    """One rank's compute is ``--slow-fraction`` slower: a slower device with ``--device-ms``,
    else busy extra compute in its forward."""
    from dtprof.jobs.worker import train_loop

    model, opt = _ddp(args)
    slowdown = None
    if dist.get_rank() == args.slow_rank:
        slowed = models.scale_device_time(model, 1 + args.slow_fraction)
        if not slowed:
            slowdown = models.SlowDown(args.slow_fraction)
            cast(nn.Module, model.module).register_forward_hook(slowdown)
    train_loop(args, model, opt, slowdown=slowdown)


def data_stall(args: argparse.Namespace) -> None:
    """Every ``--stall-every`` steps one rank waits ``--stall-ms`` for its batch."""
    from dtprof.jobs.worker import train_loop

    model, opt = _ddp(args)

    def in_data(step: int) -> None:
        if dist.get_rank() == args.slow_rank and step % args.stall_every == args.stall_every - 1:
            time.sleep(args.stall_ms / 1000)

    train_loop(args, model, opt, in_data=in_data)


def fault(args: argparse.Namespace) -> None:
    """DDP with one fault planted (``--fault``, dtprof.jobs.faults) on ``--culprit`` from
    ``--onset`` on; ``--fault none`` is a healthy run."""
    from dtprof.jobs.faults import DdpFault
    from dtprof.jobs.worker import train_loop

    model, opt = _ddp(args)
    planted = DdpFault(args, model)
    train_loop(
        args,
        model,
        opt,
        before_forward=planted.before_forward,
        on_loss=planted.on_loss,
        in_data=planted.in_data,
    )


def divergence(args: argparse.Namespace) -> None:
    """One replica's weights perturbed at one step; a non-finite loss on another rank later."""
    from dtprof.jobs.worker import train_loop

    model, opt = _ddp(args)
    rank = dist.get_rank()

    def before_forward(step: int, x: torch.Tensor) -> torch.Tensor:
        if step == args.perturb_step and rank == args.perturb_rank:
            with torch.no_grad():
                first = next(cast(nn.Module, model.module).parameters())
                first.add_(torch.randn_like(first) * 1e-3)
        if step == args.nan_step and rank == args.nan_rank:
            x = x.clone()
            x[0, 0] = float("inf")
        return x

    train_loop(args, model, opt, before_forward=before_forward)


def poor_overlap(args: argparse.Namespace) -> None:
    """No DDP: every gradient all-reduced one by one after backward, nothing overlaps."""
    from dtprof.jobs.worker import train_loop

    model = _mlp(args)
    for p in model.parameters():
        dist.broadcast(p.data, 0)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    world = dist.get_world_size()

    def after_backward(step: int) -> None:
        for p in model.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad.div_(world)

    train_loop(args, model, opt, after_backward=after_backward)


def fsdp2(args: argparse.Namespace) -> None:
    """FSDP2 (fully_shard) on every linear layer and the root."""
    from torch.distributed.fsdp import fully_shard

    from dtprof.jobs.worker import train_loop

    model = _mlp(args)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    train_loop(args, model, opt)


def pipeline(args: argparse.Namespace) -> None:
    """A pipeline run by ``--schedule`` with ``--microbatches``: one stage per rank for gpipe
    and 1f1b, two (looped placement) for interleaved and zero-bubble; ``--fault slow-stage``
    makes ``--culprit``'s stages ``--magnitude`` slower."""
    from torch.distributed import pipelining as pp

    single = {"gpipe": pp.ScheduleGPipe, "1f1b": pp.Schedule1F1B}
    multi = {"interleaved": pp.ScheduleInterleaved1F1B, "zb": pp.ScheduleInterleavedZeroBubble}
    rank, world = dist.get_rank(), dist.get_world_size()
    per_rank = 1 if args.schedule in single else 2
    n_stages = per_rank * world
    stages: list[Any] = []
    params: list[nn.Parameter] = []
    for index in range(rank, n_stages, world):
        block = _stage_block(args, index, n_stages, slow=args.fault == "slow-stage")
        stages.append(pp.PipelineStage(block, index, n_stages, torch.device("cpu")))
        params += list(block.parameters())
    loss_fn = nn.CrossEntropyLoss()
    schedule: Any
    if args.schedule in single:
        schedule = single[args.schedule](stages[0], args.microbatches, loss_fn=loss_fn)
    else:
        schedule = multi[args.schedule](stages, args.microbatches, loss_fn=loss_fn)
    opt = torch.optim.SGD(params, lr=0.01)
    _pipeline_loop(args, schedule, opt, [s.stage_index for s in stages], n_stages, 0)


def pipeline_fsdp(args: argparse.Namespace) -> None:
    """A 2-D job: two pipeline stages (1F1B, ``--microbatches``) over one DeviceMesh dimension,
    FSDP2 over the other (world / 2 ranks per stage); ``--fault slow-rank`` makes
    ``--culprit``'s device ``--magnitude`` slower."""
    from torch.distributed import pipelining as pp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    n_stages = 2
    mesh = init_device_mesh(
        "cpu", (n_stages, dist.get_world_size() // n_stages), mesh_dim_names=("pp", "dp")
    )
    index = mesh.get_local_rank("pp")
    block = _stage_block(args, index, n_stages, slow=args.fault == "slow-rank")
    fully_shard(block, mesh=mesh["dp"])
    stage = pp.PipelineStage(
        block, index, n_stages, torch.device("cpu"), group=mesh.get_group("pp")
    )
    schedule = pp.Schedule1F1B(stage, args.microbatches, loss_fn=nn.CrossEntropyLoss())
    opt = torch.optim.SGD(block.parameters(), lr=0.01)
    _pipeline_loop(args, schedule, opt, [index], n_stages, mesh.get_local_rank("dp"))


def tensor_parallel(args: argparse.Namespace) -> None:
    """A 2-D job: tensor parallelism (dtprof.jobs.tensor_parallel) over pairs of ranks ({0, 1},
    {2, 3}, ...: a node each, where Megatron-LM keeps its tensor-parallel groups), data
    parallelism (DDP) across the pairs; ``--fault slow-link`` throttles the tensor-parallel
    group of ``--culprit`` from ``--onset`` on (dtprof.jobs.faults.SlowLink)."""
    from torch.distributed.device_mesh import init_device_mesh

    from dtprof.jobs import tensor_parallel as tp
    from dtprof.jobs.faults import SlowLink
    from dtprof.jobs.worker import train_loop

    if args.fault not in ("none", "slow-link"):
        raise SystemExit(f"unknown fault {args.fault!r} for tensor-parallel: none, slow-link")
    mesh = init_device_mesh("cpu", (dist.get_world_size() // 2, 2), mesh_dim_names=("dp", "tp"))
    tp_group = mesh.get_group("tp")
    net = tp.mlp(args.width, args.depth, tp_group, args.seed, args.device_ms / 1000 / args.batch)
    model = DDP(net, process_group=mesh.get_group("dp"), bucket_cap_mb=args.bucket_mb)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    slow = None
    if args.fault == "slow-link" and args.culprit in dist.get_process_group_ranks(tp_group):
        slow = SlowLink(tp_group, args.magnitude, args.onset)
        slow.install()

    def before_forward(step: int, x: torch.Tensor) -> torch.Tensor:
        if slow is not None:
            slow.step = step
        return x

    try:
        train_loop(
            args, model, opt, before_forward=before_forward, replica=mesh.get_local_rank("dp")
        )
    finally:
        if slow is not None:
            slow.uninstall()


def _stage_block(args: argparse.Namespace, index: int, n_stages: int, slow: bool) -> nn.Sequential:
    """Stage ``index`` of ``n_stages``: two linear layers with their share of the model's device
    time (the last stage adds the classifier), slowed by ``--magnitude`` when ``slow`` and this
    is ``--culprit``'s."""
    torch.manual_seed(1000 * args.seed + index)
    # the whole model's device time, shared by its 2 * n_stages hidden layers
    per_row = args.device_ms / 1000 / args.batch / (2 * n_stages)
    block = nn.Sequential()
    for _ in range(2):
        block.extend([nn.Linear(args.width, args.width), *models.device_time(per_row), nn.ReLU()])
    if index == n_stages - 1:
        block.append(nn.Linear(args.width, 16))
    if slow and dist.get_rank() == args.culprit:
        models.scale_device_time(block, 1 + args.magnitude)
    return block


def _pipeline_loop(
    args: argparse.Namespace,
    schedule: Any,
    opt: torch.optim.Optimizer,
    stage_indices: list[int],
    n_stages: int,
    replica: int,
) -> None:
    """Train a pipeline schedule for ``--steps``, recorded: the first stage feeds the batches
    of data-parallel ``replica``, the last computes and logs the loss."""
    data = models.Batches(replica, args.batch, args.width, seed=args.seed)
    has_first, has_last = 0 in stage_indices, n_stages - 1 in stage_indices
    with dtprof.profile(args.trace, model=None, optimizer=opt, pipeline=schedule) as prof:
        for step in range(args.steps):
            x, y = data.get(step)
            opt.zero_grad(set_to_none=True)
            losses: list[torch.Tensor] = []
            inputs = (x,) if has_first else ()
            if has_last:
                schedule.step(*inputs, target=y, losses=losses)
            else:
                schedule.step(*inputs)
            opt.step()
            if losses:
                prof.log(loss=torch.stack(losses).mean())
            prof.step()


def all_ops(args: argparse.Namespace) -> None:
    """Every collective and p2p call of the API, on the world and on a subgroup."""
    rank, world = dist.get_rank(), dist.get_world_size()
    pair = dist.new_group([0, 1])
    with dtprof.profile(args.trace) as prof:
        for _ in range(2):
            t = torch.ones(8) * rank
            dist.all_reduce(t)
            dist.all_reduce(t, async_op=True).wait()
            dist.all_gather([torch.empty(8) for _ in range(world)], t)
            dist.all_gather_into_tensor(torch.empty(8 * world), t)
            dist.reduce_scatter_tensor(torch.empty(8), torch.ones(8 * world))
            dist.broadcast(t, 0)
            dist.reduce(t, 0)
            dist.all_to_all_single(torch.empty(8 * world), torch.ones(8 * world))
            dist.barrier()
            dist.gather(t, [torch.empty(8) for _ in range(world)] if rank == 0 else None, 0)
            dist.scatter(t, [torch.ones(8) for _ in range(world)] if rank == 0 else None, 0)
            nxt, prv = (rank + 1) % world, (rank - 1) % world
            if rank % 2 == 0:
                dist.send(t, nxt)
                dist.recv(t, prv)
            else:
                dist.recv(t, prv)
                dist.send(t, nxt)
            reqs = dist.batch_isend_irecv(
                [dist.P2POp(dist.isend, t, nxt), dist.P2POp(dist.irecv, torch.empty(8), prv)]
            )
            for r in reqs:
                r.wait()
            if rank < 2:
                dist.all_reduce(t, group=pair)
            prof.step()


def faulty_hooks(args: argparse.Namespace) -> None:
    """DDP where dtprof's own phase hooks and its recording of DDP's buckets (by whichever
    kernel records them) start raising at about step 3."""
    from dtprof.jobs.worker import train_loop
    from dtprof.record import comms, ddp_buckets, phases

    def broken(real: Callable[..., object], after: int) -> Callable[..., object]:
        calls = 0

        def call(*a: object, **k: object) -> object:
            nonlocal calls
            calls += 1
            if calls > after:
                raise ValueError("injected fault")
            return real(*a, **k)

        return call

    log_counts = phases.StepWork._log_counts

    def counts_from_step_3_raise(work: phases.StepWork, counts: Any) -> None:
        # the steps' samples logged at the writer's ticks (and at the end: whichever logs
        # step 3 raises)
        if (counts[:, 0] >= 3).any():
            raise ValueError("injected fault")
        log_counts(work, counts)

    phases.StepWork._log_counts = counts_from_step_3_raise  # type: ignore[method-assign,assignment]
    # about two buckets per step
    comms.CommRecorder.launched = broken(comms.CommRecorder.launched, 6)  # type: ignore[method-assign,assignment]
    bucket_frame = ddp_buckets.NativeBuckets._frame

    def buckets_from_step_3_raise(buckets: ddp_buckets.NativeBuckets, done: Any) -> bytes:
        # the native kernel's records become rows at the writer's ticks, all those of a tick
        if (done[:, ddp_buckets.STEP] >= 3).any():
            raise ValueError("injected fault")
        return bucket_frame(buckets, done)

    ddp_buckets.NativeBuckets._frame = buckets_from_step_3_raise  # type: ignore[method-assign,assignment]
    model, opt = _ddp(args)
    train_loop(args, model, opt)


def skip_collective(args: argparse.Namespace) -> None:
    """Rank ``--slow-rank`` skips an all-reduce at ``--nan-step``: the others hang in it."""
    rank = dist.get_rank()
    with dtprof.profile(args.trace, hang_timeout_s=args.hang_timeout_s) as prof:
        for step in range(args.steps):
            t = torch.ones(4)
            if not (step == args.nan_step and rank == args.slow_rank):
                dist.all_reduce(t)
            else:
                time.sleep(3600)  # stands for a rank stuck elsewhere
            prof.step()


def skip_bucket(args: argparse.Namespace) -> None:
    """DDP: rank ``--slow-rank`` stops before its forward at ``--nan-step``: the others hang in
    that step's gradient all-reduce, which DDP launches from C++."""
    rank = dist.get_rank()
    model, opt = _ddp(args)
    gen = torch.Generator().manual_seed(args.seed + rank)
    with dtprof.profile(
        args.trace, model=model, optimizer=opt, hang_timeout_s=args.hang_timeout_s
    ) as prof:
        for step in range(args.steps):
            if step == args.nan_step and rank == args.slow_rank:
                time.sleep(3600)  # stands for a rank stuck elsewhere
            x = torch.randn(args.batch, args.width, generator=gen)
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
            prof.step()


def until_killed(args: argparse.Namespace) -> None:
    """DDP that trains until it is killed (for crash-safety tests)."""
    from dtprof.jobs.worker import train_loop

    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    model, opt = _ddp(args)
    train_loop(args, model, opt)


SITUATIONS: dict[str, Callable[[argparse.Namespace], None]] = {
    "healthy-ddp": healthy_ddp,
    "straggler-ddp": straggler_ddp,
    "data-stall": data_stall,
    "divergence": divergence,
    "poor-overlap": poor_overlap,
    "fault": fault,
    "fsdp2": fsdp2,
    "pipeline": pipeline,
    "pipeline-fsdp": pipeline_fsdp,
    "tensor-parallel": tensor_parallel,
    "all-ops": all_ops,
    "faulty-hooks": faulty_hooks,
    "skip-collective": skip_collective,
    "skip-bucket": skip_bucket,
    "until-killed": until_killed,
}
