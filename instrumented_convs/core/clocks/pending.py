"""CUDA event pairs waiting to be read, folded into their entries lazily: nothing here calls
``torch.cuda.synchronize()``, so the program keeps its overlap."""

from __future__ import annotations

from collections import deque
from typing import Any, Callable, Deque, Optional, Tuple

from .events import EventPool, GpuSlot, events

#: One queued pair, as :meth:`PendingTimes.add` takes it: ``(entry, start event, end event,
#: device, sampled, slot)``.
Pair = Tuple[Any, Any, Any, int, bool, Optional[GpuSlot]]
_END = 2  # the end event's place in a Pair


class PendingTimes:
    """CUDA event pairs waiting to be read, folded into their registry entries lazily.

    ``add(entry, start, end, device, sampled)`` is the hot path: an append (``start`` and
    ``end`` are events, taken from the pool of ``device``; ``sampled`` is handed to the fold
    with the duration). When more than ``poll_at`` pairs are pending, the oldest ones whose
    end event has completed (``query()``, which never blocks) are folded into their entries.
    Only when ``hard_limit`` pairs are pending does it wait, and then only for the oldest
    pair: that bounds memory in a program that never lets the GPU catch up, without a
    device-wide synchronize. ``drain()`` (from ``summary()``) waits for each
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
        self._queue: Deque[Pair] = deque()
        self._fold = fold
        self.pool = events if pool is None else pool
        self.poll_at = poll_at
        self.hard_limit = hard_limit

    def __len__(self) -> int:
        """Number of pairs not yet folded."""
        return len(self._queue)

    def add(
        self,
        entry: Any,
        start: Any,
        end: Any,
        device: int,
        sampled: bool = False,
        slot: Optional[GpuSlot] = None,
    ) -> None:
        """Queue a recorded pair, whose events go back to ``device``'s free list once read;
        poll (never block) when too many are pending.

        ``slot``: the call's place on the timeline, whose ``start_ms`` and ``end_ms`` are
        set when the pair is read (before its events go back to the pool).
        """
        queue = self._queue
        queue.append((entry, start, end, device, sampled, slot))
        if len(queue) >= self.poll_at:
            self.poll()

    def _resolve(self, item: Pair) -> None:
        entry, start, end, device, sampled, slot = item
        try:
            # elapsed_time is in milliseconds (a float: CUDA documents about half a
            # microsecond of resolution); store integer ns.
            ns = int(round(start.elapsed_time(end) * 1e6))
        except RuntimeError:  # unreadable pair: count the call, drop the events
            self._fold(entry, None, sampled)
            return
        if slot is not None:
            try:
                ref = slot.ref
                slot.start_ms, slot.end_ms = ref.elapsed_time(start), ref.elapsed_time(end)
            except RuntimeError:  # the timeline shows this call on the CPU track only
                pass
        self._fold(entry, ns, sampled)
        self.pool.put(start, device)
        self.pool.put(end, device)

    def poll(self) -> int:
        """Fold the finished pairs at the front of the queue; return how many were folded."""
        queue = self._queue
        folded = 0
        # Pairs on one stream complete in order: stop at the first unfinished one.
        while queue and queue[0][_END].query():
            self._resolve(queue.popleft())
            folded += 1
        while len(queue) >= self.hard_limit:
            item = queue.popleft()
            item[_END].synchronize()  # waits for this one event only, not the whole device
            self._resolve(item)
            folded += 1
        return folded

    def drain(self) -> int:
        """Wait for every pending pair and fold it; return how many were folded."""
        queue = self._queue
        folded = 0
        while queue:
            item = queue.popleft()
            _, start, end, _, _, _ = item
            start.synchronize()  # the start too: it may sit on another stream
            end.synchronize()
            self._resolve(item)
            folded += 1
        return folded

    def clear(self) -> None:
        """Forget every pending pair (used by ``registry.reset()``)."""
        self._queue.clear()
