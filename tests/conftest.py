"""Shared fixtures: a clean registry and switches for every test, and an exact fake clock."""
from __future__ import annotations

import pytest

import instrumented_convs as ic
from instrumented_convs import _config, _step


class FakeClock:
    """A CPU clock that moves only when told: timing assertions become exact."""

    def __init__(self, start: int = 1_000_000) -> None:
        self.now = start

    def __call__(self) -> int:
        return self.now

    def advance(self, ns: int) -> None:
        self.now += ns


@pytest.fixture(autouse=True)
def clean_state():
    """Every test starts enabled, with an empty registry, NVTX and record_function on."""
    saved = (_config.enabled, _config.nvtx, _config.record_function)
    _config.enabled, _config.nvtx, _config.record_function = True, True, True
    ic.registry.reset()
    yield
    assert _step.depth() == 0, "a test left a step open on the main thread"
    _config.enabled, _config.nvtx, _config.record_function = saved
    ic.registry.reset()


@pytest.fixture
def clock():
    """Install a :class:`FakeClock` as the CPU clock for the test."""
    fake = FakeClock()
    previous = ic.set_cpu_clock(fake)
    yield fake
    ic.set_cpu_clock(previous)


def outcome(fn):
    """``(result, None)`` or ``(None, exception)``: compare failures with the stock layer's."""
    try:
        return fn(), None
    except Exception as exc:
        return None, exc


def train_losses(model, inputs, y, steps=5, lr=0.01):
    """Train ``model(*inputs)`` with Adam and NLL loss; return the loss of every step."""
    import torch
    import torch.nn.functional as F

    opt = torch.optim.Adam(model.parameters(), lr=lr)
    trace = []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.nll_loss(model(*inputs), y)
        loss.backward()
        opt.step()
        trace.append(loss.item())
    return trace
