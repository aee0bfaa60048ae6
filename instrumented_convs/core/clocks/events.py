"""Clocks: the CPU clock and CUDA events resolved lazily.

Why two clocks: CUDA runs asynchronously, so a CPU clock around a kernel launch measures
the launch, not the kernel. On a CUDA device a step records a pair of CUDA events on the
current stream instead; the pair is kept *pending* and turned into a duration later, at
``summary()`` (which waits only for the newest events) or when too many are pending (then
finished pairs are folded after a non-blocking ``query()``). Nothing here ever calls
``torch.cuda.synchronize()``, so the program keeps its overlap and its speed.

This module is at the bottom of the house: it imports nothing from the package but the
optional C extension (:mod:`.native`), which it tells of a new CPU clock. Python steps read
:data:`cpu_now` through the module at each call.
It also decides which clock a step uses (:func:`auto_cuda`, :func:`device_is_cuda`) and
holds the process-wide pool of CUDA events (:data:`events`).
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

import torch

from .native import speedups

#: The CPU clock, in integer nanoseconds. Replace it with :func:`set_cpu_clock` only (tests:
#: :mod:`instrumented_convs.testing`): Python steps read ``clock.cpu_now`` at each call, the
#: C fast path keeps the function :func:`set_cpu_clock` last told it of.
cpu_now: Callable[[], int] = time.perf_counter_ns


def set_cpu_clock(clock: Callable[[], int]) -> Callable[[], int]:
    """Replace the CPU clock (integer nanoseconds) and return the previous one."""
    global cpu_now
    previous, cpu_now = cpu_now, clock
    if speedups is not None:
        speedups.set_clock(clock)
    return previous


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


_cuda_seen = False  # becomes True once CUDA is initialised in this process


def auto_cuda() -> bool:
    """Whether a top-level step with no device should use the CUDA clock (CUDA initialised)."""
    global _cuda_seen
    if not _cuda_seen:
        _cuda_seen = torch.cuda.is_initialized()
    return _cuda_seen


def device_is_cuda(device: Any) -> Optional[bool]:
    """Whether ``device`` (a ``torch.device``, string or index) is a CUDA device; None: unknown."""
    if device is None:
        return None
    if isinstance(device, torch.device):
        return device.type == "cuda"
    return torch.device(device).type == "cuda"


def device_index(device: Any) -> Optional[int]:
    """The index of a CUDA ``device`` (None: the current device)."""
    if isinstance(device, int):
        return device
    d = device if isinstance(device, torch.device) else torch.device(device)
    return d.index


class PendingTimes:
    """CUDA event pairs waiting to be read, folded into their registry entries lazily.

    ``add(entry, start, end, sampled)`` is the hot path: an append (``start`` and ``end`` are
    ``(event, device)`` pairs; ``sampled`` is handed to the fold with the duration). When
    more than ``poll_at`` pairs are pending, the oldest
    ones whose end event has completed (``query()``, which never blocks) are folded into
    their entries. Only when ``hard_limit`` pairs are pending does it wait, and then only
    for the oldest pair: that bounds memory in a program that never lets the GPU catch up,
    without a device-wide synchronize. ``drain()`` (from ``summary()``) waits for each
    remaining pair and folds everything. A pair whose time cannot be read (its events were
    recorded on different streams that did not meet, say) is folded as untimed.
    """

    __slots__ = ("_queue", "poll_at", "hard_limit", "pool", "_fold")

    def __init__(
        self,
        fold: Callable[[Any, Optional[int], bool], None],
        pool: Optional[EventPool] = None,
        poll_at: int = 2048,
        hard_limit: int = 65536,
    ) -> None:
        """Create an empty queue that calls ``fold(entry, nanoseconds or None, sampled)`` per pair.

        Resolved events go back to ``pool`` (default: the process-wide :data:`events`).
        """
        self._queue: Deque[Tuple[Any, Any, Any, bool, Any]] = deque()
        self._fold = fold
        self.pool = events if pool is None else pool
        self.poll_at = poll_at
        self.hard_limit = hard_limit

    def __len__(self) -> int:
        """Number of pairs not yet folded."""
        return len(self._queue)

    def add(
        self, entry: Any, start: Any, end: Any, sampled: bool = False, slot: Any = None
    ) -> None:
        """Queue a recorded pair; poll (never block) when too many are pending.

        ``slot``: the timeline's ``[reference event, None, None, ...]`` of this call, whose
        two Nones become the start's and the end's milliseconds after the reference event
        when the pair is read (before its events go back to the pool).
        """
        queue = self._queue
        queue.append((entry, start, end, sampled, slot))
        if len(queue) >= self.poll_at:
            self.poll()

    def _resolve(self, item: Tuple[Any, Any, Any, bool, Any]) -> None:
        entry, (start, key), (end, _), sampled, slot = item
        try:
            # elapsed_time is in milliseconds (float, ~0.5 us resolution); store integer ns.
            ns = int(round(start.elapsed_time(end) * 1e6))
        except RuntimeError:  # unreadable pair: count the call, drop the events
            self._fold(entry, None, sampled)
            return
        if slot is not None:
            try:
                ref = slot[0]
                slot[1], slot[2] = ref.elapsed_time(start), ref.elapsed_time(end)
            except RuntimeError:  # the timeline shows this call on the CPU track only
                pass
        self._fold(entry, ns, sampled)
        self.pool.put(start, key)
        self.pool.put(end, key)

    def poll(self) -> int:
        """Fold the finished pairs at the front of the queue; return how many were folded."""
        queue = self._queue
        folded = 0
        # Pairs on one stream complete in order: stop at the first unfinished one.
        while queue and queue[0][2][0].query():
            self._resolve(queue.popleft())
            folded += 1
        while len(queue) >= self.hard_limit:
            item = queue.popleft()
            item[2][0].synchronize()  # waits for this one event only, not the whole device
            self._resolve(item)
            folded += 1
        return folded

    def drain(self) -> int:
        """Wait for every pending pair and fold it; return how many were folded."""
        queue = self._queue
        folded = 0
        while queue:
            item = queue.popleft()
            item[1][0].synchronize()  # the start too: it may sit on another stream
            item[2][0].synchronize()
            self._resolve(item)
            folded += 1
        return folded

    def clear(self) -> None:
        """Forget every pending pair (used by ``registry.reset()``)."""
        self._queue.clear()
