"""A Lightning Trainer, recorded by one callback::

    from dtprof.integrations.lightning import DtprofCallback

    trainer = lightning.Trainer(strategy="ddp", callbacks=[DtprofCallback("trace/")])

Recording starts when fitting's training starts and ends with it. A step is an optimizer step
(with ``accumulate_grad_batches``, its micro-batches are inside it; Lightning runs them in the
optimizer's closure, and the optimizer phase starts after their backward pass); the model is
the strategy's wrapper (DDP's with ``strategy="ddp"``); the loss is what Lightning calls
``backward()`` on, summed over the step's micro-batches. ``profile_options`` are those of
``dtprof.profile()``.
"""

from __future__ import annotations

import os
from typing import Any

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # the older package name
    from pytorch_lightning.callbacks import Callback  # type: ignore[assignment]

from dtprof.record import auto


class DtprofCallback(Callback):  # type: ignore[misc]
    """Records each rank of a Lightning Trainer's training into ``trace_dir``."""

    def __init__(self, trace_dir: str | os.PathLike[str] = "trace", **profile_options: Any):
        # opened now, so that the DDP wrapper the strategy makes in fit() is seen
        self.session = auto.open_session(str(trace_dir), profile_options, starts_itself=False)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        auto.guarded(lambda: self._begin(getattr(trainer.strategy, "model", None) or pl_module))

    def _begin(self, model: Any) -> None:
        self.session.start()
        self.session.use_model(model)  # where no DDP wrapper was made

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        auto.guarded(lambda: self.session.end(exchange=True))
