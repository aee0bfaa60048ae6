"""The profiler's side of the accuracy check, as plain data: our labels' ranges, the CUDA
launches made inside them and the kernels those launched, read from a ``torch.profiler``
run (:func:`read`), then summed per step path and direction (:func:`label_times`). The
comparison works on these plain :class:`Event` lists, so tests give it synthesised traces.
Nothing here imports from the package.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from typing import Any, Dict, Iterable, List, NamedTuple, Set, Tuple

__all__ = ["Event", "read", "label_times", "BACKWARD"]

#: How a step's backward label ends (``report.BACKWARD_MARK``).
BACKWARD = " [backward]"


class Event(NamedTuple):
    """One event of a profile: ``label`` (a ``record_function`` range), ``launch`` (a CUDA
    runtime call on the CPU) or ``kernel`` (work on the device: a kernel, a copy, a fill);
    times in ns on the profiler's clock; ``corr`` ties a kernel to its launch."""

    kind: str
    name: str
    start: int
    end: int
    thread: int
    corr: int


def _ns(e: Any, what: str) -> int:
    """``start`` or ``duration`` of a Kineto event in ns (torch 2.2 has only microseconds)."""
    f = getattr(e, f"{what}_ns", None)
    return int(f()) if f is not None else int(getattr(e, f"{what}_us")() * 1000)


def _device(e: Any) -> str:
    """``CPU`` or ``CUDA``: where a Kineto event ran."""
    return str(e.device_type()).rsplit(".", 1)[-1].upper()


def read(prof: Any, names: Set[str]) -> List[Event]:
    """The labels named in ``names`` (ours, and ours with :data:`BACKWARD`), the CUDA runtime
    calls and the device's work in a finished ``torch.profiler.profile``.

    The device's work leaves out the ``record_function`` ranges the profiler also draws on the
    device's timeline ("gpu_user_annotation": ``Optimizer.step#Adam.step``): their correlation
    ids come from another count than the launches', so one taken for a kernel ties itself to
    an unrelated launch (on an H100 it made the device seem busy to the end of the run).
    torch 2.2 has no ``is_user_annotation``: there such a range is known by its name, that of
    a range on the CPU (a kernel's or a copy's never is)."""
    out: List[Event] = []
    events = list(prof.profiler.kineto_results.events())
    on_cpu = {e.name() for e in events if _device(e) != "CUDA"}
    for e in events:
        start = _ns(e, "start")
        end = start + _ns(e, "duration")
        device = _device(e)
        name = e.name()
        if device == "CUDA":
            annotation = getattr(e, "is_user_annotation", None)
            if annotation() if annotation is not None else name in on_cpu:
                continue
            corr = e.correlation_id() or e.linked_correlation_id()
            out.append(Event("kernel", name, start, end, -1, int(corr)))
        elif name in names:
            out.append(Event("label", name, start, end, int(e.start_thread_id()), 0))
        elif name.startswith(("cuda", "cu")) and e.correlation_id():
            out.append(
                Event("launch", name, start, end, int(e.start_thread_id()), int(e.correlation_id()))
            )
    return out


def _paths(labels: Iterable[Event]) -> List[Tuple[str, str, Event]]:
    """Each label with its step path (the labels around it on its thread, by time) and its
    direction: ``("GCNConv/lin", "backward", event)`` for ``lin [backward]`` inside
    ``GCNConv [backward]``."""
    out = []
    by_thread: Dict[int, List[Event]] = defaultdict(list)
    for e in labels:
        by_thread[e.thread].append(e)
    for events in by_thread.values():
        stack: List[Event] = []
        for e in sorted(events, key=lambda e: (e.start, -e.end)):
            while stack and stack[-1].end <= e.start:
                stack.pop()
            names = [
                x.name[: -len(BACKWARD)] if x.name.endswith(BACKWARD) else x.name
                for x in (*stack, e)
            ]
            phase = "backward" if e.name.endswith(BACKWARD) else "forward"
            out.append(("/".join(names), phase, e))
            stack.append(e)
    return out


class _Queue:
    """When the device's queue empties: for a time ``t`` on the CPU, the end of the last
    kernel of every launch made before ``t`` (any thread: one stream, as the study runs)."""

    def __init__(self, launches: List[Event], kernels: Dict[int, List[Event]]) -> None:
        self.starts: List[int] = []
        self.ends: List[int] = []  # running maximum of the kernels' ends, launch by launch
        done = 0
        for la in sorted(launches, key=lambda e: e.start):
            ks = kernels.get(la.corr, ())
            if ks:
                done = max(done, max(k.end for k in ks))
            self.starts.append(la.start)
            self.ends.append(done)

    def empty_at(self, t: int) -> int:
        """When the work launched before ``t`` is done (0: none was)."""
        i = bisect.bisect_left(self.starts, t)
        return self.ends[i - 1] if i else 0


def label_times(events: List[Event]) -> Dict[Tuple[str, str], Dict[str, Any]]:
    """Per (path, direction): ``count``, ``total`` (the labels' durations, ns), and on CUDA
    ``span`` (per call, its first kernel's start to its last kernel's end, summed), ``sum``
    (its kernels' durations) and ``kernels`` (how many), for the kernels launched inside;
    ``timeline`` (summed): per call, the interval a pair of CUDA events recorded at the
    label's start and end bounds on the device, from the later of the label's start and the
    end of the work launched before it, to the later of its end and the end of the work
    launched before that (what events measure: on a device that waits for the CPU, the time
    the CPU took to issue the step; on a busy one, its kernels' span);
    ``calls``: each call's ``(start, duration, span, timeline)`` in ns, in the order they
    started."""
    launches: Dict[int, List[Event]] = defaultdict(list)  # per thread, by start
    for e in sorted((e for e in events if e.kind == "launch"), key=lambda e: e.start):
        launches[e.thread].append(e)
    starts = {t: [e.start for e in ls] for t, ls in launches.items()}
    kernels: Dict[int, List[Event]] = defaultdict(list)
    for e in events:
        if e.kind == "kernel":
            kernels[e.corr].append(e)
    queue = _Queue([e for ls in launches.values() for e in ls], kernels)
    out: Dict[Tuple[str, str], Dict[str, Any]] = {}
    for path, phase, lab in _paths(e for e in events if e.kind == "label"):
        row = out.setdefault(
            (path, phase),
            {"count": 0, "total": 0, "span": 0, "sum": 0, "kernels": 0, "timeline": 0, "calls": []},
        )
        row["count"] += 1
        row["total"] += lab.end - lab.start
        mine = launches.get(lab.thread, [])
        lo = bisect.bisect_left(starts.get(lab.thread, []), lab.start)
        hi = bisect.bisect_right(starts.get(lab.thread, []), lab.end)
        ks = [k for la in mine[lo:hi] if la.end <= lab.end for k in kernels.get(la.corr, ())]
        span = max(k.end for k in ks) - min(k.start for k in ks) if ks else 0
        if ks:
            row["span"] += span
            row["sum"] += sum(k.end - k.start for k in ks)
            row["kernels"] += len(ks)
        begin = max(lab.start, queue.empty_at(lab.start))
        timeline = max(lab.end, queue.empty_at(lab.end)) - begin
        row["timeline"] += timeline
        row["calls"].append((lab.start, lab.end - lab.start, span, timeline))
    for row in out.values():
        row["calls"].sort()
    return out
