"""NVTX ranges and torch.profiler labels for steps.

NVTX backends, first found wins:

1. the ``nvtx`` package: ranges in the domain ``instrumented_convs``, one colour per step
   name, with the event attributes built once per name and cached (a push and a pop then
   cost ~90 ns when no tool is attached);
2. ``torch.cuda.nvtx`` (CUDA builds of torch): plain ``RangePushA``/``RangePop`` ranges,
   without a domain or colour;
3. nothing: ranges are skipped.

``record_function`` labels are opened only while a torch profiler is recording: a full
``torch.profiler.record_function`` costs ~9 us, so the step asks a cheap boolean first and
then uses the fast C++ handle.
"""
from __future__ import annotations

import functools
import logging
import zlib
from typing import Any, Callable, Dict, Optional, Tuple

import torch

logger = logging.getLogger(__name__)

#: The NVTX domain of every range this library opens.
DOMAIN = "instrumented_convs"

# A qualitative palette (ARGB); a step name always gets the same colour.
_PALETTE = (
    0xFF4E79A7, 0xFFF28E2B, 0xFFE15759, 0xFF76B7B2, 0xFF59A14F,
    0xFFEDC948, 0xFFB07AA1, 0xFFFF9DA7, 0xFF9C755F, 0xFFBAB0AC,
)


def color_of(name: str) -> int:
    """The ARGB colour of a step name (stable across runs and processes)."""
    return _PALETTE[zlib.crc32(name.encode()) % len(_PALETTE)]


class NvtxBackend:
    """Push/pop NVTX ranges; ``push(name)`` and ``pop()`` never raise."""

    name = "none"

    def push(self, name: str) -> None:
        """Open a range named ``name`` on this thread."""

    def pop(self) -> None:
        """Close the innermost range of this thread."""


class _NvtxPackageBackend(NvtxBackend):
    """The ``nvtx`` package, domain ``instrumented_convs``, cached attributes per name."""

    name = "nvtx"

    def __init__(self, nvtx_module: Any) -> None:
        self._nvtx = nvtx_module
        self._domain = nvtx_module.get_domain(DOMAIN)
        self._attrs: Dict[str, Any] = {}
        if hasattr(self._domain, "push_range"):  # nvtx >= 0.2.12
            self._push_range = self._domain.push_range
            self._pop_range = self._domain.pop_range
        else:  # nvtx <= 0.2.11: module-level functions taking the domain handle
            from nvtx._lib import pop_range, push_range  # type: ignore[import-not-found]

            handle = self._domain.handle
            self._push_range = functools.partial(push_range, domain=handle)
            self._pop_range = functools.partial(pop_range, handle)

    def attributes(self, name: str) -> Any:
        """The cached event attributes (message and colour) of a step name."""
        attrs = self._attrs.get(name)
        if attrs is None:
            attrs = self._domain.get_event_attributes(message=name, color=color_of(name))
            self._attrs[name] = attrs
        return attrs

    def push(self, name: str) -> None:
        attrs = self._attrs.get(name)
        if attrs is None:
            attrs = self.attributes(name)
        self._push_range(attrs)

    def pop(self) -> None:
        self._pop_range()


class _TorchNvtxBackend(NvtxBackend):
    """``torch.cuda.nvtx`` (CORE ``RangePushA``/``RangePop``), available in CUDA builds."""

    name = "torch.cuda.nvtx"

    def __init__(self) -> None:
        self._push = torch.cuda.nvtx.range_push
        self._pop = torch.cuda.nvtx.range_pop

    def push(self, name: str) -> None:
        self._push(name)

    def pop(self) -> None:
        self._pop()


def _torch_nvtx_works() -> bool:
    try:
        torch.cuda.nvtx.range_push("instrumented_convs:probe")
        torch.cuda.nvtx.range_pop()
        return True
    except Exception:  # CPU builds raise: "NVTX functions not installed"
        return False


def make_backend(prefer: Optional[str] = None) -> NvtxBackend:
    """Pick an NVTX backend: ``prefer`` in ``nvtx``/``torch``/``none``, else the first found."""
    order: Tuple[str, ...] = (prefer,) if prefer else ("nvtx", "torch")
    for choice in order:
        if choice == "nvtx":
            try:
                import nvtx  # type: ignore[import-not-found]

                return _NvtxPackageBackend(nvtx)
            except Exception as exc:  # not installed, or a broken build
                logger.debug("nvtx package unavailable: %s", exc)
        elif choice == "torch":
            if _torch_nvtx_works():
                return _TorchNvtxBackend()
        elif choice == "none":
            return NvtxBackend()
        else:
            raise ValueError(f"unknown NVTX backend {choice!r}; use 'nvtx', 'torch' or 'none'")
    return NvtxBackend()


def _profiler_flag() -> Callable[[], bool]:
    """A cheap "is a torch profiler recording?" test for this torch version."""
    from torch.autograd import profiler as _prof

    if hasattr(_prof, "_is_profiler_enabled"):
        return lambda: _prof._is_profiler_enabled
    return torch.autograd._profiler_enabled  # older torch: a C call


def _fast_record_function() -> Optional[Callable[[str], Any]]:
    """The C++ record-function handle (``_RecordFunctionFast``), if this torch has one."""
    return getattr(torch._C._profiler, "_RecordFunctionFast", None)


profiler_recording: Callable[[], bool] = _profiler_flag()
fast_record_function = _fast_record_function()


def open_record_function(name: str) -> Any:
    """Enter a record_function labelled ``name`` and return the handle to exit it with."""
    if fast_record_function is not None:
        handle = fast_record_function(name)
    else:
        handle = torch.profiler.record_function(name)
    handle.__enter__()
    return handle
