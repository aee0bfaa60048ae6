"""CUDA event pairs waiting to be read, folded into their entries lazily: nothing here calls
``torch.cuda.synchronize()``, so the program keeps its overlap. Each pair's host time and
lag (:class:`DeviceLag`) are folded beside its device time (docs/host_device.md)."""

from __future__ import annotations

from collections import deque
from typing import Any, Callable, Deque, Dict, Optional, Tuple

from ..native import speedups
from .events import EventPool, GpuSlot, events

#: A call whose end lag is under this (ns) ended with the device caught up with the host:
#: a launch's own latency is well under it.
LAG_FLOOR_NS = 50_000
#: The lag's zero is the least difference seen in the last :data:`LAG_BUCKETS` buckets of
#: this many ns of CPU time; a reference event older than one bucket is replaced.
LAG_BUCKET_NS = 1_000_000_000
LAG_BUCKETS = 8
#: An entry's lag (a second read of the driver, as dear as the pair's own) is read for its
#: first :data:`LAG_ALL` pairs, then for one in :data:`LAG_EVERY`; its host time with it.
LAG_ALL = 32
LAG_EVERY = 8

#: One queued pair, as :meth:`PendingTimes.add` takes it: ``(entry, start event, end event,
#: device, sampled, slot, t1, host)``.
Pair = Tuple[Any, Any, Any, int, bool, Optional[GpuSlot], Optional[int], int]
_END = 2  # the end event's place in a Pair
#: What a fold takes: ``(entry, device ns or None, sampled, host ns, lag ns or None)``.
Fold = Callable[[Any, Optional[int], bool, int, Optional[int]], None]


def lag_wanted(entry: Any) -> bool:
    """Whether a pair of ``entry`` has its lag read: its first :data:`LAG_ALL` lags, then where
    its buffer's length is a multiple of :data:`LAG_EVERY` (the C clock's ``lag_wanted``)."""
    buf, dcalls = getattr(entry, "buf", None), getattr(entry, "dcalls", None)
    if type(buf) is not list or type(dcalls) is not int:
        return True
    return dcalls < LAG_ALL or len(buf) % LAG_EVERY == 0


class DeviceLag:
    """How far one device was behind the host when an event ran (the twin of the C clock's).

    An event's device time is read against a reference event (replaced every bucket, so the
    float milliseconds stay exact); less the CPU time it was recorded, that is the device's
    lead on the host plus a constant. The constant is the least such difference in the last
    :data:`LAG_BUCKETS` buckets: the moment the device was least behind counts as caught up.
    """

    __slots__ = ("ref", "ref_dev", "ref_t", "buckets", "pool", "device")

    def __init__(self, pool: EventPool, device: int) -> None:
        """No reference yet; events given up go back to ``pool``'s list of ``device``."""
        self.ref: Any = None
        self.ref_dev = 0.0
        self.ref_t = 0
        self.buckets: Dict[int, float] = {}  # bucket -> least difference
        self.pool, self.device = pool, device

    def lag(self, end: Any, t1: int) -> Tuple[Optional[int], bool]:
        """The lag (ns) of ``end``, recorded at CPU time ``t1``, or None where unreadable;
        and whether ``end`` became the reference (then it is kept, not pooled)."""
        kept = False
        if self.ref is None:
            self.ref, self.ref_dev, self.ref_t, kept = end, 0.0, t1, True
            ms = 0.0
        else:
            try:
                ms = self.ref.elapsed_time(end)
            except RuntimeError:
                return None, False
        x = self.ref_dev + ms * 1e6 - t1
        b = t1 // LAG_BUCKET_NS
        buckets = self.buckets
        least = buckets.get(b)
        if least is None or x < least:
            buckets[b] = x
        if len(buckets) > LAG_BUCKETS:
            for k in [k for k in buckets if k <= b - LAG_BUCKETS]:
                del buckets[k]
        zero = min(v for k, v in buckets.items() if b - LAG_BUCKETS < k <= b)
        if not kept and t1 - self.ref_t > LAG_BUCKET_NS:  # a new reference
            self.pool.put(self.ref, self.device)
            self.ref, self.ref_dev, self.ref_t, kept = end, self.ref_dev + ms * 1e6, t1, True
        return int(round(x - zero)), kept


