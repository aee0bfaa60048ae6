"""Stand-ins the tests share: CUDA events whose times the test sets (and the fixture that
installs them, re-exported by conftest), an autograd function that advances the fake
clock in its backward, and a summary row with a chosen mean."""

from __future__ import annotations

import pytest
import torch

from instrumented_convs.report import Row
from instrumented_convs.testing import cuda_event_factory

__all__ = ["FakeEvent", "fake_cuda", "Advance", "row"]


class FakeEvent:
    """Stands in for ``torch.cuda.Event``: the test decides when it completes and its time."""

    timeline = 0  # ms, advanced by the test between records

    def __init__(self):
        self.at = None
        self.done = False
        self.synchronized = False

    def record(self, stream=None):
        self.at = FakeEvent.timeline
        self.done = False

    def query(self):
        return self.done

    def synchronize(self):
        self.synchronized = True
        self.done = True

    def elapsed_time(self, end):
        assert self.done or end.done, "elapsed_time read before the end event completed"
        return end.at - self.at


@pytest.fixture
def fake_cuda(monkeypatch):
    """Route the CUDA clock to FakeEvents and forbid any device-wide synchronize."""
    created = []

    def factory():
        ev = FakeEvent()
        created.append(ev)
        return ev

    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: f"stream-{device}")

    def no_sync(*a, **k):
        raise AssertionError("torch.cuda.synchronize() called")

    monkeypatch.setattr(torch.cuda, "synchronize", no_sync)
    FakeEvent.timeline = 0
    with cuda_event_factory(factory):
        yield created


class Advance(torch.autograd.Function):
    """Identity whose backward advances the fake clock by ``ns`` nanoseconds."""

    @staticmethod
    def forward(ctx, x, clock, ns):
        ctx.clock, ctx.ns = clock, ns
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        ctx.clock.advance(ctx.ns)
        return grad, None, None


def row(name, mean, std=0.0, count=100, phase="forward", estimated=0, scope=None):
    depth = name.count("/")
    return Row(
        name=name,
        step=name.rsplit("/", 1)[-1],
        depth=depth,
        scope=scope,
        kind="step",
        count=count,
        total=mean * count,
        self_time=mean * count,
        mean=mean,
        min=mean,
        max=mean,
        std=std,
        fraction=0.0,
        self_fraction=0.0,
        phase=phase,
        estimated=estimated,
    )
