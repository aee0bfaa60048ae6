"""CUDA events for steps: the C clock (the driver's events, as handles) where the extension
is built, else a pool of ``torch.cuda.Event`` per device with the current stream read
cheaply; and a CUDA-timed call's place on the timeline (:class:`GpuSlot`)."""

from __future__ import annotations

import logging
import os
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from ..native import private, speedups

logger = logging.getLogger(__name__)


class GpuSlot:
    """A CUDA-timed call's place on the timeline's GPU track: its times after its device's
    reference event, filled in when its pair of events is read (``PendingTimes``)."""

    __slots__ = ("ref", "start_ms", "end_ms", "ref_ns")

    def __init__(self, ref: Any, ref_ns: int) -> None:
        """The slot of a call on the device whose reference event ``ref`` was recorded when
        the CPU clock read ``ref_ns``; its times not read yet."""
        self.ref: Any = ref  #: the device's reference event, recorded before its first pair
        self.start_ms: Optional[float] = None  #: ms from ``ref`` to the call's start event
        self.end_ms: Optional[float] = None  #: ms from ``ref`` to the call's end event
        self.ref_ns: int = ref_ns  #: the CPU clock (ns) when ``ref`` was recorded


class EventPool:
    """Free lists of timing-enabled CUDA events, one per device, so a step does not create two
    events per call (an event is bound to the device it is first recorded on)."""

    __slots__ = ("_free", "_factory")

    def __init__(self, factory: Callable[[], Any]) -> None:
        """Create empty free lists; new events come from ``factory()``."""
        self._free: Dict[Any, List[Any]] = {}
        self._factory = factory

    def get(self, key: Any = None) -> Any:
        """Return an unused event for device ``key`` (a recycled one when possible)."""
        try:
            return self._free[key].pop()
        except (KeyError, IndexError):  # none free (or another thread took the last one)
            return self._factory()

    def put(self, event: Any, key: Any = None) -> None:
        """Give an event back to device ``key``'s list once its time has been read."""
        free = self._free.get(key)
        if free is None:
            free = self._free.setdefault(key, [])
        free.append(event)

    def available(self, key: Any = None) -> int:
        """How many unused events device ``key``'s list holds."""
        return len(self._free.get(key, ()))

    def reset(self, factory: Optional[Callable[[], Any]] = None) -> Callable[[], Any]:
        """Drop every free event; with ``factory``, make new events with it from now on.

        Returns the factory in use before (tests swap in fake events this way).
        """
        previous = self._factory
        self._free = {}
        if factory is not None:
            self._factory = factory
            use_twin()  # fake events: the twin; the real ones again: decided anew
        return previous


def _new_cuda_event() -> Any:
    return torch.cuda.Event(enable_timing=True)


#: The process-wide pool of CUDA events: steps take events from it, resolved pairs go back.
events = EventPool(_new_cuda_event)

#: Whether CUDA steps use the C clock (decided at the first CUDA step: :func:`native`).
_native: Optional[bool] = None
#: The driver library the C clock loads (a test's stand-in; default ``libcuda.so.1``).
DRIVER_ENV = "INSTRUMENTED_CONVS_CUDA_DRIVER"
_get_device: Callable[[], int] = torch.cuda.current_device  # the C clock's reader, once in use
_folds: Optional[Tuple[Callable[..., None], type]] = None  # bind_folds()


def native() -> bool:
    """Whether CUDA steps are timed by the C clock: the extension is built, the driver
    loads, torch's raw stream reader exists, and the events are the real ones (a test's
    fake events, :func:`~instrumented_convs.testing.cuda_event_factory`, use the twin)."""
    if _native is None:
        _decide()
    return bool(_native)


def _decide() -> None:
    global _native
    if not torch.cuda.is_initialized():  # decided at a CUDA step once CUDA is up
        return
    _native = False
    if speedups is None or events._factory is not _new_cuda_event:
        return
    raw = private.find("_C._cuda_getCurrentRawStream")
    get_device = private.find("_C._cuda_getDevice")
    if raw is None or get_device is None:
        return
    if not private.probe("raw_stream", lambda: private.raw_stream_check(get_device, raw)):
        return
    why = speedups.cuda_load(os.environ.get(DRIVER_ENV) or None)
    if why is not None:
        logger.debug("instrumented_convs: CUDA steps use torch's events: %s", why)
        return
    use_driver(get_device, raw)


