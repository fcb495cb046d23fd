"""``dtprof run``'s session in this process: what it records of a script's calls into torch, and
what a forked child of the script does with it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import dtprof
from dtprof.record import auto


class _Loss(torch.Tensor):
    """A tensor subclass, as a framework's loss may be: read by item(), not from memory."""


def test_a_steps_loss_is_its_backwards_summed_and_unscaled(tmp_path: Path, kernel: str) -> None:
    """Each step logs the sum of the losses of its micro-batches, the GradScaler's factor
    undone: a plain CPU loss read as it is backpropagated, any other one at the step's end."""
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    session = auto.Session(str(tmp_path / "trace"), {"clock_sync": False}, starts_itself=False)
    session.start()
    session.use_model(model)
    try:
        for step in range(3):
            for micro in range(2):
                value = step + micro / 4
                loss = model(torch.ones(1, 2)).sum() * 0 + value
                if step == 2:
                    loss = loss.as_subclass(_Loss)
                if micro == 1:  # what the wrapped GradScaler.scale and Tensor.backward report
                    loss = scaler.scale(loss)
                    session.loss_scaled(loss, scaler._scale)  # type: ignore[arg-type]
                session.backward(loss)
                loss.backward()
            session.optimizer_pre(optimizer, (), {})  # what torch.optim's global hooks report
            session.optimizer_post(optimizer, (), {})
    finally:
        session.end()
    scalars = dtprof.load_trace(tmp_path / "trace").scalars
    logged = scalars[scalars["name"] == "loss"].sort_values("step")
    assert logged["step"].tolist() == [0, 1, 2]
    assert logged["value"].tolist() == [0.25, 2.25, 4.25]


def test_the_optimizers_pre_hook_goes_once_the_session_has_its_optimizer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch.optim's global pre-hook finds the session's optimizer at its first step and is
    then removed (it would only cost time); the next session registers it again."""
    import functools

    import torch.optim.optimizer as optimizer_hooks

    pre_hooks = optimizer_hooks._global_optimizer_pre_hooks
    hooks_before = len(pre_hooks)
    monkeypatch.setattr(auto, "_first_steps", None)
    post = optimizer_hooks.register_optimizer_step_post_hook(
        functools.partial(auto._on, "optimizer_post")
    )
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    try:
        for trace in ("first", "second"):
            session = auto.Session(
                str(tmp_path / trace), {"clock_sync": False}, starts_itself=False
            )
            monkeypatch.setattr(auto, "_session", session)
            auto._watch_first_steps()
            assert len(pre_hooks) == hooks_before + 1
            session.start()
            for _ in range(3):
                model(torch.ones(1, 2)).sum().backward()
                optimizer.step()
                assert len(pre_hooks) == hooks_before
            session.end()
            assert session.optimizer is optimizer
            assert len(dtprof.load_trace(tmp_path / trace).steps) == 3
    finally:
        post.remove()
        auto.unwatch_first_steps()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_forked_child_of_a_recorded_script_records_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A data loader's worker is a fork of the training process: the session it inherits must
    not record there (nor its end close the parent's trace), while the parent's goes on."""
    from dtprof.record import auto

    session = auto.Session(str(tmp_path / "trace"), {"clock_sync": False}, starts_itself=False)
    monkeypatch.setattr(auto, "_session", session)
    session.start()
    try:
        assert session.recording
        pid = os.fork()
        if pid == 0:  # the child: no pytest from here, only an exit code
            auto._on("end")  # what its exit would do
            os._exit(0 if not session.recording and session.prof.active else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert session.recording
    finally:
        session.end()
    assert not session.recording
