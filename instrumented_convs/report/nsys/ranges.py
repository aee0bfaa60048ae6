"""The NVTX ranges of an Nsight Systems report (its SQLite export): what the report holds is
checked first (tables and columns, which differ between nsys releases), then each range of
ours is read with its thread, process, nesting and layer.

A range is ours when it is in the domain ``instrumented_convs`` (the ``nvtx`` package); a
report whose ranges came through ``torch.cuda.nvtx`` has no domain, and then every range of
the default domain is read. A layer (a step's scope) is the range's NVTX category.
"""

from __future__ import annotations

import bisect
import sqlite3
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Set, Tuple

from ...core.storage.entry import BACKWARD_MARK

__all__ = ["DOMAIN", "ReportError", "Range", "Ranges", "require", "read_ranges", "pid_of"]

#: The NVTX domain of our ranges (core.labels.nvtx.DOMAIN).
DOMAIN = "instrumented_convs"
#: NVTX_EVENTS.eventType of a push/pop range, a start/end range, a domain's creation and a
#: category's name (nsys's ENUM_NSYS_EVENT_TYPE).
PUSH_POP, START_END, DOMAIN_CREATE, CATEGORY_NAME, MARK = 59, 60, 75, 33, 34
#: The start of the mark saying the switches, the mark of a reset, and the mark a range closes
#: with, its payload the step's time by its clock (core.labels.nvtx).
SETTINGS_MARK, RESET_MARK, TIME_MARK = "settings: ", "reset", "time"
#: The payload bits of a region's range and of a step timed on the CPU clock
#: (core.labels.nvtx pushes them).
PAYLOAD_REGION, PAYLOAD_CPU, PAYLOAD_TOOL = 1, 2, 4

#: What every reading needs: table -> columns.
NEEDED = {
    "NVTX_EVENTS": (
        "start",
        "end",
        "eventType",
        "text",
        "textId",
        "globalTid",
        "domainId",
        "category",
    ),
    "StringIds": ("id", "value"),
}


class ReportError(ValueError):
    """A report this version cannot read: the one line says what is missing and why."""


@dataclass
class Range:
    """One range of ours: its times (ns, the report's clock), thread and process, step name
    (the backward mark taken off), whether it is a backward step, its layer (scope), and its
    place in the tree (``parent``: an index into the same list, -1 at the top; ``depth``)."""

    start: int
    end: int
    gtid: int
    name: str
    backward: bool
    scope: Optional[str]
    region: Optional[bool] = None  #: the range's payload says (None: a range that does not)
    cpu: bool = False  #: its step was timed on the CPU clock, not with CUDA events (payload)
    #: the tool's one-time work (payload): a top-level row of its own wherever it ran
    tool: bool = False
    parent: int = -1
    depth: int = 0
    #: the step's time by its own clock, in ns: its closing mark's payload, where the range
    #: holds the tool's time that clock leaves out (None: no mark, the range's duration)
    clocked: Optional[int] = None

    @property
    def duration(self) -> int:
        """The call's time: its closing mark's (the step's clock), else the range's."""
        return self.end - self.start if self.clocked is None else self.clocked

    @property
    def pid(self) -> int:
        """The process id (nsys's serialized global thread id holds it)."""
        return pid_of(self.gtid)


@dataclass
class Ranges:
    """The ranges of a report (sorted by start), whether they came from our domain, the
    process names by pid, the switches each process said it had (its settings marks,
    ``(time, {"backward_every": "16", ...})`` in order), and when each last reset its
    registry."""

    ranges: List[Range]
    domain: bool
    processes: Dict[int, str]
    settings: Dict[int, List[Tuple[int, Dict[str, str]]]]
    resets: Dict[int, int]
    unended: int = 0


def pid_of(gtid: int) -> int:
    """The process id in nsys's serialized global id (bits 24 to 47)."""
    return (gtid >> 24) & 0xFFFFFF


def _columns(conn: sqlite3.Connection, table: str) -> Set[str]:
    return {row[1] for row in conn.execute(f"PRAGMA table_info('{table}')")}