def use_driver(get_device: Callable[[], int], raw_stream: Callable[[int], int]) -> None:
    """Time CUDA steps with the C clock of the driver :func:`speedups.cuda_load` loaded,
    reading the current device and a device's current raw stream with these two calls
    (torch's; a test's stand-ins)."""
    global _native, _get_device
    if _folds is None:
        raise RuntimeError("instrumented_convs: the registry has not bound its folds")
    speedups.cuda_bind(get_device, raw_stream, *_folds)
    speedups.cuda_native(True)
    _get_device = get_device
    _native = True


def bind_folds(fold_device: Callable[..., None], entry_type: type) -> None:
    """What the C clock folds a resolved pair with: the registry's ``fold_device`` for the
    uncommon cases, and the ``Entry`` type whose slots it adds to (the registry calls it)."""
    global _folds
    _folds = (fold_device, entry_type)


def use_twin() -> None:
    """Time CUDA steps with ``torch.cuda.Event`` objects again (decided anew at the next
    CUDA step unless fake events are in use)."""
    global _native
    if speedups is not None:
        speedups.cuda_native(False)
    _native = None


#: torch's own reader of a device's current stream: ``(stream id, device, device type)``, a
#: C call (``None`` in a CPU-only build of torch).
_stream_data: Optional[Callable[[int], Tuple[int, int, int]]] = private.find(
    "_C._cuda_getCurrentStream"
)
_real_current_stream = torch.cuda.current_stream  # tests put fakes in torch.cuda's place
_streams: Dict[Tuple[int, int, int], Any] = {}  # what _stream_data gave -> its Stream
_STREAMS_KEPT = 256  # more: the cache is emptied (a program making external streams)
_streams_ready = False  # True once torch.cuda.current_stream has run here (its lazy init)


def current_stream(dev: int) -> Any:
    """``torch.cuda.current_stream(dev)``, cheaper: the same stream object for the same
    stream, read anew at every call (a ``with torch.cuda.stream(s)`` is seen at once).

    torch's own builds a ``Stream`` at each call, under a device guard, and
    ``event.record()`` without a stream calls it: that costs a CUDA step more than
    recording on a stream given (benchmarks/cuda_step.py; docs/performance.md has the
    figures), and a step records two events. A ``Stream`` is only its id, device and type,
    so the one made the first time stands for every later call that reads the same three.
    """
    global _streams_ready
    if (
        not _streams_ready
        or _stream_data is None
        or (torch.cuda.current_stream is not _real_current_stream)
    ):
        _streams_ready = _stream_data is not None
        return torch.cuda.current_stream(dev)
    data = _stream_data(dev)
    stream = _streams.get(data)
    if stream is None:
        if len(_streams) >= _STREAMS_KEPT:
            _streams.clear()
        stream = _streams[data] = torch.cuda.Stream(
            stream_id=data[0], device_index=data[1], device_type=data[2]
        )
    return stream


def current_device() -> int:
    """The current CUDA device's index (the C clock's reader where it is in use)."""
    return _get_device() if native() else torch.cuda.current_device()


def give_back(device: int, event: Any) -> None:
    """Return an unread start event to ``device``'s pool (its step ended untimed)."""
    if type(event) is int:
        speedups.cuda_put(device, event)
    else:
        events.put(event, device)


def record_event(device: int) -> Any:
    """A CUDA event recorded now on the current stream of ``device`` (an index: the key of
    the pool it goes back to): the C clock's handle (an int; None while the stream captures
    a CUDA graph), or a pooled ``torch.cuda.Event``. A driver error raises RuntimeError."""
    if native():
        return speedups.cuda_record(device)
    ev = events.get(device)
    ev.record(current_stream(device))
    return ev
