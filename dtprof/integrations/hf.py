"""The Hugging Face Trainer, recorded by one callback::

    from dtprof.integrations.hf import DtprofCallback

    trainer = Trainer(model=model, args=args, train_dataset=data,
                      callbacks=[DtprofCallback("trace/")])

Recording starts when training does and ends with it. A step is an optimizer step (with
``gradient_accumulation_steps``, its micro-batches are inside it); the model is the wrapper
the Trainer trains (DDP's where it makes one); the loss is what the Trainer calls
``backward()`` on, summed over the step's micro-batches. ``profile_options`` are those of
``dtprof.profile()`` (``fingerprint_every``, ``hang_timeout_s``, ...).
"""

from __future__ import annotations

import os
from typing import Any

from transformers import TrainerCallback

from dtprof.record import auto


class DtprofCallback(TrainerCallback):  # type: ignore[misc]
    """Records each rank of a Trainer's training into ``trace_dir``."""

    def __init__(self, trace_dir: str | os.PathLike[str] = "trace", **profile_options: Any):
        # opened now, so that the DDP wrapper the Trainer makes in train() is seen
        self.session = auto.open_session(str(trace_dir), profile_options, starts_itself=False)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        auto.guarded(lambda: self._begin(kwargs.get("model")))

    def _begin(self, model: Any) -> None:
        self.session.start()
        if model is not None:
            self.session.use_model(model)  # where no DDP wrapper was made

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        auto.guarded(lambda: self.session.end(exchange=True))
