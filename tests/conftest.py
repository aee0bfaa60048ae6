"""Shared fixtures: a clean registry and switches for every test, and an exact fake clock.

Helpers that tests import (``gpu``, ``run_script``, ``outcome``, ``train_losses``) live in
``tests/helpers.py``; ``outcome`` and ``train_losses`` are re-exported here for old imports.

Tests that need torch-sparse (a ``torch_sparse.SparseTensor`` input, PyG's sampler, a layer
that builds one) carry the ``sparse`` mark: where torch_sparse does not import they are
skipped, each with the reason in ``-rs``, unless ``INSTRUMENTED_CONVS_EXPECT_SPARSE=1`` says it
must import (scripts/test.sh runs them so, once its compile is done), which makes the run fail.
Any other skip fails a CI run unless tests/expected_skips.py lists it (tests/skips.py).
"""

from __future__ import annotations

import os
from typing import List, Optional

import pytest

import instrumented_convs as ic
from instrumented_convs.core.compiler import dynamo
from instrumented_convs.testing import FakeClock, cpu_clock, depth, open_steps

from .fakes import fake_cuda  # noqa: F401  (a fixture for every test)
from .helpers import outcome, train_losses  # noqa: F401  (re-exported)
from .skips import (  # noqa: F401  (hooks: CI's skips checked, tests/skips.py)
    pytest_collectreport,
    pytest_runtest_logreport,
    pytest_sessionfinish,
)


def _torch_sparse_error() -> Optional[str]:
    """Why torch_sparse does not import here, or None when it does."""
    try:
        import torch_sparse  # noqa: F401
    except Exception as exc:  # ImportError, or a build against another torch (OSError...)
        return f"{type(exc).__name__}: {exc}"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    """Skip the ``sparse``-marked tests without torch_sparse, or fail if it was expected."""
    error = _torch_sparse_error()
    if error is None:
        return
    if os.environ.get("INSTRUMENTED_CONVS_EXPECT_SPARSE") == "1":
        raise pytest.UsageError(
            f"INSTRUMENTED_CONVS_EXPECT_SPARSE=1 but torch_sparse does not import: {error}"
        )
    skip = pytest.mark.skip(reason=f"needs torch-sparse (scripts/env.sh sparse): {error}")
    for item in items:
        if item.get_closest_marker("sparse"):
            item.add_marker(skip)


def _forget_compiled() -> None:
    """Forget what earlier tests compiled: our layers' trace notes, Dynamo's graph breaks and
    recompiles (all the process's, kept across ``registry.reset()`` on purpose)."""
    dynamo.forget()
    try:
        from torch._dynamo.utils import graph_break_reasons, guard_failures
    except ImportError:  # pragma: no cover - a torch without Dynamo
        return
    graph_break_reasons.clear()
    guard_failures.clear()


@pytest.fixture(autouse=True)
def clean_state():
    """Every test starts enabled, with an empty registry, NVTX and record_function on, and
    nothing noted of compiled code."""
    saved = ic.configure(enabled=True, nvtx=True, record_function=True)
    ic.registry.reset()
    _forget_compiled()
    yield
    assert depth() == 0, f"a test left steps open on the main thread: {open_steps()}"
    saved.restore()
    ic.registry.reset()
    _forget_compiled()


@pytest.fixture
def clock():
    """Install a :class:`~instrumented_convs.testing.FakeClock` as the CPU clock for the test."""
    with cpu_clock(FakeClock()) as fake:
        yield fake
