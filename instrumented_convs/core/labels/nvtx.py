"""NVTX ranges for steps, so that Nsight Systems shows them: the backend that pushes them
(the ``nvtx`` package, else ``torch.cuda.nvtx``, else none) and the switch between backends.
Ranges are pushed only where a tool can see them (:func:`tool_attached`), since even a
no-op push costs a step a Python call.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import zlib
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from ..native import speedups
from ..settings import NVTX_REQUEST, switches

logger = logging.getLogger(__name__)

#: The NVTX domain of every range this library opens.
DOMAIN = "instrumented_convs"

# A qualitative palette (ARGB); a step name always gets the same colour.
_PALETTE = (
    0xFF4E79A7,
    0xFFF28E2B,
    0xFFE15759,
    0xFF76B7B2,
    0xFF59A14F,
    0xFFEDC948,
    0xFFB07AA1,
    0xFFFF9DA7,
    0xFF9C755F,
    0xFFBAB0AC,
)


def color_of(name: str) -> int:
    """The ARGB colour of a step name (stable across runs and processes)."""
    return _PALETTE[zlib.crc32(name.encode()) % len(_PALETTE)]


class NvtxBackend:
    """Push/pop NVTX ranges through ``push(name, scope, region, cpu)`` and ``pop()``, plain
    callables for speed: ``scope`` (the layer, or None), ``region`` (a region, not a step)
    and ``cpu`` (timed on the CPU clock) let a report read back say which layer, what kind
    and which clock (see :data:`PAYLOAD_REGION`)."""

    name = "none"

    def __init__(self) -> None:
        """A backend that does nothing (subclasses replace ``push`` and ``pop``)."""
        self.push: Callable[..., Any] = _noop_push
        self.pop: Callable[[], Any] = _noop_pop
        self.mark: Callable[[str], Any] = _noop_mark
        self.timed: Callable[[int], Any] = _noop_timed
        #: push the range of the tool's one-time work (``frames.setup``); False: none pushed
        self.push_tool: Callable[[str], bool] = _noop_push_tool


#: The bits of a range's payload: a region (not a step), a step on the CPU clock (not CUDA
#: events), the tool's one-time work (``frames.setup``: a row of its own, not its parent's
#: child); the layer is the range's category (report.nsys reads them back).
PAYLOAD_REGION, PAYLOAD_CPU, PAYLOAD_TOOL = 1, 2, 4


def _noop_push_tool(name: str) -> bool:
    return False


def _noop_push(
    name: str, scope: Optional[str] = None, region: bool = False, cpu: bool = False
) -> None:
    return None


def _noop_pop() -> None:
    return None


def _noop_mark(text: str) -> None:
    return None


def _noop_timed(ns: int) -> None:
    return None


#: The mark a step's range closes with when the range holds the tool's own time that the
#: step's clock leaves out (its children's enters and exits, backward hooks, the tool's
#: one-time work, its own after the clock stopped): its payload is the step's time as the
#: clock took it, in ns, which a report read back takes as the call's time (report.nsys).
TIME_MARK = "time"
#: A range that holds less than this many ns more than its clock closes without that mark
#: (a mark costs about what a range does): its duration is the call's time.
TIME_FLOOR_NS = 500


class _NvtxPackageBackend(NvtxBackend):
    """The ``nvtx`` package: ranges in the domain ``instrumented_convs``, one colour per step
    name, the layer as the range's category and a region's payload, the event attributes
    built once per name, layer and kind and cached (a push then costs two lookups)."""

    name = "nvtx"

    def __init__(self, nvtx_module: Any) -> None:
        super().__init__()
        domain = nvtx_module.get_domain(DOMAIN)
        self.forced = False
        if type(domain).__name__ == "DummyDomain" and os.environ.get("NVTX_INJECTION64_PATH"):
            forced = _force_domain(DOMAIN)
            if forced is not None:
                domain, self.forced = forced, True
        if hasattr(domain, "push_range"):  # nvtx >= 0.2.12
            push_range, pop_range = domain.push_range, domain.pop_range
        else:  # nvtx <= 0.2.11: module-level functions taking the domain handle
            from nvtx._lib import pop_range as _pop  # type: ignore[import-not-found]
            from nvtx._lib import push_range as _push

            push_range = functools.partial(_push, domain=domain.handle)
            pop_range = functools.partial(_pop, domain.handle)
        # payload -> scope -> name -> attributes (built once each)
        attrs: List[Dict[Optional[str], Dict[str, Any]]] = [{}, {}, {}, {}]
        empty: Dict[str, Any] = {}

        def attributes(
            name: str, scope: Optional[str] = None, region: bool = False, cpu: bool = False
        ) -> Any:
            payload = PAYLOAD_REGION * region + PAYLOAD_CPU * cpu
            per = attrs[payload].setdefault(scope, {})
            a = per.get(name)
            if a is None:
                a = per[name] = domain.get_event_attributes(
                    message=name, color=color_of(name), category=scope, payload=payload
                )
            return a

        def push(
            name: str, scope: Optional[str] = None, region: bool = False, cpu: bool = False
        ) -> None:
            a = attrs[region + 2 * cpu].get(scope, empty).get(name)
            push_range(a if a is not None else attributes(name, scope, region, cpu))

        try:
            from nvtx._lib import mark as _mark  # type: ignore[import-not-found]
        except ImportError:  # another nvtx layout: no marks
            _mark = None

        def mark(text: str) -> None:
            a = domain.get_event_attributes(message=text, color=color_of(text))
            if hasattr(domain, "mark"):  # nvtx >= 0.2.12 (its DummyDomain too: a no-op)
                domain.mark(a)
            elif _mark is not None and hasattr(domain, "handle"):
                _mark(a, domain.handle)

        # One attributes object for the time mark, its payload set per call (a lock: two
        # threads setting it at once would swap their payloads).
        time_attrs = domain.get_event_attributes(
            message=TIME_MARK, color=color_of(TIME_MARK), payload=0
        )
        time_lock = threading.Lock()
        mark_time: Any = None
        if hasattr(domain, "mark"):  # nvtx >= 0.2.12
            mark_time = domain.mark
        elif _mark is not None and hasattr(domain, "handle"):
            mark_time = functools.partial(_mark, domain=domain.handle)

        def timed(ns: int) -> None:
            with time_lock:
                time_attrs.payload = ns
                mark_time(time_attrs)

        tool_attrs: Dict[str, Any] = {}

        def push_tool(name: str) -> bool:
            a = tool_attrs.get(name)
            if a is None:
                a = tool_attrs[name] = domain.get_event_attributes(
                    message=name, color=color_of(name), payload=PAYLOAD_TOOL | PAYLOAD_CPU
                )
            push_range(a)
            return True

        self.attributes = attributes
        self.push_tool = push_tool
        self.push = push
        self.pop = pop_range
        self.mark = mark
        if mark_time is not None and time_attrs is not None:  # (a DummyDomain's are None)
            self.timed = timed


class _TorchNvtxBackend(NvtxBackend):
    """``torch.cuda.nvtx`` (CORE ``RangePushA``/``RangePop``), available in CUDA builds:
    plain ranges, without a domain or colour."""

    name = "torch"

    def __init__(self) -> None:
        super().__init__()
        range_push = torch.cuda.nvtx.range_push

        def push(
            name: str, scope: Optional[str] = None, region: bool = False, cpu: bool = False
        ) -> None:
            range_push(name)

        self.push = push
        self.pop = torch.cuda.nvtx.range_pop


_FORCED: Dict[str, Any] = {}  # the domains _force_domain made, by name


def _force_domain(name: str) -> Optional[Any]:
    """A real ``nvtx`` Domain even though NVTX says the domain is disabled.

    nvtx >= 0.2.12 asks ``nvtxDomainIsEnabled`` (an NVTX payload-extension call) when it
    creates a domain, and returns a no-op ``DummyDomain`` if the answer is 0. Nsight Systems
    2022.4 (Debian bookworm's ``nsight-systems``) attaches through
    ``NVTX_INJECTION64_PATH`` and exports ``InitializeInjectionNvtxExtension``, but leaves
    that call unhandled in a way the newer NVTX headers read as "disabled": every range of
    such an nvtx version is dropped under that nsys. When a tool is attached
    (``NVTX_INJECTION64_PATH`` is set) we build the Domain without that check; the tool
    then receives the pushes as with nvtx <= 0.2.11.
    """
    if name in _FORCED:  # one per process: its categories' ids stay those already named
        return _FORCED[name]
    try:
        from nvtx._lib import lib  # type: ignore[import-not-found]

        domain = object.__new__(lib.Domain)
        domain.handle = lib.DomainHandle(name)
        lib.Domain.__init__(domain, name)
        _FORCED[name] = domain
        return domain
    except Exception as exc:  # another nvtx layout: keep the dummy domain
        logger.debug("could not force an nvtx domain: %s", exc)
        return None


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


def tool_attached() -> bool:
    """Whether an NVTX tool can receive ranges in this process.

    Tools (Nsight Systems, Nsight Compute) attach when the process starts, through the
    environment variable ``NVTX_INJECTION64_PATH``; without it nothing can ever receive a
    range, and every NVTX call is a no-op in C that still costs a Python call per push and
    per pop: the ``auto`` backend is then ``none``.
    """
    return bool(os.environ.get("NVTX_INJECTION64_PATH") or os.environ.get("NVTX_INJECTION32_PATH"))


def _pick(choice: str) -> NvtxBackend:
    if choice == "auto":
        if not tool_attached():
            return NvtxBackend()  # nothing could see the ranges: push none
        return make_backend(None)
    return make_backend(choice)


#: The backend in use, and its push and pop (read by every step's lifecycle).
backend: NvtxBackend = NvtxBackend()
push, pop, timed = backend.push, backend.pop, backend.timed
#: Whether ranges are pushed at all (the backend is not ``none``).
live = False


def use_nvtx(choice: str) -> str:
    """Switch NVTX backends (``auto``, ``nvtx``, ``torch`` or ``none``: see
    :func:`~instrumented_convs.configure`); returns the name of the backend now in use.
    ``auto`` is the ``nvtx`` package (else ``torch.cuda.nvtx``) when an NVTX tool is
    attached to the process, else ``none``."""
    global backend, push, pop, timed, live
    backend = _pick(choice)
    push, pop, timed = backend.push, backend.pop, backend.timed
    live = backend.name != "none"
    if speedups is not None:  # the fast path pushes through the backend's own calls
        mark = None if timed is _noop_timed else timed
        speedups.set_nvtx_live(live, backend.push, backend.pop, mark, TIME_FLOOR_NS)
    return backend.name


#: The start of the mark that says the switches (:func:`mark_settings`; report.nsys reads it).
SETTINGS_MARK = "settings: "
#: The mark of ``registry.reset()`` (:func:`mark_reset`).
RESET_MARK = "reset"


def mark_settings(**settings: Any) -> None:
    """An NVTX mark in our domain saying what shapes the ranges (``backward_every=16``...),
    so that a report read back says which rows hold only some calls."""
    if live:
        backend.mark(SETTINGS_MARK + " ".join(f"{k}={v}" for k, v in settings.items()))


def mark_reset() -> None:
    """An NVTX mark in our domain where the registry was reset: a report read back drops the
    ranges that ended before it, as the process dropped their times."""
    if live:
        backend.mark(RESET_MARK)


switches.nvtx = use_nvtx(NVTX_REQUEST)  # what the environment asks (INSTRUMENTED_CONVS_NVTX)
switches.apply()
