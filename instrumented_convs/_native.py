"""The optional C extension ``_speedups``: whether it is built and in use.

``instrumented_convs/_speedups*.c`` hold the common case of a step (see :mod:`._stepbase`),
the frames and the per-thread stack they live on, and the arithmetic of folding an entry's
buffer. It needs only CPython's headers; ``pip install`` builds it, and so does ``python
setup.py build_ext --inplace`` in a checkout. Where it is not built, or where
``INSTRUMENTED_CONVS_PURE_PYTHON=1``, every module uses its Python twin, which behaves the same.
This module imports nothing from the package but the extension.
"""
from __future__ import annotations

import os
from typing import Any, Optional

__all__ = ["speedups", "IMPLEMENTATION"]


def _load() -> Optional[Any]:
    if os.environ.get("INSTRUMENTED_CONVS_PURE_PYTHON", "").strip().lower() not in ("", "0", "false", "no", "off"):
        return None
    try:
        from . import _speedups  # type: ignore[attr-defined]
    except ImportError:
        return None
    return _speedups


#: The extension module, or None: the Python twins run.
speedups: Optional[Any] = _load()
#: ``"C"`` or ``"Python"``: which implementation of the fast path runs.
IMPLEMENTATION = "C" if speedups is not None else "Python"
