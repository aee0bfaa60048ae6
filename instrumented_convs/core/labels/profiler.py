"""torch.profiler labels for steps: opened only while a profiler records, through torch's
fast C++ handle (a full ``record_function`` costs far more than a step)."""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from ..native import private


class _ProfilerFlagShim:
    """For torch versions without the module flag: the same attribute, from a C call."""

    @property
    def _is_profiler_enabled(self) -> bool:
        return bool(torch.autograd._profiler_enabled())


def _profiler_state() -> Any:
    """An object whose ``_is_profiler_enabled`` says whether a torch profiler is recording.

    torch keeps that flag as a plain module attribute (``torch.autograd.profiler``), so the
    hot path reads it in a few nanoseconds instead of calling into C++.
    """
    from torch.autograd import profiler as _prof

    if hasattr(_prof, "_is_profiler_enabled"):
        return _prof
    return _ProfilerFlagShim()


def _fast_record_function() -> Optional[Callable[[str], Any]]:
    """The C++ record-function handle (``_RecordFunctionFast``), where this torch has one that
    makes a label as it did (checked once: :mod:`..native.private`)."""
    fast = private.find("_C._profiler._RecordFunctionFast")
    if fast is None:  # (torch before 2.3: record_function)
        return None

    def canary() -> None:
        handle = fast("instrumented_convs (canary)")
        handle.__enter__()
        handle.__exit__(None, None, None)

    return fast if private.probe("record_function", canary) else None


profiler_state: Any = _profiler_state()
fast_record_function = _fast_record_function()


def open_record_function(name: str) -> Any:
    """Enter a record_function labelled ``name`` and return the handle to exit it with."""
    if fast_record_function is not None:
        handle = fast_record_function(name)
    else:
        handle = torch.profiler.record_function(name)
    handle.__enter__()
    return handle
