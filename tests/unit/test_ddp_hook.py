"""dtprof's DDP comm hook scales each gradient the way DDP itself would have, to the bit.

Fake buckets on a fake group of 3, in one process: multiply where DDP copies a gradient into
its bucket, divide where the gradient already was the bucket's view, both within one bucket.
The values are chosen so that x / 3 and x * (1 / 3) differ in float32.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from dtprof.record.ddp_hook import BucketScaling, _was_view


def _values(n: int) -> torch.Tensor:
    """float32 values whose quotient by 3 differs from their product with 1/3."""
    gen = torch.Generator().manual_seed(0)
    found: list[torch.Tensor] = []
    while sum(map(len, found)) < n:
        x = torch.randn(4096, generator=gen)
        found.append(x[x / 3 != x * (1.0 / 3)])
    return torch.cat(found)[:n]


class FakeBucket:
    def __init__(self, params: list[torch.Tensor], buffer: torch.Tensor) -> None:
        self._params, self._buffer = params, buffer
        sizes = [p.numel() for p in params]
        self._views = list(buffer.split(sizes))

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def parameters(self) -> list[torch.Tensor]:
        return self._params

    def gradients(self) -> list[torch.Tensor]:
        return self._views


def _state() -> BucketScaling:
    group = SimpleNamespace(size=lambda: 3)
    return BucketScaling(SimpleNamespace(process_group=group))  # type: ignore[arg-type]


def _bucket(kept: list[bool]) -> tuple[FakeBucket, dict[int, Any], torch.Tensor]:
    """A bucket of len(kept) parameters; kept[i]: parameter i's gradient was the bucket's view
    before the pass (DDP divides it), else it had none (DDP copies and multiplies)."""
    params = [torch.nn.Parameter(torch.zeros(64)) for _ in kept]
    original = _values(64 * len(kept))
    bucket = FakeBucket(params, original.clone())
    before: dict[int, Any] = {}
    for p, view, k in zip(params, bucket.gradients(), kept, strict=True):
        before[id(p)] = view if k else None
        p.grad = view  # after DDP marked it ready, every gradient is its bucket view
    return bucket, before, original


def test_mixed_bucket_divides_the_views_and_multiplies_the_copies() -> None:
    state = _state()
    bucket, before, original = _bucket([True, False, True])
    state.before = before
    out = state.scale(bucket)
    assert out is bucket.buffer()
    want = torch.cat(
        [original[:64] / 3, original[64:128] * (1.0 / 3), original[128:] / 3]  # as DDP does
    )
    assert torch.equal(out, want)
    assert not torch.equal(out, original * (1.0 / 3))  # the test can tell the two apart


def test_whole_bucket_of_views_is_divided_and_of_copies_multiplied() -> None:
    state = _state()
    bucket, before, original = _bucket([True, True])
    state.before = before
    assert torch.equal(state.scale(bucket), original / 3)
    bucket, before, original = _bucket([False, False])
    state.before = before
    assert torch.equal(state.scale(bucket), original * (1.0 / 3))


def test_without_a_note_the_bucket_is_multiplied_as_ddp_does_when_copying() -> None:
    state = _state()
    bucket, _, original = _bucket([True, True])
    assert state.before is None
    assert torch.equal(state.scale(bucket), original * (1.0 / 3))


def test_a_view_is_recognized_by_its_storage_not_only_by_identity() -> None:
    buffer = torch.zeros(10)
    view = buffer[2:5]
    assert _was_view(view, view)
    assert _was_view(buffer[2:5], view)  # another tensor object on the same storage
    assert not _was_view(torch.zeros(3), view)
    assert not _was_view(None, view)
