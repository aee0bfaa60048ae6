"""A report's ranges as the registry would have held them: one snapshot of entries per
process (:class:`~instrumented_convs.report.EntryStats`, depth first), each range a call of
the entry at its path, layer and phase, its duration the call's time.

With CUDA activity in the report, a call's time is its device span (the first activity its
range launched to the last one's end) and the range's own duration is its host time, as the
in-process clock keeps them on CUDA; a range that launched nothing has no device time (0),
and no host time in the Host column, which holds the calls with device work. A step the
process timed on the CPU clock (a loader's wait, say: its range's payload says) keeps its
range's duration.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from ...core.storage.entry import EntryStats
from ..row import TOOL
from .device import LAG_FLOOR_NS, DeviceTime, lag
from .ranges import Range

__all__ = ["snapshots", "drop_warmup"]

Key = Tuple[int, str, Optional[str], str]  # parent node, name, scope, phase


@dataclass
class _Node:
    name: str
    scope: Optional[str]
    kind: str
    phase: str
    parent: int
    depth: int
    path: str
    times: List[int] = field(default_factory=list)
    host: int = 0
    dcalls: int = 0
    lag: int = 0
    caught: int = 0
    busy: int = 0
    children: List[int] = field(default_factory=list)


def drop_warmup(
    ranges: Sequence[Range], n: int, resets: Optional[Dict[int, int]] = None
) -> List[bool]:
    """Which ranges to keep: those that ended before their process last reset its registry
    (``resets``: pid -> when) are dropped, as the process dropped their times; then each
    process's first ``n`` calls of each outermost step (an iteration: ``epoch``, say), with
    everything under them."""
    resets = resets or {}
    keep = [r.end > resets.get(r.pid, r.end - 1) for r in ranges]
    if n <= 0:
        return keep
    seen: Dict[Tuple[int, str], int] = {}
    for i, r in enumerate(ranges):  # sorted by start: parents before their children
        if not keep[i]:
            continue
        if r.parent < 0:
            k = (r.pid, r.name)
            seen[k] = seen.get(k, 0) + 1
            keep[i] = seen[k] > n
        else:
            keep[i] = keep[r.parent]
    return keep


def _kind(r: Range) -> str:
    if r.tool:
        return TOOL
    if r.region is not None:
        return "region" if r.region else "step"
    return "region" if r.scope is None and not r.backward else "step"  # ranges of old


def snapshots(
    ranges: Sequence[Range],
    device: Optional[Sequence[Optional[DeviceTime]]] = None,
    keep: Optional[Sequence[bool]] = None,
) -> Dict[int, List[EntryStats]]:
    """Per process id, its snapshot: ``ranges`` grouped by path, layer and phase (a step
    inside a backward step is of the backward phase); ``device``: each range's device time
    (None: none launched, or no CUDA activity in the report); ``keep``: which ranges count."""
    nodes: Dict[int, List[_Node]] = {}
    index: Dict[int, Dict[Key, int]] = {}
    node_of = [-1] * len(ranges)
    for i, r in enumerate(ranges):
        if keep is not None and not keep[i]:
            continue
        pid = r.pid
        ns, idx = nodes.setdefault(pid, []), index.setdefault(pid, {})
        parent = node_of[r.parent] if r.parent >= 0 and not r.tool else -1
        phase = (
            "backward"
            if r.backward or (parent >= 0 and ns[parent].phase == "backward")
            else "forward"
        )
        key = (parent, r.name, r.scope, phase)
        n = idx.get(key)
        if n is None:
            up = ns[parent] if parent >= 0 else None
            n = idx[key] = len(ns)
            ns.append(
                _Node(
                    r.name,
                    r.scope,
                    _kind(r),
                    phase,
                    parent,
                    up.depth + 1 if up else 0,
                    f"{up.path}/{r.name}" if up else r.name,
                )
            )
            if up:
                up.children.append(n)
        node_of[i] = n
        node = ns[n]
        d = device[i] if device is not None else None
        if device is None or r.cpu:  # no CUDA in the report, or a step on the CPU clock
            node.times.append(r.duration)
        elif d is None:  # no device work: none to time
            node.times.append(0)
        else:
            node.times.append(d.span)
            node.host += r.duration
            node.dcalls += 1
            node.busy += d.busy
            late = lag(d, r)
            node.lag += late
            node.caught += late < LAG_FLOOR_NS
    return {pid: _stats(ns) for pid, ns in nodes.items()}


def _stats(nodes: List[_Node]) -> List[EntryStats]:
    """The nodes depth first, each as an EntryStats (parents as indices into the list)."""
    out: List[EntryStats] = []
    place: Dict[int, int] = {}
    stack = [n for n in reversed(range(len(nodes))) if nodes[n].parent < 0]
    while stack:
        n = stack.pop()
        node = nodes[n]
        place[n] = len(out)
        t = node.times
        out.append(
            EntryStats(
                name=node.name,
                path=node.path,
                scope=node.scope,
                kind=node.kind,
                depth=node.depth,
                parent=place[node.parent] if node.parent >= 0 else -1,
                count=len(t),
                total=sum(t),
                sumsq=sum(x * x for x in t),
                min=min(t) if t else 0,
                max=max(t) if t else 0,
                errors=0,
                untimed=0,
                phase=node.phase,
                host=node.host,
                dcalls=node.dcalls,
                lag=node.lag,
                caught=node.caught,
                busy=node.busy,
            )
        )
        stack.extend(reversed(node.children))
    return out