def tables(conn: sqlite3.Connection) -> Set[str]:
    """The report's tables."""
    return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def require(conn: sqlite3.Connection, needed: Dict[str, Sequence[str]], what: str) -> None:
    """A :class:`ReportError` naming the first table or column of ``needed`` the report lacks
    (``what``: what they are needed for)."""
    have = tables(conn)
    for table, cols in needed.items():
        if table not in have:
            raise ReportError(f"the report has no {table} table, needed for {what}")
        missing = [c for c in cols if c not in _columns(conn, table)]
        if missing:
            raise ReportError(
                f"the report's {table} table has no column {', '.join(missing)}, needed for {what}"
                " (another nsys release's schema?)"
            )


def read_ranges(conn: sqlite3.Connection) -> Ranges:
    """Every range of ours, nested: on its own thread by time, and a thread's outermost
    backward range under the deepest range of another thread of its process that holds it in
    time (autograd runs a CUDA backward on a thread of its own, while the caller waits in
    ``backward``). Ranges that never ended (the process stopped inside them) are counted."""
    if "NVTX_EVENTS" not in tables(conn):
        raise ReportError(
            "the report has no NVTX_EVENTS table: it holds no NVTX range (profile with"
            " nsys profile -t nvtx,...)"
        )
    require(conn, NEEDED, "the steps' NVTX ranges")
    # a process names its own domains and categories: each is read per process
    mine = {
        (pid_of(g or 0), d or 0)
        for d, g in conn.execute(
            "SELECT domainId, globalTid FROM NVTX_EVENTS WHERE eventType = ? AND text = ?",
            (DOMAIN_CREATE, DOMAIN),
        )
    }
    domains = sorted({d for _, d in mine})
    ours = bool(domains)
    cats: Dict[Tuple[int, int, int], str] = {}
    for dom, cat, text, g in conn.execute(
        "SELECT domainId, category, text, globalTid FROM NVTX_EVENTS WHERE eventType = ?",
        (CATEGORY_NAME,),
    ):
        cats[(pid_of(g or 0), dom or 0, cat or 0)] = text
    where = (
        f"domainId IN ({','.join('?' * len(domains))})"
        if ours
        else "(domainId IS NULL OR domainId = 0)"
    )
    have = _columns(conn, "NVTX_EVENTS")
    payload = (
        "coalesce(e.uint64Value, e.int64Value)" if {"uint64Value", "int64Value"} <= have else "NULL"
    )
    rows = conn.execute(
        "SELECT e.start, e.end, e.globalTid, coalesce(e.text, s.value), e.domainId, e.category,"
        f" {payload}"
        " FROM NVTX_EVENTS e LEFT JOIN StringIds s ON e.textId = s.id"
        f" WHERE e.eventType IN (?, ?) AND e.end IS NOT NULL AND {where}"
        " ORDER BY e.start, e.end DESC",
        (PUSH_POP, START_END, *domains),
    )
    ranges = []
    for start, end, gtid, text, dom, cat, pay in rows:
        pid = pid_of(gtid or 0)
        if ours and (pid, dom or 0) not in mine:  # another process's domain of that number
            continue
        text = text or ""
        back = text.endswith(BACKWARD_MARK)
        name = text[: -len(BACKWARD_MARK)] if back else text
        scope = cats.get((pid, dom or 0, cat)) if cat else None
        region = None if pay is None or not ours else bool(pay & PAYLOAD_REGION)
        cpu = bool(ours and pay and pay & PAYLOAD_CPU)
        tool = bool(ours and pay and pay & PAYLOAD_TOOL)
        ranges.append(Range(start, end, gtid or 0, name, back, scope, region, cpu, tool=tool))
    if any(r.region for r in ranges):  # a payload seen: a range without one is a step
        for r in ranges:
            r.region = bool(r.region)
    _nest(ranges)
    settings: Dict[int, List[Tuple[int, Dict[str, str]]]] = {}
    resets: Dict[int, int] = {}
    times: List[Tuple[int, int, int]] = []  # (time, thread, ns) of the ranges' closing marks
    if ours:
        for t, gtid, text, dom, pay in conn.execute(
            "SELECT e.start, e.globalTid, coalesce(e.text, s.value), e.domainId,"
            f" {payload} FROM NVTX_EVENTS"
            " e LEFT JOIN StringIds s ON e.textId = s.id"
            f" WHERE e.eventType = ? AND {where} ORDER BY e.start",
            (MARK, *domains),
        ):
            if (pid_of(gtid or 0), dom or 0) not in mine:
                continue
            if text == TIME_MARK:
                if pay is not None:
                    times.append((t, gtid or 0, pay))
            elif text and text.startswith(SETTINGS_MARK):
                pairs = (w.split("=", 1) for w in text[len(SETTINGS_MARK) :].split() if "=" in w)
                settings.setdefault(pid_of(gtid or 0), []).append((t, dict(pairs)))
            elif text == RESET_MARK:
                resets[pid_of(gtid or 0)] = t
    _clocked(ranges, times)
    processes: Dict[int, str] = {}
    if "PROCESSES" in tables(conn) and {"pid", "name"} <= _columns(conn, "PROCESSES"):
        processes = {pid: name for pid, name in conn.execute("SELECT pid, name FROM PROCESSES")}
    unended = conn.execute(
        f"SELECT count(*) FROM NVTX_EVENTS WHERE eventType IN (?, ?) AND end IS NULL AND {where}",
        (PUSH_POP, START_END, *domains),
    ).fetchone()[0]
    return Ranges(ranges, ours, processes, settings, resets, unended)


