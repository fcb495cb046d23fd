"""DDP's gradient buckets, seen where DDP's reducer hands them to the process group.

DDP reduces its buckets from C++, out of reach of the wrapped Python API. Every process-group
call passes through torch's dispatcher as an operator, DDP's bucket all-reduces as
``c10d::allreduce_``, so while a profile records, dtprof registers a Python kernel for that
operator under the autograd keys (CPU and CUDA). The kernel notes the time, passes the call
down unchanged to the backend's own kernel, and records the completion in a callback on the
operation's future. Nothing of DDP changes: no comm hook, DDP's own fused scaling and its C++
reduction, a comm hook of the user's own still works, and the kernel is gone when the profile
exits.

Calls made through the wrapped Python API are recorded there and pass through here untouched.
Of the others, only those on the process group of a DDP model given to ``profile()`` are
recorded: floating-point ones as ``ddp.bucketN``, N counting them within one backward pass
(DDP launches its buckets in index order), and the integer map of used parameters that DDP
reduces under ``find_unused_parameters`` as ``ddp.used_parameters``.

Where the kernel cannot be registered (a torch without these operators, or a kernel of someone
else's there) or would not see the buckets (parameters on a device other than CPU and CUDA),
``ddp_hook`` records them through a comm hook instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from dtprof.record import comms

if TYPE_CHECKING:
    from dtprof.record.comms import CommRecorder

KEYS = ("AutogradCPU", "AutogradCUDA")


class BucketWatch:
    """The dispatcher kernel for ``c10d::allreduce_`` and the DDP groups it records."""

    def __init__(self, recorder: CommRecorder) -> None:
        self.recorder = recorder
        self.enabled = True
        # watched group -> [backward pass (graph task id) of the last bucket, next bucket index]
        self._groups: dict[Any, list[int]] = {}
        self._lib: Any = None
        op = torch.ops.c10d.allreduce_.default
        handle = getattr(op, "_handle", None)  # one Python frame less per call where it exists
        self._redispatch = handle.redispatch_boxed if handle is not None else op.redispatch
        self._below_autograd = torch._C._after_autograd_keyset
        self._unbox_group = dist.ProcessGroup.unbox
        self._unbox_work = dist.Work.unbox
        self._graph_task = torch._C._current_graph_task_id

    def watch(self, model: torch.nn.parallel.DistributedDataParallel) -> None:
        """Record the buckets of ``model``'s group; raises where the kernel cannot be registered
        or would not see them (parameters on a device other than CPU and CUDA)."""
        devices = {p.device.type for p in model.parameters()}
        if not devices <= {"cpu", "cuda"}:
            raise RuntimeError(
                f"parameters on {', '.join(sorted(devices))}: the kernel is for cpu, cuda"
            )
        group = model.process_group
        if group is None:
            group = c10d._get_default_group()
        if self._lib is None:
            lib = torch.library.Library("c10d", "IMPL")
            try:
                for key in KEYS:
                    lib.impl("allreduce_", self._kernel, key, with_keyset=True)
            except BaseException:
                lib._destroy()
                raise
            self._lib = lib
        self._groups.setdefault(group, [-2, 0])

    def uninstall(self) -> None:
        self.enabled = False
        lib, self._lib = self._lib, None
        if lib is not None:
            lib._destroy()
        self._groups.clear()

    def _kernel(self, keyset: Any, tensors: list[torch.Tensor], group: Any, *rest: Any) -> Any:
        start = comms.now_ns()
        out = self._redispatch(keyset & self._below_autograd, tensors, group, *rest)
        if self.enabled and not comms._tls.depth:
            try:
                self._seen(start, tensors, group, out[1])
            except Exception as exc:
                self.enabled = False  # the registration stays until exit: passing through
                self.recorder.prof.hook_failed("ddp buckets", exc)
        return out

    def _seen(self, start: int, tensors: list[torch.Tensor], boxed_group: Any, work: Any) -> None:
        group = self._unbox_group(boxed_group)
        watched = self._groups.get(group)
        if watched is None or not tensors:
            return
        if tensors[0].is_floating_point() or tensors[0].is_complex():
            task = self._graph_task()
            if task != watched[0]:
                watched[0], watched[1] = task, 0
            label = f"ddp.bucket{watched[1]}"
            watched[1] += 1
        else:
            label = "ddp.used_parameters"
        self.recorder.launched(group, tensors, start, label, self._unbox_work(work))
