"""torch.distributed.pipelining: one span per forward / backward / backward-weight action."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dtprof.trace.meta import Pipeline

if TYPE_CHECKING:
    from dtprof.record.profiler import Profiler

now_ns = time.perf_counter_ns


def stages_of(schedule: Any) -> list[Any]:
    """The PipelineStage objects a schedule runs on this rank."""
    if hasattr(schedule, "_stages"):
        return list(schedule._stages)
    if hasattr(schedule, "_stage"):
        return [schedule._stage]
    raise TypeError(f"{type(schedule).__name__} is not a torch.distributed.pipelining schedule")


def describe(schedule: Any, rank: int) -> Pipeline:
    """Schedule name, stage and microbatch counts, this rank's stages and action order."""
    stages = stages_of(schedule)
    order = getattr(schedule, "pipeline_order", None)
    actions = None
    if isinstance(order, dict) and rank in order:
        actions = tuple(None if a is None else str(a) for a in order[rank])
    return Pipeline(
        schedule=type(schedule).__name__,
        stages=int(stages[0].num_stages),
        microbatches=int(schedule._n_microbatches),
        stage_indices=tuple(int(s.stage_index) for s in stages),
        virtual_stages_per_rank=len(stages),
        actions=actions,
    )


def install(prof: Profiler, schedule: Any) -> Callable[[], None]:
    """Wrap each stage's per-microbatch methods; returns the function that unwraps them."""
    spans = prof.spans
    wrapped: list[tuple[Any, str]] = []

    def wrap(stage: Any, method: str, name_of: Callable[[tuple[Any, ...], dict[str, Any]], str]):
        original = getattr(stage, method)
        stage_index = int(stage.stage_index)

        def timed(chunk_id: int, *args: Any, **kwargs: Any) -> Any:
            start = now_ns()
            try:
                return original(chunk_id, *args, **kwargs)
            finally:
                spans.append(
                    (
                        prof.step_index,
                        name_of(args, kwargs),
                        "pipeline",
                        start,
                        now_ns(),
                        0,
                        stage_index,
                        int(chunk_id),
                    )
                )

        setattr(stage, method, timed)
        wrapped.append((stage, method))

    def backward_name(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        full = kwargs.get("full_backward", args[1] if len(args) > 1 else True)
        return "backward" if full else "backward_input"

    for stage in stages_of(schedule):
        wrap(stage, "forward_one_chunk", lambda a, k: "forward")
        wrap(stage, "backward_one_chunk", backward_name)
        if hasattr(stage, "backward_weight_one_chunk"):
            wrap(stage, "backward_weight_one_chunk", lambda a, k: "backward_weight")

    def uninstall() -> None:
        for stage, method in wrapped:
            stage.__dict__.pop(method, None)

    return uninstall