def _nest(ranges: List[Range]) -> None:
    """Set each range's parent and depth (``ranges`` sorted by start, the longest first)."""
    by_thread: Dict[int, List[int]] = {}
    for i, r in enumerate(ranges):
        by_thread.setdefault(r.gtid, []).append(i)
    for idx in by_thread.values():  # on one thread: a stack of the open ranges
        stack: List[int] = []
        for i in idx:
            r = ranges[i]
            while stack and ranges[stack[-1]].end <= r.start:
                stack.pop()
            if stack and r.end <= ranges[stack[-1]].end:
                r.parent, r.depth = stack[-1], ranges[stack[-1]].depth + 1
            stack.append(i)
    threads_of: Dict[int, List[int]] = {}
    for gtid in by_thread:
        threads_of.setdefault(pid_of(gtid), []).append(gtid)
    starts = {g: [ranges[i].start for i in idx] for g, idx in by_thread.items()}
    for gtid, idx in by_thread.items():  # a thread's outermost backward: under another's
        others = [g for g in threads_of[pid_of(gtid)] if g != gtid]
        if not others:
            continue
        for i in idx:
            r = ranges[i]
            if r.parent >= 0 or not r.backward:  # (autograd's thread runs backward steps only)
                continue
            best = -1
            for g in others:
                k = bisect.bisect_right(starts[g], r.start) - 1
                j = by_thread[g][k] if k >= 0 else -1
                while j >= 0 and (j > i or ranges[j].end < r.end):  # earlier: never a cycle
                    j = ranges[j].parent
                if j >= 0 and (best < 0 or ranges[j].depth > ranges[best].depth):
                    best = j
            if best >= 0:
                r.parent = best
    _depths(ranges)


def _clocked(ranges: List[Range], times: List[Tuple[int, int, int]]) -> None:
    """Give each range the payload of its closing mark (``times``: time, thread, ns): the
    mark's thread's innermost range open at it (every range inside has ended: the mark is
    made at the close, before the pop)."""
    by_thread: Dict[int, List[int]] = {}
    for i, r in enumerate(ranges):  # sorted by start
        by_thread.setdefault(r.gtid, []).append(i)
    starts = {g: [ranges[i].start for i in idx] for g, idx in by_thread.items()}
    for t, gtid, ns in times:
        idx = by_thread.get(gtid)
        if not idx:
            continue
        k = bisect.bisect_right(starts[gtid], t) - 1
        j = idx[k] if k >= 0 else -1
        while j >= 0 and ranges[j].gtid == gtid and ranges[j].end <= t:
            j = ranges[j].parent
        if j >= 0 and ranges[j].gtid == gtid:
            ranges[j].clocked = ns


def _depths(ranges: List[Range]) -> None:
    """Each range's depth from its parent (parents may now sit on other threads)."""
    order = sorted(range(len(ranges)), key=lambda i: (ranges[i].start, -ranges[i].end))
    done: List[bool] = [False] * len(ranges)

    def depth(i: int) -> int:
        chain = []
        while i >= 0 and not done[i]:
            chain.append(i)
            i = ranges[i].parent
        d = ranges[i].depth + 1 if i >= 0 else 0
        for j in reversed(chain):
            ranges[j].depth = d
            done[j] = True
            d += 1
        return d

    for i in order:
        depth(i)
