"""The device time of each NVTX range of a report, from its CUDA activity: the kernels, copies
and memsets that the CUDA API calls made on the range's thread, inside its interval, launched.

This is how Nsight Systems projects an NVTX range onto the GPU: an API call and the activity
it launched share a correlation id (per process), and a range owns the calls of its own thread
that start within it, so a range covers what its nested ranges launched, but not what another
thread launched meanwhile; a range nested under it on another thread (a backward on
autograd's thread) brings its own.
"""

from __future__ import annotations

import bisect
import sqlite3
from dataclasses import dataclass
from itertools import accumulate
from typing import Dict, List, Optional, Sequence, Set, Tuple

from .ranges import Range, require, tables

__all__ = ["RUNTIME", "ACTIVITIES", "LAG_FLOOR_NS", "DeviceTime", "has_cuda", "device_times", "lag"]

#: A call whose work ended less than this after its range (ns) ended with the device caught
#: up: the in-process clock's floor (core.clocks.pending.LAG_FLOOR_NS; a test keeps them one).
LAG_FLOOR_NS = 50_000

#: The CUDA API calls (runtime and driver) of a report.
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
#: The device activity tables: kernels, memory copies, memsets.
ACTIVITIES = (
    "CUPTI_ACTIVITY_KIND_KERNEL",
    "CUPTI_ACTIVITY_KIND_MEMCPY",
    "CUPTI_ACTIVITY_KIND_MEMSET",
)
#: The columns each table needs (``globalPid`` is used where an activity table has it).
RUNTIME_NEEDS = ("start", "globalTid", "correlationId")
ACTIVITY_NEEDS = ("start", "end", "correlationId")
#: The key of a call or an activity in SQL, from its serialized global id (``gid``): its
#: process (bits 24 to 47) above the correlation id (CUPTI's is 32 bits). An activity table
#: without ``globalPid`` (an older schema) keys by the correlation id alone: the pid part 0.
_KEY = "coalesce((((({gid} >> 24) & 16777215) + 1) << 32) + correlationId, correlationId)"

#: The most threads named in one SQL statement (SQLite's oldest limit on parameters is 999).
_FEW_THREADS = 500
#: key -> (first start, last end, busy ns, activities).
_Launched = Dict[int, Tuple[int, int, int, int]]


@dataclass
class DeviceTime:
    """What a range launched on the device: the first activity's start and the last one's end
    (ns, the report's clock), their summed durations (``busy``) and how many (``calls``)."""

    first: int
    last: int
    busy: int
    calls: int

    @property
    def span(self) -> int:
        """From the first activity's start to the last one's end (ns)."""
        return self.last - self.first


def has_cuda(conn: sqlite3.Connection) -> bool:
    """Whether the report holds CUDA API calls and a table of device activity (a report made
    without ``-t cuda``, or by a process that launched nothing, has none)."""
    have = tables(conn)
    return RUNTIME in have and any(t in have for t in ACTIVITIES)


def device_times(conn: sqlite3.Connection, ranges: Sequence[Range]) -> List[Optional[DeviceTime]]:
    """For each range (same order), the device time of the activity launched by the CUDA API
    calls of its thread that start within it, and by its ranges on other threads (a backward
    on autograd's thread, under the ``backward`` the caller waits in; see :func:`_nested`),
    or None where it launched nothing.

    Each table is read once; the calls of a thread are sorted by start and a range's are found
    by bisection. An activity table absent from the report (nsys writes tables lazily) holds
    nothing; a missing ``CUPTI_ACTIVITY_KIND_RUNTIME`` table or column is a
    :class:`~.ranges.ReportError` (check :func:`has_cuda` first)."""
    present = [t for t in ACTIVITIES if t in tables(conn)]
    needed = {RUNTIME: RUNTIME_NEEDS, **{t: ACTIVITY_NEEDS for t in present}}
    require(conn, needed, "device times")
    launched = _launched(conn, present)
    calls = _calls(conn, {r.gtid for r in ranges}, launched)
    out: List[Optional[DeviceTime]] = []
    for r in ranges:
        thread = calls.get(r.gtid)
        if thread is None:
            out.append(None)
            continue
        starts, firsts, lasts, busy, count = thread
        lo = bisect.bisect_left(starts, r.start)
        hi = bisect.bisect_right(starts, r.end)
        if lo >= hi:
            out.append(None)
            continue
        out.append(
            DeviceTime(
                first=min(firsts[lo:hi]),
                last=max(lasts[lo:hi]),
                busy=busy[hi] - busy[lo],
                calls=count[hi] - count[lo],
            )
        )
    return _nested(ranges, out)


