"""dtprof's DDP comm hook: records each gradient bucket's all-reduce, with DDP's own arithmetic.

DDP reduces its buckets from C++, out of reach of the wrapped Python API. ``ddp_buckets`` sees
them at torch's dispatcher without touching DDP; this comm hook is the way where that cannot be
had (or with ``profile(ddp_buckets="comm_hook")``). A hook takes over the scaling DDP does
without one, and DDP scales in two ways:

- a gradient copied into its bucket (the usual case, and every gradient of a model without
  ``gradient_as_bucket_view``) is multiplied by 1 / world size during the copy;
- a gradient that already is a view of its bucket (``gradient_as_bucket_view=True`` with
  gradients kept between steps, ``zero_grad(set_to_none=False)``) is divided in place.

On CPU, x * (1/3) and x / 3 differ in the last bit, so the hook must know which way each
gradient went. For a world size that is a power of two the two agree exactly and the hook
multiplies. Otherwise, for a model with ``gradient_as_bucket_view``, a tensor hook on the
model's output notes every parameter's gradient as the backward pass begins, before DDP copies
anything; a gradient that was already the bucket's view is divided, any other multiplied (an
output pytree cannot see into, such as a custom class, gives no note: then every gradient is
multiplied). The job then trains bit-identically with and without dtprof, during recording and
after it (a comm hook cannot be taken off a DDP model, so the hook and this note-taking stay
with it).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch.utils._pytree import tree_leaves

from dtprof.record import comms


class BucketScaling:
    """The hook's state for one DDP model: its group, and how DDP would scale each gradient."""

    def __init__(self, model: torch.nn.parallel.DistributedDataParallel) -> None:
        group = model.process_group
        self.group = group if group is not None else c10d._get_default_group()
        self.size: int = self.group.size()
        self.inverse = 1.0 / self.size
        # parameter id -> its gradient as the backward pass began (None: no snapshot this pass)
        self.before: dict[int, torch.Tensor | None] | None = None
        self._params: list[torch.Tensor] = []

    def __getstate__(self) -> dict[str, Any]:
        """A copy of the model (copy.deepcopy, torch.save) takes this state along in DDP's list
        of comm hooks: the group is left out, as DDP leaves its own out, and the copy's state
        watches no parameters."""
        return {"size": self.size, "inverse": self.inverse}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.group = c10d._get_default_group()  # as DDP's own copy does
        self.before = None
        self._params = []

    def watch(self, model: torch.nn.parallel.DistributedDataParallel) -> None:
        """Note the gradients at each backward's start, where DDP's two ways can differ."""
        if model.gradient_as_bucket_view and self.size & (self.size - 1) != 0:
            self._params = [p for p in model.parameters() if p.requires_grad]
            model.register_forward_hook(self._forward_post)

    def _forward_post(self, module: Any, args: Any, output: Any) -> None:
        if torch.is_grad_enabled():
            for leaf in tree_leaves(output):
                if isinstance(leaf, torch.Tensor) and leaf.requires_grad:
                    leaf.register_hook(self._backward_begins)

    def _backward_begins(self, grad: torch.Tensor) -> None:
        if self.before is None:
            self.before = {id(p): p.grad for p in self._params}
            torch.autograd.Variable._execution_engine.queue_callback(self._backward_ends)

    def _backward_ends(self) -> None:
        self.before = None  # and the old gradients it held go

    def scale(self, bucket: Any) -> torch.Tensor:
        """The bucket's buffer, scaled in place as DDP without a hook would have scaled it."""
        tensor: torch.Tensor = bucket.buffer()
        before = self.before
        if before is None:
            tensor.mul_(self.inverse)
            return tensor
        in_place = [_was_view(before.get(id(p)), p.grad) for p in bucket.parameters()]
        if all(in_place):
            tensor.div_(self.size)
        elif not any(in_place):
            tensor.mul_(self.inverse)
        else:
            for view, divide in zip(bucket.gradients(), in_place, strict=True):
                view.div_(self.size) if divide else view.mul_(self.inverse)
        return tensor


def _was_view(old: torch.Tensor | None, now: torch.Tensor | None) -> bool:
    """Whether the gradient a parameter had before the pass shares the storage of its bucket
    view now, which is what DDP's reducer checks to choose between copying and dividing."""
    if old is None or now is None:
        return False
    return old is now or old.untyped_storage().data_ptr() == now.untyped_storage().data_ptr()


def ddp_bucket_hook(state: BucketScaling, bucket: Any) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: scale the bucket as DDP does, all-reduce it, return it; while a profile
    records, the all-reduce is recorded as ``ddp.bucketN``, completing in the one callback DDP
    needs anyway."""
    tensor = state.scale(bucket)
    recorder = comms._active
    if recorder is None or not recorder.enabled or recorder._all_reduce is None:
        return state.group.allreduce([tensor]).get_future().then(_first_tensor)
    return recorder.bucket_all_reduce(state.group, tensor, bucket.index())


def _first_tensor(future: Any) -> torch.Tensor:
    return future.value()[0]


def install(model: torch.nn.parallel.DistributedDataParallel) -> None:
    """Register the hook on ``model`` (raises what DDP raises, e.g. for a hook already there)."""
    state = BucketScaling(model)
    model.register_comm_hook(state, ddp_bucket_hook)
    state.watch(model)


# DDP checks the hook's annotations at registration; this module's are strings.
ddp_bucket_hook.__annotations__ = {
    "state": object,
    "bucket": dist.GradBucket,
    "return": torch.futures.Future[torch.Tensor],
}