class PendingTimes:
    """CUDA event pairs waiting to be read, folded into their registry entries lazily.

    ``add(entry, start, end, device, sampled)`` is the hot path: an append (``start`` and
    ``end`` are events, taken from the pool of ``device``; ``sampled`` is handed to the fold
    with the duration). When more than ``poll_at`` pairs are pending, the oldest ones whose
    end event has completed (``query()``, which never blocks) are folded into their entries.
    Only when ``hard_limit`` pairs are pending does it wait, and then only for the oldest
    pair: that bounds memory in a program that never lets the GPU catch up, without a
    device-wide synchronize. After a poll the next waits for a quarter of ``poll_at`` more
    pairs: a device that is behind is not asked at every step. ``drain()`` (from
    ``summary()``) waits for each remaining pair and folds everything. A pair whose time
    cannot be read (its events were recorded on different streams that did not meet, say) is
    folded as untimed.
    """

    __slots__ = ("_queue", "_poll_at", "_hard_limit", "_next_poll", "pool", "_fold", "_lags")

    def __init__(
        self,
        fold: Fold,
        pool: Optional[EventPool] = None,
        poll_at: int = 2048,
        hard_limit: int = 65536,
    ) -> None:
        """Create an empty queue that calls ``fold(entry, ns or None, sampled, host, lag)``
        per pair (see :data:`Fold`).

        Resolved events go back to ``pool`` (default: the process-wide :data:`events`).
        """
        self._queue: Deque[Pair] = deque()
        self._fold = fold
        self.pool = events if pool is None else pool
        self._lags: Dict[int, DeviceLag] = {}
        self._poll_at, self._hard_limit = poll_at, hard_limit
        self._next_poll = poll_at
        self._tell_c()

    def _tell_c(self) -> None:
        self._next_poll = self._poll_at
        if speedups is not None and self.pool is events:
            speedups.cuda_limits(self._poll_at, self._hard_limit)
            speedups.cuda_lag_floor(LAG_FLOOR_NS, LAG_BUCKET_NS, LAG_ALL, LAG_EVERY)

    @property
    def poll_at(self) -> int:
        """Pending pairs at which the finished ones are folded (both queues)."""
        return self._poll_at

    @poll_at.setter
    def poll_at(self, n: int) -> None:
        self._poll_at = n
        self._tell_c()

    @property
    def hard_limit(self) -> int:
        """Pending pairs at which the oldest is waited for (both queues)."""
        return self._hard_limit

    @hard_limit.setter
    def hard_limit(self, n: int) -> None:
        self._hard_limit = n
        self._tell_c()

    def _native(self) -> bool:
        return speedups is not None and self.pool is events

    def __len__(self) -> int:
        """Number of pairs not yet folded (the C clock's queue included)."""
        return len(self._queue) + (speedups.cuda_pending() if self._native() else 0)

    def add(
        self,
        entry: Any,
        start: Any,
        end: Any,
        device: int,
        sampled: bool = False,
        slot: Optional[GpuSlot] = None,
        t1: Optional[int] = None,
        host: int = 0,
    ) -> None:
        """Queue a recorded pair, whose events go back to ``device``'s free list once read;
        poll (never block) when too many are pending.

        ``slot``: the call's place on the timeline, whose ``start_ms`` and ``end_ms`` are
        set when the pair is read (before its events go back to the pool). ``t1``: the CPU
        clock when ``end`` was recorded, ``host``: the call's host time (ns); without
        ``t1`` no lag is read. The C clock's handles (ints) go to its own queue.
        """
        if type(start) is int:
            speedups.cuda_pend(entry, start, end, device, t1 or 0, host, sampled, slot)
            return
        queue = self._queue
        queue.append((entry, start, end, device, sampled, slot, t1, host))
        if len(queue) >= self._next_poll:
            self.poll()

    def _resolve(self, item: Pair) -> None:
        entry, start, end, device, sampled, slot, t1, host = item
        try:
            # elapsed_time is in milliseconds (a float: CUDA documents about half a
            # microsecond of resolution); store integer ns.
            ns = int(round(start.elapsed_time(end) * 1e6))
        except RuntimeError:  # unreadable pair: count the call, drop the events
            self._fold(entry, None, sampled, host, None)
            return
        if slot is not None:
            try:
                ref = slot.ref
                slot.start_ms, slot.end_ms = ref.elapsed_time(start), ref.elapsed_time(end)
            except RuntimeError:  # the timeline shows this call on the CPU track only
                pass
        lag, kept = None, False
        if t1 is not None:
            lags = self._lags.get(device)
            if lags is None:
                lags = self._lags[device] = DeviceLag(self.pool, device)
            if lags.ref is None or lag_wanted(entry):
                lag, kept = lags.lag(end, t1)
        self._fold(entry, ns, sampled, host, lag)
        self.pool.put(start, device)
        if not kept:
            self.pool.put(end, device)

    def poll(self) -> int:
        """Fold the finished pairs at the front of the queue; return how many were folded."""
        queue = self._queue
        folded = speedups.cuda_poll() if self._native() else 0
        # Pairs on one stream complete in order: stop at the first unfinished one.
        while queue and queue[0][_END].query():
            self._resolve(queue.popleft())
            folded += 1
        while len(queue) >= self._hard_limit:
            item = queue.popleft()
            item[_END].synchronize()  # waits for this one event only, not the whole device
            self._resolve(item)
            folded += 1
        more = max(self._poll_at // 4, 1)
        self._next_poll = min(max(len(queue) + more, self._poll_at), self._hard_limit)
        return folded

    def drain(self) -> int:
        """Wait for every pending pair and fold it; return how many were folded."""
        queue = self._queue
        folded = speedups.cuda_drain() if self._native() else 0
        while queue:
            item = queue.popleft()
            start, end = item[1], item[_END]
            start.synchronize()  # the start too: it may sit on another stream
            end.synchronize()
            self._resolve(item)
            folded += 1
        return folded

    def clear(self) -> None:
        """Forget every pending pair (used by ``registry.reset()``) and the lags' zeros."""
        self._queue.clear()
        self._lags.clear()
        self._next_poll = self._poll_at
        if self._native():
            speedups.cuda_clear()
