"""instrumented_convs: where the time goes inside graph convolution layers.

Change one import (``from instrumented_convs.pyg import GCNConv``), train as before, then
``print(registry.summary())``: every internal step of every layer, timed (CUDA events on a
GPU, no per-step synchronize), nested, and shown as NVTX ranges and profiler labels.

This module is the face: it re-exports what users use (``__all__``). The machinery lives
in private modules whose imports point down only: ``_config``, ``_clock``, ``_stack`` and
``report`` import nothing above them; ``_stats`` builds summaries from plain data;
``_registry`` stores; ``_ranges`` emits NVTX ranges and profiler labels; ``_step`` ties them
together. Test plumbing (a fake clock, fake CUDA events) is in
:mod:`instrumented_convs.testing`.
"""
from __future__ import annotations

from typing import Any, Optional

from ._config import Settings, configure, disable, disabled, enable, is_enabled, settings
from ._instrument import instrument, uninstrument
from ._layers import name_layers
from ._registry import Entry, Registry, registry
from ._step import (
    Step, current_path, instrumenting, mark_outputs, nvtx_backend, region, set_nvtx_backend, step,
)
from .report import Row, Summary, TableRenderer

__version__ = "0.1.0"

__all__ = [
    "__version__",
    # recording
    "step",
    "region",
    "name_layers",
    "instrument",
    "uninstrument",
    # reading
    "registry",
    "summary",
    "reset",
    "Summary",
    "Row",
    # switches
    "enable",
    "disable",
    "disabled",
    "is_enabled",
    "configure",
    "settings",
    "Settings",
    "set_nvtx_backend",
    "nvtx_backend",
    # for layer authors: the step machinery
    "Step",
    "instrumenting",
    "current_path",
    "mark_outputs",
]


def summary(by: str = "step", unit: Optional[str] = None, all_ranks: bool = False, group: Any = None) -> Summary:
    """Shorthand for ``registry.summary(by, unit, all_ranks, group)``."""
    return registry.summary(by=by, unit=unit, all_ranks=all_ranks, group=group)


def reset() -> None:
    """Shorthand for ``registry.reset()``."""
    registry.reset()
