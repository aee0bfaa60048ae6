"""Shared fixtures: a clean registry and switches for every test, and an exact fake clock.

Helpers that tests import (``gpu``, ``run_script``, ``outcome``, ``train_losses``) live in
``tests/helpers.py``; ``outcome`` and ``train_losses`` are re-exported here for old imports.
"""

from __future__ import annotations

import pytest

import instrumented_convs as ic
from instrumented_convs.testing import FakeClock, cpu_clock, depth, open_steps

from .helpers import outcome, train_losses  # noqa: F401  (re-exported)


@pytest.fixture(autouse=True)
def clean_state():
    """Every test starts enabled, with an empty registry, NVTX and record_function on."""
    saved = ic.configure(enabled=True, nvtx=True, record_function=True)
    ic.registry.reset()
    yield
    assert depth() == 0, f"a test left steps open on the main thread: {open_steps()}"
    saved.restore()
    ic.registry.reset()


@pytest.fixture
def clock():
    """Install a :class:`~instrumented_convs.testing.FakeClock` as the CPU clock for the test."""
    with cpu_clock(FakeClock()) as fake:
        yield fake