def _join(a: Optional[DeviceTime], b: Optional[DeviceTime]) -> Optional[DeviceTime]:
    """Two disjoint sets of activity as one (either may be None)."""
    if a is None or b is None:
        return a or b
    return DeviceTime(
        min(a.first, b.first), max(a.last, b.last), a.busy + b.busy, a.calls + b.calls
    )


def _nested(ranges: Sequence[Range], own: List[Optional[DeviceTime]]) -> List[Optional[DeviceTime]]:
    """Each range's own thread's activity joined with that of its nested ranges on other
    threads (parents come before their children in ``ranges``; a nested range on the same
    thread is inside its parent's interval already, so only what it holds from other
    threads goes up)."""
    extra: List[Optional[DeviceTime]] = [None] * len(ranges)
    total = list(own)
    for i in range(len(ranges) - 1, -1, -1):
        total[i] = _join(own[i], extra[i])
        p = ranges[i].parent
        if p >= 0:
            up = total[i] if ranges[p].gtid != ranges[i].gtid else extra[i]
            extra[p] = _join(extra[p], up)
    return total


def lag(t: DeviceTime, r: Range) -> int:
    """How far the device was behind the host when the range ended: ``max(0, t.last - r.end)``
    (ns). Both times are on the report's single clock (nsys puts the CPU and the GPU on one
    timeline), unlike the in-process device clock, whose zero is calibrated against the host's."""
    return max(0, t.last - r.end)


def _launched(conn: sqlite3.Connection, present: Sequence[str]) -> _Launched:
    """The activities of every table by key (:data:`_KEY`), summed: one API call may launch
    several (a CUDA graph's nodes share its launch's correlation id)."""
    launched: _Launched = {}
    for table in present:
        cols = {row[1] for row in conn.execute(f"PRAGMA table_info('{table}')")}
        key = _KEY.format(gid="globalPid") if "globalPid" in cols else "correlationId"
        rows = conn.execute(
            f"SELECT {key}, start, end FROM {table}"
            " WHERE correlationId IS NOT NULL AND start IS NOT NULL AND end >= start"
        )
        get = launched.get
        for k, first, last in rows:
            had = get(k)
            if had is None:
                launched[k] = (first, last, last - first, 1)
            else:  # a graph's nodes, or the same id in another table (a graph's copy)
                launched[k] = (
                    min(first, had[0]),
                    max(last, had[1]),
                    had[2] + last - first,
                    had[3] + 1,
                )
    return launched


#: A thread's launching calls, sorted by start: starts, each one's first and last activity,
#: and the running sums of busy time and activities (one longer: the sum before each call).
_Thread = Tuple[List[int], List[int], List[int], List[int], List[int]]


def _calls(conn: sqlite3.Connection, gtids: Set[int], launched: _Launched) -> Dict[int, _Thread]:
    """The API calls of the ranges' threads that launched something, by thread."""
    if not gtids or not launched:
        return {}
    by_thread: Dict[int, List[Tuple[int, Tuple[int, int, int, int]]]] = {g: [] for g in gtids}
    seen: Set[int] = set()
    few = len(gtids) <= _FEW_THREADS  # then SQLite leaves out the other threads' calls
    where = f" AND globalTid IN ({','.join('?' * len(gtids))})" if few else ""
    rows = conn.execute(
        f"SELECT globalTid, start, correlationId, {_KEY.format(gid='globalTid')} FROM {RUNTIME}"
        f" WHERE correlationId IS NOT NULL{where} ORDER BY start",
        tuple(gtids) if few else (),
    )
    get = launched.get
    for gtid, start, corr, key in rows:
        act = get(key) or get(corr)  # by process, or by id alone (a table without globalPid)
        if act is None or key in seen or gtid not in by_thread:
            continue
        seen.add(key)  # an id seen twice (a call and the call it made): one activity, once
        by_thread[gtid].append((start, act))
    out: Dict[int, _Thread] = {}
    for gtid, calls in by_thread.items():
        if calls:
            out[gtid] = (
                [s for s, _ in calls],
                [a[0] for _, a in calls],
                [a[1] for _, a in calls],
                list(accumulate((a[2] for _, a in calls), initial=0)),
                list(accumulate((a[3] for _, a in calls), initial=0)),
            )
    return out
