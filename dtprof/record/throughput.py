"""What each training step processes, for throughput and MFU: the samples and tokens of its
training forward passes, counted from their inputs, and the model FLOPs of one step, counted
once.

- **Samples**: the first dimension of the forward's input: ``input_ids`` or ``inputs_embeds``
  where passed by name, else the first tensor among its arguments (looking one level into
  tuples, lists and dicts: a batch as ``(x, y)`` or ``{"x": ...}``).
- **Tokens**: the elements of ``input_ids`` or of a 2-D integer input (a batch of token ids),
  or the first two dimensions of ``inputs_embeds``; none for other inputs.
- Only forward passes with gradients on count (not evaluation). The sums over a step's passes
  (its micro-batches) are logged as the scalars ``samples`` and ``tokens`` at its end (where
  the native kernel times the phases, by the writer thread at its next tick), unless
  the script logs those names itself (``prof.log(samples=..., tokens=...)``): from the first
  step it does, its values are the ones kept. In a pipeline only the first stage counts them
  (the others' inputs are activations).
- **FLOPs**: ``torch.utils.flop_counter.FlopCounterMode`` over the training forward passes of
  the first step whose passes are all seen (matrix products, convolutions, attention: what
  model FLOPs count), times 3 for forward and backward (the backward pass computes the
  gradients of the inputs and of the weights, twice the forward's work). Recomputation under
  activation checkpointing is not counted: model FLOPs, not the hardware's. The count goes to
  meta.json (``model_flops``) with that step's samples and tokens, the model's parameters and
  the compute dtype; analysis scales it to each step's tokens (or samples).
"""

from __future__ import annotations

import re
from collections import deque
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from dtprof.record.native import PHASE_FIELDS, SAMPLES, SEEN, TOKENS, WORK_IN_PYTHON
from dtprof.trace import live
from dtprof.trace.meta import ModelFlops

if TYPE_CHECKING:
    from dtprof.record.phases import NativePhases
    from dtprof.record.profiler import Profiler

BY_NAME = ("input_ids", "inputs_embeds")  # Hugging Face models' inputs, by keyword


