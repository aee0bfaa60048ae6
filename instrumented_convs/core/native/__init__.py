"""What the core binds to below torch's public Python API. The C fast path of steps
(``_speedups``, built from the ``.c`` files beside this one): whether it is built and in use;
where it is not, or where ``INSTRUMENTED_CONVS_PURE_PYTHON=1``, every module uses its Python
twin (:data:`TWINS`), which behaves the same: CI runs the core tests both ways. torch's private
calls, each checked by a canary (:mod:`.private`), and the releases known not to run
(:mod:`.versions`). This module imports nothing from the package but the extension.
"""

from __future__ import annotations

import ctypes
import logging
import os
from typing import Any, Callable, Optional

import torch

__all__ = ["speedups", "IMPLEMENTATION", "TWINS", "seq_counter_address"]

logger = logging.getLogger(__name__)

#: ``at::sequence_number::peek()``: the C++ function behind ``torch._C._autograd._get_sequence_nr``.
_PEEK = "_ZN2at15sequence_number4peekEv"


def _load() -> Optional[Any]:
    if os.environ.get("INSTRUMENTED_CONVS_PURE_PYTHON", "").strip().lower() not in (
        "",
        "0",
        "false",
        "no",
        "off",
    ):
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

#: Each C file and the Python it mirrors (dotted names under ``instrumented_convs``). The C
#: files need only CPython's headers (the CUDA driver is loaded at run time, where there is
#: one); ``pip install`` builds them, and so does ``python setup.py build_ext --inplace`` in
#: a checkout. What the C side reads of Python: the switches (``core.settings``), the
#: registry and the ``Entry`` slots ``children``, ``buf``, ``retired`` (``_speedups.c``) and
#: ``host``, ``dcalls``, ``lag``, ``caught`` (``_speedups_cuda.c``); the ``Step`` slots
#: (``_speedups_step.c``); the instance's ``__dict__`` (``_speedups_timed.c``); the ``Log``
#: slots, ``anchor.fast_exit`` and ``sampling._random`` (``_speedups_anchor.c``).
TWINS = {
    "_speedups.c": (  # bind(), the CPU clock, each thread's stack, sums
        "core.clocks.cpu.cpu_now",
        "core.frames.stack._ThreadState",
        "core.storage.entry.fold_buffer",
    ),
    "_speedups_step.c": ("core.frames.stack.Frame", "core.steps.stepbase.PyStepBase"),
    "_speedups_timed.c": (  # Timed, time_methods, time_children, restore
        "layers.contract.PyTimed",
        "layers.generic.install",
        "layers.generic.uninstall",
    ),
    "_speedups_anchor.c": (  # anchor logs, anchor_exit
        "core.backward.anchor.Log",
        "core.backward.anchor.log_exit",
        "core.backward.sampling.choose",
    ),
    "_speedups_count.c": ("core.backward.sampling._Count",),  # CountHook
    "_speedups_hook.c": ("core.backward.hooks._timed_hook",),  # BackwardHook
    "_speedups_cuda.c": (  # the CUDA clock: driver events, their pools, the queue, lags
        "core.clocks.events.record_event",
        "core.clocks.events.EventPool",
        "core.clocks.pending.PendingTimes",
        "core.clocks.pending.DeviceLag",
    ),
}


def seq_counter_address(py: Optional[Callable[[], int]]) -> Optional[int]:
    """The address of ATen's ``at::sequence_number::peek`` in the loaded ``libtorch_cpu``, so
    the extension reads autograd's per-thread sequence counter with a C call instead of
    ``py``, torch's Python one (two per logged step); None where ``py`` is None (not relied
    on), or peek is not found or does not agree with ``py`` before and after a new node."""
    noload = getattr(os, "RTLD_NOLOAD", None)
    if noload is None or py is None or torch.is_inference_mode_enabled():
        return None
    lib_dir = os.path.join(os.path.dirname(torch.__file__), "lib")
    for name in ("libtorch_cpu.so", "libtorch_cpu.dylib"):
        path = os.path.join(lib_dir, name)
        if not os.path.exists(path):
            continue
        try:  # the copy torch loaded, never a second one (RTLD_NOLOAD)
            peek = ctypes.CDLL(path, mode=noload | os.RTLD_LAZY)[_PEEK]
        except (OSError, AttributeError):
            return None
        peek.restype, peek.argtypes = ctypes.c_uint64, []
        s0 = py()
        with torch.enable_grad():
            node = torch.zeros(1, requires_grad=True) * 2  # a new node moves the counter
        if peek() != py() or py() != s0 + 1 or node.grad_fn is None:
            logger.debug(
                "instrumented_convs: %s disagrees with torch; the Python call is used", _PEEK
            )
            return None
        return ctypes.cast(peek, ctypes.c_void_p).value
    return None
