"""Clocks: the CPU clock and CUDA events resolved lazily.

Why two clocks: CUDA runs asynchronously, so a CPU clock around a kernel launch measures
the launch, not the kernel. On a CUDA device a step records a pair of CUDA events on the
current stream instead; the pair is kept *pending* and turned into a duration later, at
``summary()`` (which waits only for the newest events) or when too many are pending (then
finished pairs are folded after a non-blocking ``query()``). Nothing here ever calls
``torch.cuda.synchronize()``, so the program keeps its overlap and its speed.
"""
from __future__ import annotations

import time
from collections import deque
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

#: The CPU clock, in integer nanoseconds. Tests replace it through :func:`set_cpu_clock`.
cpu_now: Callable[[], int] = time.perf_counter_ns


def set_cpu_clock(clock: Callable[[], int]) -> Callable[[], int]:
    """Replace the CPU clock (integer nanoseconds) and return the previous one."""
    global cpu_now
    previous, cpu_now = cpu_now, clock
    from . import _step  # the hot path binds the clock as a module global

    _step._cpu_now = clock
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


def _new_cuda_event() -> Any:
    import torch

    return torch.cuda.Event(enable_timing=True)


class PendingTimes:
    """CUDA event pairs waiting to be read, folded into their registry entries lazily.

    ``add(entry, start, end)`` is the hot path: an append (``start`` and ``end`` are
    ``(event, device)`` pairs). When more than ``poll_at`` pairs are pending, the oldest
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
        fold: Callable[[Any, Optional[int]], None],
        pool: EventPool,
        poll_at: int = 2048,
        hard_limit: int = 65536,
    ) -> None:
        """Create an empty queue that calls ``fold(entry, nanoseconds or None)`` per pair."""
        self._queue: Deque[Tuple[Any, Any, Any]] = deque()
        self._fold = fold
        self.pool = pool
        self.poll_at = poll_at
        self.hard_limit = hard_limit

    def __len__(self) -> int:
        """Number of pairs not yet folded."""
        return len(self._queue)

    def add(self, entry: Any, start: Any, end: Any) -> None:
        """Queue a recorded pair; poll (never block) when too many are pending."""
        queue = self._queue
        queue.append((entry, start, end))
        if len(queue) >= self.poll_at:
            self.poll()

    def _resolve(self, item: Tuple[Any, Any, Any]) -> None:
        entry, (start, key), (end, _) = item
        try:
            # elapsed_time is in milliseconds (float, ~0.5 us resolution); store integer ns.
            ns = int(round(start.elapsed_time(end) * 1e6))
        except RuntimeError:  # unreadable pair: count the call, drop the events
            self._fold(entry, None)
            return
        self._fold(entry, ns)
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