def batch_counts(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[int, int | None] | None:
    """(samples, tokens or None) of one forward pass's inputs; None where no tensor is seen."""
    if kwargs:
        for name in BY_NAME:
            tensor = kwargs.get(name)
            if isinstance(tensor, torch.Tensor) and tensor.dim() >= 2:
                return tensor.shape[0], tensor.shape[0] * tensor.shape[1]
    first = args[0] if args else None
    tensor = first if isinstance(first, torch.Tensor) else _first_tensor(args)
    if tensor is None and kwargs:
        tensor = _first_tensor(tuple(kwargs.values()))
    if tensor is None:
        return None
    shape = tensor.shape
    if not shape:
        return None
    if len(shape) == 2 and tensor.dtype in TOKEN_IDS:
        return shape[0], shape[0] * shape[1]
    return shape[0], None


TOKEN_IDS = frozenset({torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8})

# a step's count as a row of the scalars table, from the row (step, samples, tokens)
COUNT_PLANS = {
    name: live.plan(live.from_rows(0, "<i8"), live.constant(name), live.from_rows(column, "<f8"))
    for name, column in (("samples", 1), ("tokens", 2))
}


def _first_tensor(items: tuple[Any, ...]) -> torch.Tensor | None:
    for item in items:
        if isinstance(item, torch.Tensor):
            return item
        inner = item.values() if isinstance(item, dict) else item
        if isinstance(item, (tuple, list, dict)):
            for leaf in inner:
                if isinstance(leaf, torch.Tensor):
                    return leaf
    return None


class StepWork:
    """The samples and tokens of each step, and the FLOPs of one, for one profiler: called by
    the phase hooks at each forward pass they hand it, and at each step's end.

    The step's counts so far are ``counts`` (SAMPLES, TOKENS, SEEN, and WORK_IN_PYTHON: whether
    every pass comes here): the native kernel's numbers where it times the phases, which it adds
    to itself for the passes whose input is a plain tensor once the FLOPs' step is over, else
    Python's own. At a step's end the kernel writes them into its ring, and the writer's tick
    hands them to steps_counted(); in Python, step_ends() keeps them and the tick's
    log_ended() logs them."""

    def __init__(self, prof: Profiler, native: NativePhases | None = None) -> None:
        self.prof = prof
        self.ended: deque[tuple[int, int, int]] = deque()  # step_ends' counts, until logged
        self.counts: Any = native.state if native is not None else [0] * PHASE_FIELDS
        self.frame_of = native.frame_of if native is not None else live.frame_of
        self.counts[SAMPLES] = self.counts[TOKENS] = self.counts[SEEN] = 0
        self.counts[WORK_IN_PYTHON] = 1
        self.counter: Any = None  # the FlopCounterMode while it counts
        self.counted = False  # the FLOPs are noted (or were given up)
        self.forward_flops = 0
        self.count_step: int | None = None  # the step whose passes the FLOPs are counted on
        self.count_work: tuple[int, int] | None = None  # that step's samples and tokens
        self.compute_dtype: str | None = None

    def forward_begins(self, module: torch.nn.Module, args: Any, kwargs: Any) -> None:
        if not torch.is_grad_enabled():
            return
        if self.counter is not None:  # a pass that raised before its end: its count ends here
            self.forward_ends()
        work = batch_counts(args, kwargs)
        if work is not None:
            counts = self.counts
            counts[SEEN] = 1
            counts[SAMPLES] += work[0]
            if work[1] is not None:
                counts[TOKENS] += work[1]
        if not self.counted:
            step = self.prof.step_index
            if self.count_step is None or self.count_step == step:
                self._count_flops(module, step)
            else:  # the FLOPs' step is over: the native kernel counts plain inputs itself
                self.counts[WORK_IN_PYTHON] = 0

    def _count_flops(self, module: torch.nn.Module, step: int) -> None:
        """Count the FLOPs of this forward pass, one of the step that counts: that of the first
        training pass seen (a model is attached between steps, so that step is seen whole)."""
        try:
            if self.count_step is None:
                self.count_step = step
                self.compute_dtype = compute_dtype(module)
            from torch.utils.flop_counter import FlopCounterMode

            self.counter = FlopCounterMode(display=False)
            self.counter.__enter__()
        except Exception as exc:
            self._give_up(exc)

    def forward_ends(self) -> None:
        if self.counter is not None:
            counter, self.counter = self.counter, None
            try:
                counter.__exit__(None, None, None)
                self.forward_flops += counter.get_total_flops()
            except Exception as exc:
                self._give_up(exc)

    def _give_up(self, exc: Exception) -> None:
        """Counting FLOPs failed (an older torch, a model the counter cannot run): no count,
        said once as any hook's failure is; samples, tokens and the phases go on."""
        self.counter = None
        self._counting_ends()
        self.prof.hook_failed("flops", exc)

    def _counting_ends(self) -> None:
        """The FLOPs are noted (or given up): no pass needs Python for them any more."""
        self.counted = True
        self.counts[WORK_IN_PYTHON] = 0

    def step_ends(self, step: int) -> None:
        """A step's end, where Python times the phases: its counts kept for the writer's tick
        to log (log_ended), the FLOPs noted once the step they were counted in has ended. A
        failure is the caller's to say (PhaseHooks.step_ends); the counts start again from
        zero either way."""
        counts = self.counts
        seen, samples, tokens = counts[SEEN], counts[SAMPLES], counts[TOKENS]
        counts[SEEN] = counts[SAMPLES] = counts[TOKENS] = 0
        if self.counter is not None:  # a forward pass that raised without its end
            self.forward_ends()
        if seen:
            if step == self.count_step:
                self.count_work = (samples, tokens)
            self.ended.append((step, samples, tokens))
        self._note_flops_once(step)

    def log_ended(self) -> None:
        """The counts step_ends kept, logged (the writer's tick, and the profile's end)."""
        ended = self.ended
        rows = [ended.popleft() for _ in range(len(ended))]
        if rows:
            self._log_counts(np.array(rows, np.int64))

    def steps_counted(self, counts: np.ndarray) -> None:
        """The counts of steps that have ended, rows of (step, samples, tokens) as the native
        kernel wrote them: logged; the FLOPs noted once the step they were counted in has
        ended. On the writer thread at each tick, and at the profile's end."""
        if self.count_work is None and self.count_step is not None:
            found = counts[counts[:, 0] == self.count_step]
            if len(found):
                self.count_work = (int(found[0, 1]), int(found[0, 2]))
        self._log_counts(counts)
        # the kernel writes a step's counts before its number moves on (Profiler.step)
        self._note_flops_once(self.prof.step_index - 1)

    def _log_counts(self, counts: np.ndarray) -> None:
        """Log steps' counts, rows of (step, samples, tokens), as frames of the scalars table
        (no Python object a row), unless the script logs its own from a step on."""
        if not len(counts) or not self._first_stage():
            return
        logged = self.prof.logged_work  # name -> the first step the script logged it at
        until = logged.get("samples")
        samples = counts if until is None else counts[counts[:, 0] < until]
        tokens = counts[counts[:, 2] != 0]
        until = logged.get("tokens")
        if until is not None:
            tokens = tokens[tokens[:, 0] < until]
        add = self.prof.writer.add_frame
        add("scalars", len(samples), self.frame_of(samples, COUNT_PLANS["samples"]))
        add("scalars", len(tokens), self.frame_of(tokens, COUNT_PLANS["tokens"]))

    def _note_flops_once(self, last_ended: int) -> None:
        """Note the FLOPs, once the step they were counted in has ended (``last_ended``: the
        latest step that has)."""
        if self.counted or self.count_step is None or self.count_step > last_ended:
            return
        self._counting_ends()
        self._note_flops()

    def _first_stage(self) -> bool:
        """Whether this rank's inputs are the job's: in a pipeline, only its first stage's are
        (the others see activations)."""
        pipeline = self.prof.meta.pipeline
        return pipeline is None or not pipeline.stage_indices or 0 in pipeline.stage_indices

    def _note_flops(self) -> None:
        model = self.prof.model
        parameters = sum(p.numel() for p in model.parameters()) if model is not None else None
        name = accelerator_name(model)
        if name is not None:
            self.prof.note_meta(device_name=name)
        samples, tokens = self.count_work if self.count_work is not None else (None, None)
        self.prof.note_meta(
            model_flops=ModelFlops(
                per_step=3 * self.forward_flops,
                forward=self.forward_flops,
                samples=samples,
                tokens=tokens or None,
                parameters=parameters,
                dtype=self.compute_dtype,
                method="FlopCounterMode on one step's forward passes, x3",
            )
        )
        self.prof.write_meta()

    def close(self) -> None:
        self.forward_ends()


def accelerator_name(module: torch.nn.Module | None) -> str | None:
    """The name of the CUDA (or ROCm) device the module's parameters are on, else None."""
    if module is None:
        return None
    parameter = next(module.parameters(), None)
    if parameter is None or parameter.device.type != "cuda":
        return None
    return str(torch.cuda.get_device_name(parameter.device))


def compute_dtype(module: torch.nn.Module) -> str | None:
    """The dtype the module's matrix products run in: autocast's where it is on, else its
    parameters' (fp32 as tf32 where CUDA's matrix products may use TF32)."""
    parameter = next((p for p in module.parameters() if p.is_floating_point()), None)
    if parameter is None:
        return None
    device = parameter.device.type
    dtype = parameter.dtype
    if torch.is_autocast_enabled(device):
        dtype = torch.get_autocast_dtype(device)
    tf32 = device == "cuda" and torch.get_float32_matmul_precision() != "highest"
    if dtype == torch.float32 and tf32:
        return "tf32"
    return _SHORT.get(dtype, re.sub(r"^torch\.", "", str(dtype)))


_SHORT = {
    torch.float32: "fp32",
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
    torch.float64: "fp64",
}
