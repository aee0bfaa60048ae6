"""Reading the timeline: :class:`Timeline`, and writing it as a Chrome trace, the format that
Perfetto (ui.perfetto.dev) and chrome://tracing open, so that a run's calls can be seen in
time with no profiler of NVIDIA's.
"""

from __future__ import annotations

import bisect
import gzip
import json
import os
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Tuple, Union

from ..core.storage.entry import BACKWARD_MARK
from .whole import write_whole

__all__ = ["Timeline", "write_trace", "read_trace", "merge_traces"]

_GPU_TID = 1000  # tracks of devices come after the threads'
_ITER_TID = 0  # the duty cycle's recorded iterations: above the threads


class Timeline:
    """The calls recorded while ``configure(timeline=N)`` was on (``registry.timeline()``).

    ``calls``: one tuple per call ``(name, path, scope, kind, phase, t0, t1, thread, link,
    gpu)``, times in integer ns on the CPU clock; ``truncated``: whether the limit cut it
    short (and ``limit``); :meth:`to_chrome` and :meth:`save` write it for Perfetto.
    """

    def __init__(self, snapshot: Dict[str, Any]) -> None:
        """A timeline from ``_timeline.snapshot()``'s plain data."""
        self.calls: List[tuple] = list(snapshot["calls"])
        self.limit: int = snapshot["limit"]
        self.recording: bool = snapshot["recording"]
        self._cut: Optional[int] = snapshot["truncated"]
        self._main: Optional[int] = snapshot["main_thread"]
        self._offset: int = snapshot["wall_offset_ns"]
        #: ``(thread, CPU ns, scope, inputs)``: what calls were given
        #: (``core.storage.timeline.note``).
        self.notes: List[tuple] = list(snapshot.get("notes", ()))
        #: ``(number, one in every, CPU ns at start, at end)``: the duty cycle's recorded
        #: iterations (``core.storage.timeline.iteration``), drawn on a track of their own.
        self.iterations: List[tuple] = list(snapshot.get("iterations", ()))
        #: ``(CPU ns, bytes)``: the bytes alive over time while memory was recorded
        #: (``core.meters.memory.samples``), drawn as a counter track.
        self.memory: List[tuple] = list(snapshot.get("memory", ()))

    @property
    def wall_offset_ns(self) -> int:
        """What to add to the CPU clock for nanoseconds since the epoch."""
        return self._offset

    @property
    def truncated(self) -> bool:
        """Whether recording stopped at the limit (later calls are not on it)."""
        return self._cut is not None

    def __len__(self) -> int:
        """How many calls it holds."""
        return len(self.calls)

    def to_chrome(self, pid: Optional[int] = None, name: Optional[str] = None) -> Dict[str, Any]:
        """The timeline as a Chrome trace (a dict: ``traceEvents`` and ``otherData``).

        ``pid`` (default: this process's id) and ``name`` (the process's name in the viewer)
        tell ranks apart when traces are merged (:func:`merge_traces`). Times are
        microseconds after ``otherData["base_ns"]`` (nanoseconds since the epoch, the first
        call's wall-clock time, whole seconds), so they keep their nanoseconds.

        The Chrome Trace Event format (JSON, gzip-compressed when the name ends in ``.gz``) is
        what Perfetto (ui.perfetto.dev) and chrome://tracing open. Each recorded call becomes a
        complete event (``"ph": "X"``) named like its NVTX range and profiler label (``<step>
        [backward]`` for a backward), with its path, scope and phase in ``args`` (and
        ``inputs``, what the call was given, where the ``run`` launcher noted it: made when it
        changed and standing for the calls after it); one process per rank; one track per thread
        (the main thread, autograd's backward thread on CUDA, named) in which events nest
        strictly (a call that overlaps its neighbours without nesting, which steps closed out of
        order can produce, goes to a track of its own beside it); a flow arrow from each forward
        call to its backward; and on CUDA one GPU track with the GPU's times of the same calls,
        from the events already recorded (its clock is aligned with the CPU's at one reference
        event: the offset is the GPU's queue at that moment, so read the GPU track for durations
        and order, and its distance from the CPU track as approximate). A CUDA call's slices
        each carry the other clock's duration: ``device_us`` on the CPU's, ``host_us`` (the
        CPU slice's, the tool's own time in) on the GPU's.
        """
        pid = os.getpid() if pid is None else pid
        off = self._offset
        starts = [c[5] for c in self.calls] + [it[2] for it in self.iterations]
        starts += [m[0] for m in self.memory]
        first = min(starts, default=0) + off
        base = first - first % 1_000_000_000
        tracks: Dict[int, int] = {}  # thread ident -> track id
        if self._main is not None:
            tracks[self._main] = 1
        phases: Dict[int, set] = {}
        spans: List[Tuple[int, int, Dict[str, Any]]] = []  # (start ns, end ns, event)
        forward_at: Dict[Tuple[Any, ...], Dict[str, Any]] = {}
        links: List[Tuple[Tuple[Any, ...], Dict[str, Any]]] = []
        gpu: List[Tuple[int, int, Dict[str, Any]]] = []
        for name_, path, scope, kind, phase, t0, t1, thread, link, g in self.calls:
            tid = tracks.setdefault(thread, len(tracks) + 1)
            phases.setdefault(tid, set()).add(phase)
            label = name_ + BACKWARD_MARK if phase == "backward" else name_
            args = {"path": path, "scope": scope, "phase": phase, "kind": kind}
            ev = {"ph": "X", "name": label, "cat": phase, "pid": pid, "tid": tid, "args": args}
            spans.append((t0 + off - base, t1 + off - base, ev))
            if phase == "forward" and isinstance(link, int) and link >= 0:
                forward_at[(thread, link, name_, scope)] = ev
            elif phase == "backward" and isinstance(link, (tuple, list)):
                links.append(((link[0], link[1], name_, scope), ev))
            if g is not None:  # each slice says the other clock's duration
                host = {"clock": "CUDA", "host_us": round((t1 - t0) / 1e3, 3)}
                gev = dict(ev, tid=_GPU_TID, cat=phase + ",gpu", args=dict(args, **host))
                args["device_us"] = round((g[1] - g[0]) / 1e3, 3)
                gpu.append((g[0] + off - base, g[1] + off - base, gev))
        _attach_inputs(self.notes, self.calls, [sp[2] for sp in spans])
        names = {}
        for thread, tid in tracks.items():
            if thread == self._main:
                names[tid] = "main thread"
            elif phases.get(tid) == {"backward"}:
                names[tid] = f"backward (thread {thread})"
            else:
                names[tid] = f"thread {thread}"
        if gpu:
            names[_GPU_TID] = "GPU (CUDA events of the same steps)"
        for i, every, t0, t1 in self.iterations:
            args = {"iteration": i, "recorded": "always" if every <= 1 else f"one in {every}"}
            ev = {"ph": "X", "name": f"iteration {i}", "cat": "iteration", "pid": pid}
            spans.append((t0 + off - base, t1 + off - base, dict(ev, tid=_ITER_TID, args=args)))
        if self.iterations:
            names[_ITER_TID] = "iterations recorded (duty cycle)"
        events = []
        for t0, t1, ev in _nest(spans + gpu, names):
            ev["ts"], ev["dur"] = round(t0 / 1e3, 3), round((t1 - t0) / 1e3, 3)
            events.append(ev)
        flows = []
        for key, ev in links:
            src = forward_at.get(key)
            if src is not None:
                n = len(flows) // 2 + 1
                common = {"name": "forward -> backward", "cat": "flow", "id": n, "pid": pid}
                flows.append(dict(common, ph="s", tid=src["tid"], ts=src["ts"]))
                flows.append(dict(common, ph="f", bp="e", tid=ev["tid"], ts=ev["ts"]))
        meta: List[Dict[str, Any]] = [
            {"ph": "M", "name": "process_name", "pid": pid, "args": {"name": name or f"pid {pid}"}}
        ]
        for tid, text in sorted(names.items()):
            meta.append(
                {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": text}}
            )
            meta.append(
                {
                    "ph": "M",
                    "name": "thread_sort_index",
                    "pid": pid,
                    "tid": tid,
                    "args": {"sort_index": tid},
                }
            )
        if self._cut is not None:
            note = f"timeline truncated: its limit of {self.limit} calls was reached"
            meta.append(
                {
                    "ph": "i",
                    "s": "g",
                    "name": note,
                    "pid": pid,
                    "tid": 1,
                    "ts": (self._cut + off - base) / 1e3,
                }
            )
        for t, level in self.memory:
            counter = {"ph": "C", "name": "bytes alive (memory)", "pid": pid, "tid": 1}
            events.append(dict(counter, ts=round((t + off - base) / 1e3, 3), args={"bytes": level}))
        other = {"calls": len(self.calls), "limit": self.limit, "truncated": self.truncated}
        if self.iterations:
            other["iterations"] = len(self.iterations)
        return {
            "traceEvents": meta + events + flows,
            "displayTimeUnit": "ms",
            "otherData": {"base_ns": base, "instrumented_convs": {str(pid): other}},
        }

    def save(self, path: Union[str, "os.PathLike[str]"], **kwargs: Any) -> Path:
        """Write :meth:`to_chrome` (``kwargs`` go to it) to ``path``; gzip if it ends in
        ``.gz``. Open it in ui.perfetto.dev or chrome://tracing."""
        return write_trace(path, self.to_chrome(**kwargs))

    def __repr__(self) -> str:
        """``Timeline(N calls[, truncated at the limit])``."""
        cut = ", truncated at the limit" if self.truncated else ""
        return f"Timeline({len(self.calls)} calls{cut})"


Span = Tuple[int, int, Dict[str, Any]]


def _attach_inputs(notes: List[tuple], calls: List[tuple], events: List[Dict[str, Any]]) -> None:
    """Put each note's inputs in the ``args`` of the calls it stands for, on its thread: the
    first forward call starting at or after it of its layer (``scope``, a string) or of the
    region it names (``("region", name)``), and the later calls of that step until the next
    note for the same key: a call is noted only when what it is given changed
    (``core.storage.timeline.note``), so a call without a note of its own was given the last
    one's."""
    if not notes:
        return
    starts: Dict[Tuple[Any, Any], List[Tuple[int, int]]] = {}
    for i, c in enumerate(calls):  # c: (name, path, scope, kind, phase, t0, t1, thread, ...)
        if c[4] != "forward":
            continue
        if c[2] is not None:
            starts.setdefault((c[7], c[2]), []).append((c[5], i))
        if c[3] == "region":
            starts.setdefault((c[7], ("region", c[0])), []).append((c[5], i))
    noted: Dict[Tuple[Any, Any], List[Tuple[int, Any]]] = {}
    for thread, at, key, inputs in notes:
        noted.setdefault((thread, key if isinstance(key, str) else tuple(key)), []).append(
            (at, inputs)
        )
    for k, marks in noted.items():
        group = sorted(starts.get(k, ()))
        if not group:
            continue
        marks.sort(key=lambda m: m[0])  # stable: notes made at one time keep their order
        times, begins = [m[0] for m in marks], [g[0] for g in group]
        # The step a note is for: the first call after it (a layer's own step, not the steps
        # inside it, which carry its scope too); then each of its calls gets the last note.
        names = set()
        for at in times:
            j = bisect.bisect_left(begins, at)
            if j < len(group):
                names.add(calls[group[j][1]][0])
        for t0, i in group:
            m = bisect.bisect_right(times, t0) - 1
            if m >= 0 and calls[i][0] in names:
                events[i]["args"].setdefault("inputs", marks[m][1])


def _nest(spans: List[Span], names: Dict[int, str]) -> List[Span]:
    """Sort each track's spans (integer ns) and move any that overlaps without nesting to a
    track of its own (named after its track), so that every track nests strictly."""
    by_tid: Dict[int, List[Span]] = {}
    for sp in spans:
        by_tid.setdefault(sp[2]["tid"], []).append(sp)
    out: List[Span] = []
    spare = max([*names, *by_tid], default=0) + 1
    todo = sorted(by_tid.items(), key=lambda kv: kv[0])
    while todo:
        tid, group = todo.pop(0)
        group.sort(key=lambda sp: (sp[0], -sp[1]))
        ends: List[int] = []
        moved: List[Span] = []
        for sp in group:
            while ends and ends[-1] <= sp[0]:
                ends.pop()
            if ends and sp[1] > ends[-1]:  # starts inside the open span, ends after it
                moved.append(sp)
                continue
            ends.append(sp[1])
            out.append(sp)
        if moved:  # the events themselves move: arrows hold them and read their track
            names[spare] = f"{names.get(tid, f'track {tid}')} (overlapping calls)"
            for _, _, ev in moved:
                ev["tid"] = spare
            todo.append((spare, moved))
            spare += 1
    return out


def write_trace(path: Union[str, "os.PathLike[str]"], trace: Dict[str, Any]) -> Path:
    """Write a Chrome trace dict to ``path`` (gzip when it ends in ``.gz``), atomically."""
    p = Path(path)
    data = json.dumps(trace, separators=(",", ":")).encode()
    if p.name.endswith(".gz"):
        data = gzip.compress(data, compresslevel=6)
    return write_whole(p, data)


def read_trace(path: Union[str, "os.PathLike[str]"]) -> Dict[str, Any]:
    """A Chrome trace written by :func:`write_trace` (gzip or not)."""
    raw = Path(path).read_bytes()
    return json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)


def merge_traces(traces: Iterable[Dict[str, Any]]) -> Dict[str, Any]:
    """One Chrome trace of several (the ranks of a job, each its own process), on the
    earliest one's time base."""
    traces = list(traces)
    bases = [t.get("otherData", {}).get("base_ns", 0) for t in traces]
    base = min(bases, default=0)
    events: List[Dict[str, Any]] = []
    other: Dict[str, Any] = {}
    flows = 0  # arrow ids are per trace: viewers pair ends by id alone, so renumber
    for t, b in zip(traces, bases):
        shift = (b - base) / 1e3
        top = 0
        for ev in t.get("traceEvents", []):
            ev = dict(ev, ts=ev["ts"] + shift) if shift and "ts" in ev else dict(ev)
            if ev.get("cat") == "flow" and isinstance(ev.get("id"), int):
                top = max(top, ev["id"])
                ev["id"] += flows
            events.append(ev)
        flows += top
        other.update(t.get("otherData", {}).get("instrumented_convs", {}))
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"base_ns": base, "instrumented_convs": other},
    }
