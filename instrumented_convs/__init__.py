"""instrumented_convs: where the time goes inside graph convolution layers.

Change one import (``from instrumented_convs.pyg import GCNConv``), train as before, then
``print(registry.summary())``: every internal step of every layer, timed (CUDA events on a
GPU, no per-step synchronize), nested, and shown as NVTX ranges and profiler labels.
"""
from __future__ import annotations

import contextlib
from typing import Iterator, Optional

from . import _config
from ._clock import set_cpu_clock
from ._layers import name_layers
from ._registry import Entry, Registry, registry
from ._step import Step, current_path, instrumenting, nvtx_backend, region, set_nvtx_backend, step
from .report import Row, Summary, TableRenderer

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "registry",
    "Registry",
    "Entry",
    "step",
    "region",
    "Step",
    "enable",
    "disable",
    "disabled",
    "is_enabled",
    "configure",
    "summary",
    "reset",
    "current_path",
    "instrumenting",
    "name_layers",
    "nvtx_backend",
    "set_nvtx_backend",
    "set_cpu_clock",
    "Summary",
    "Row",
    "TableRenderer",
]


def enable() -> None:
    """Turn instrumentation on (the default unless ``INSTRUMENTED_CONVS_DISABLE=1``)."""
    _config.enabled = True


def disable() -> None:
    """Turn instrumentation off: each step then costs one flag check, layers run stock code."""
    _config.enabled = False


def is_enabled() -> bool:
    """Whether steps are being recorded."""
    return _config.enabled


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """Turn instrumentation off inside the block, and restore the previous state after."""
    previous = _config.enabled
    _config.enabled = False
    try:
        yield
    finally:
        _config.enabled = previous


def configure(*, nvtx: Optional[bool] = None, record_function: Optional[bool] = None) -> None:
    """Switch NVTX ranges and ``record_function`` labels on or off (``None`` keeps as is)."""
    if nvtx is not None:
        _config.nvtx = bool(nvtx)
    if record_function is not None:
        _config.record_function = bool(record_function)


def summary(by: str = "step", unit: Optional[str] = None) -> Summary:
    """Shorthand for ``registry.summary(by, unit)``."""
    return registry.summary(by=by, unit=unit)


def reset() -> None:
    """Shorthand for ``registry.reset()``."""
    registry.reset()
