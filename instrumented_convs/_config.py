"""Process-wide switches: instrumentation on/off, NVTX ranges, record_function labels.

Every switch is a plain module attribute so that the hot path pays one attribute read.
The environment variables are read once, at import:

- ``INSTRUMENTED_CONVS_DISABLE=1``: start disabled (every step is a no-op).
- ``INSTRUMENTED_CONVS_NVTX=0``: never push NVTX ranges.
- ``INSTRUMENTED_CONVS_RECORD_FUNCTION=0``: never open ``torch.profiler.record_function``.
"""
from __future__ import annotations

import os

_FALSE = ("", "0", "false", "no", "off")


def _env_flag(name: str, default: bool) -> bool:
    """Read a boolean environment variable (``1/true/yes/on`` or ``0/false/no/off``)."""
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() not in _FALSE


enabled: bool = not _env_flag("INSTRUMENTED_CONVS_DISABLE", False)
nvtx: bool = _env_flag("INSTRUMENTED_CONVS_NVTX", True)
record_function: bool = _env_flag("INSTRUMENTED_CONVS_RECORD_FUNCTION", True)
