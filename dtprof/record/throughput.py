"""What each training step processes, for throughput and MFU: the samples and tokens of its
training forward passes, counted from their inputs, and the model FLOPs of one step, counted
once.

- **Samples**: the first dimension of the forward's input: ``input_ids`` or ``inputs_embeds``
  where passed by name, else the first tensor among its arguments (looking one level into
  tuples, lists and dicts: a batch as ``(x, y)`` or ``{"x": ...}``).
- **Tokens**: the elements of ``input_ids`` or of a 2-D integer input (a batch of token ids),
  or the first two dimensions of ``inputs_embeds``; none for other inputs.
- Only forward passes with gradients on count (not evaluation). The sums over a step's passes
  (its micro-batches) are logged as the scalars ``samples`` and ``tokens`` at its end, unless
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
from typing import TYPE_CHECKING, Any

import torch

from dtprof.record.native import SAMPLES, SEEN, TOKENS, WORK_IN_PYTHON
from dtprof.trace.meta import ModelFlops

if TYPE_CHECKING:
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
    the phase hooks at each forward pass and by the profiler at each step's end.

    Where the phases are native, the kernel counts the passes whose input is a plain tensor
    once the FLOPs are counted (its counts are in ``native_state``, read and zeroed at each
    step's end), and hands this class the others."""

    def __init__(self, prof: Profiler, native_state: Any = None) -> None:
        self.prof = prof
        self.scalars = prof.scalars
        self.native_state = native_state  # NativePhases.state, or None
        self.samples = 0
        self.tokens = 0
        self.seen = False  # a training forward pass in this step
        self.counter: Any = None  # the FlopCounterMode while it counts
        self.counted = False  # the count is made (or was given up)
        self.forward_flops = 0
        self.count_step: int | None = None
        self.compute_dtype: str | None = None

    def forward_begins(self, module: torch.nn.Module, args: Any, kwargs: Any) -> None:
        if not torch.is_grad_enabled():
            return
        counts = batch_counts(args, kwargs)
        if counts is not None:
            self.seen = True
            self.samples += counts[0]
            if counts[1] is not None:
                self.tokens += counts[1]
        if not self.counted and self.counter is None:
            self._count_flops(module)

    def _count_flops(self, module: torch.nn.Module) -> None:
        """Count the FLOPs of this forward pass, if it is one of the step that counts: that of
        the first training pass seen (a model is attached between steps, so that step is seen
        whole)."""
        step = self.prof.step_index
        try:
            if self.count_step is None:
                self.count_step = step
                self.compute_dtype = compute_dtype(module)
            elif self.count_step != step:
                return
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
        """The FLOPs are counted (or given up): the native kernel counts passes from now on."""
        self.counted = True
        if self.native_state is not None:
            self.native_state[WORK_IN_PYTHON] = 0

    def step_ends(self, step: int) -> None:
        """Log this step's samples and tokens (unless the script logs its own); note the FLOPs
        once the step they were counted in ends. A failure is the caller's to say
        (PhaseHooks.step_ends); the counts start again from zero either way."""
        try:
            if self.counter is not None:  # a forward pass that raised without its post-hook
                self.forward_ends()
            native = self.native_state
            if native is not None and native[SEEN]:
                self.seen = True
                self.samples += native[SAMPLES]
                self.tokens += native[TOKENS]
            if self.seen and self._first_stage():
                logged = self.prof.logged_work
                if "samples" not in logged:
                    self.scalars.append((step, "samples", float(self.samples)))
                if self.tokens and "tokens" not in logged:
                    self.scalars.append((step, "tokens", float(self.tokens)))
            if self.count_step == step and not self.counted:
                self._counting_ends()
                self._note_flops()
        finally:
            self.samples = self.tokens = 0
            self.seen = False
            if self.native_state is not None:
                self.native_state[SAMPLES] = self.native_state[TOKENS] = 0
                self.native_state[SEEN] = 0

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
        self.prof.note_meta(
            model_flops=ModelFlops(
                per_step=3 * self.forward_flops,
                forward=self.forward_flops,
                samples=self.samples if self.seen else None,
                tokens=self.tokens or None,
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
