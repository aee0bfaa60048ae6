"""CUDA events for steps: a pool of timing events per device, and the current stream read
cheaply (torch's ``current_stream()`` builds a ``Stream`` object at every call)."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

import torch


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
        return previous


def _new_cuda_event() -> Any:
    return torch.cuda.Event(enable_timing=True)


#: The process-wide pool of CUDA events: steps take events from it, resolved pairs go back.
events = EventPool(_new_cuda_event)


#: torch's own reader of a device's current stream: ``(stream id, device, device type)``, a
#: C call (``None`` in a CPU-only build of torch).
_stream_data: Optional[Callable[[int], Tuple[int, int, int]]] = getattr(
    torch._C, "_cuda_getCurrentStream", None
)
_real_current_stream = torch.cuda.current_stream  # tests put fakes in torch.cuda's place
_make_stream: Callable[..., Any] = torch.cuda.Stream
_streams: Dict[Tuple[int, int, int], Any] = {}  # what _stream_data gave -> its Stream
_STREAMS_KEPT = 256  # more: the cache is emptied (a program making external streams)
_streams_ready = False  # True once torch.cuda.current_stream has run here (its lazy init)


def current_stream(dev: int) -> Any:
    """``torch.cuda.current_stream(dev)``, cheaper: the same stream object for the same
    stream, read anew at every call (a ``with torch.cuda.stream(s)`` is seen at once).

    torch's own builds a ``Stream`` at each call, under a device guard: 2.1 us a call on an
    H100's host, and ``event.record()`` without a stream, which calls it, 10.1 us (against
    3.1 us for ``event.record(stream)``; benchmarks/cuda_step.py, 2026-11-26); a step makes
    two. A ``Stream`` is only its id, device and type, so the one made the first time
    stands for every later call that reads the same three.
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
        stream = _streams[data] = _make_stream(
            stream_id=data[0], device_index=data[1], device_type=data[2]
        )
    return stream


def record_event(dev: Optional[int]) -> Tuple[Any, Any]:
    """A pooled CUDA event recorded now on the current stream of ``dev`` (None: current device).

    Returns ``(event, pool key)``: the key is the device the event must go back to.
    """
    key = torch.cuda.current_device() if dev is None else dev
    ev = events.get(key)
    ev.record(current_stream(key))
    return ev, key
