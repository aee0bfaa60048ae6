"""The timeline: when each step call started and ended, on which thread (storage only).

Off unless asked for (``configure(timeline=N)``; ``run`` turns it on) and bounded by ``N``
calls, so that a trace costs only what it shows. Steps append at their exit (:func:`add`;
the C fast path through ``_speedups.set_timeline``); the report reads :func:`snapshot`'s
plain data (``registry.timeline()``).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Dict, List, Optional, Tuple

from ..clocks import cpu as clock
from ..clocks import events as cuda_events
from ..clocks.events import GpuSlot
from ..native import speedups

__all__ = [
    "events",
    "recording",
    "set_limit",
    "add",
    "gpu_ref",
    "full",
    "clear",
    "snapshot",
    "calls_since",
    "noted",
    "note",
    "iteration",
]

#: The list calls are appended to while the timeline records; None while it does not.
events: Optional[List[tuple]] = None
#: The most calls recorded before recording stops (0: off).
limit = 0
_kept: List[tuple] = []  # what was recorded (the same list as ``events`` while recording)
_notes: List[tuple] = []  # (thread, CPU ns, scope, inputs): what a call was given (note())
_last: Dict[Tuple[int, Any], tuple] = {}  # (thread, key) -> (signature, kept): its last note
_truncated: Optional[int] = None  # the CPU clock when ``limit`` was reached
_refs: Dict[Any, Tuple[Any, int]] = {}  # device key -> (reference event, CPU ns)
_iterations: List[tuple] = []  # (number, one in every, CPU ns at start, at end): iteration()


def _tell_c() -> None:
    if speedups is not None:
        speedups.set_timeline(events, limit, full)


def recording() -> bool:
    """Whether the timeline records now (``configure(timeline=N)``, not yet full)."""
    return events is not None


def set_limit(n: int) -> int:
    """Record up to ``n`` calls from now on (``0``: stop; what was recorded is kept until the
    registry is reset). Turning it on starts an empty timeline; changing the limit while it
    records keeps what it has. Returns the limit before."""
    global events, limit, _kept, _notes, _truncated
    previous = limit
    if n <= 0:
        events, limit = None, 0
        _last.clear()
    else:
        if limit == 0:  # off -> on: a new timeline (once cut by the limit, it stays cut)
            _kept, _notes, _truncated = [], [], None
            del _iterations[:]
            _refs.clear()
            _last.clear()
            events = _kept
        limit = n
    _tell_c()
    return previous


def full() -> None:
    """The limit is reached: stop recording on every thread at once, and remember when (a
    trace says where it was cut; ``registry.reset()`` empties it and records again)."""
    global events, _truncated
    if events is not None:
        _truncated = clock.cpu_now()
        events = None
        _last.clear()
        _tell_c()


def add(entry: Any, t0: int, t1: int, link: Any, slot: Optional[GpuSlot] = None) -> None:
    """Append one call: ``(entry, t0, t1, thread, link)``, or with a sixth item, ``slot``.

    ``entry``: its registry entry; ``t0``, ``t1``: its CPU start and end (the CPU clock,
    integer ns); ``thread``: the ident of the thread it ran on; ``link`` pairs a forward call
    with its backward: a forward call's autograd sequence number at entry (-1: none), a
    backward call's ``(forward thread, sequence number)`` (see ``backward.hooks``).
    A CUDA-timed call gives its GPU ``slot`` (from :func:`gpu_ref`), whose times the
    registry's pending queue fills when it reads the call's events. The C fast path appends
    the same tuple.
    """
    ev = events
    if ev is None:
        return
    if len(ev) >= limit:
        full()
        return
    tid = threading.get_ident()
    ev.append((entry, t0, t1, tid, link) if slot is None else (entry, t0, t1, tid, link, slot))


def gpu_ref(key: int) -> GpuSlot:
    """The GPU slot of one CUDA-timed call on device ``key`` (an index): its reference event
    (recorded on first use, before any timed pair on that device, on that device's current
    stream, where the pairs are recorded: the current device may be another) and the CPU
    clock read with it."""
    ref = _refs.get(key)
    if ref is None:
        if cuda_events.native():  # the C clock's handle, never given back to its pool
            event = cuda_events.record_event(key)
            if event is None:  # the stream captures a graph: no reference yet
                raise RuntimeError("instrumented_convs: no GPU reference while capturing")
        else:
            event = cuda_events.events._factory()  # its own event: never back to the pool
            event.record(cuda_events.current_stream(key))
        ref = _refs[key] = (event, clock.cpu_now())
    return GpuSlot(ref[0], ref[1])


def noted(key: Any, signature: Any) -> bool:
    """Whether the call about to start on this thread needs no note (:func:`note`): the last
    note for ``key`` on this thread had this ``signature`` (the trace gives the call that
    note's inputs), or the timeline does not record."""
    if events is None:
        return True
    last = _last.get((threading.get_ident(), key))
    return last is not None and last[0] == signature


def note(key: Any, inputs: Any, signature: Any = None, keep: Any = ()) -> None:
    """Note what the call about to start on this thread is given (its inputs' shapes, as
    plain data) for the trace's ``args``: the next forward call on this thread of the layer
    ``key`` (its scope) or of the region ``("region", name)`` gets it, and so does every
    later one until the next note for ``key`` on this thread (note only what changed:
    :func:`noted`). ``signature``: what :func:`noted` compares (default: ``inputs``);
    ``keep``: objects whose ids it holds, kept until the next note for ``key`` replaces it
    (no other object takes their ids meanwhile). Bounded like calls."""
    if events is not None and len(_notes) < limit:
        tid = threading.get_ident()
        _last[(tid, key)] = (inputs if signature is None else signature, keep)
        _notes.append((tid, clock.cpu_now(), key, inputs))


def iteration(i: int, every: int, t0: int, t1: int) -> None:
    """A recorded iteration of the duty cycle (``core.dutycycle``), number ``i``, recorded at
    one in ``every``, from ``t0`` to ``t1`` (CPU clock): the trace draws it. The same number
    again (its end taken back and found later) replaces it."""
    if events is None:
        return
    if _iterations and _iterations[-1][0] == i:
        _iterations[-1] = (i, every, t0, t1)
    elif len(_iterations) < limit:
        _iterations.append((i, every, t0, t1))


def clear() -> None:
    """Forget what was recorded (``registry.reset()``); record again if it was on."""
    global events, _truncated
    del _kept[:]
    del _notes[:]
    del _iterations[:]
    _truncated = None
    _refs.clear()
    _last.clear()
    if limit > 0:
        events = _kept
    _tell_c()


def _plain(item: tuple) -> tuple:
    e = item[0]
    gpu = None
    if len(item) > 5:
        slot: GpuSlot = item[5]
        g0, g1 = slot.start_ms, slot.end_ms
        if g0 is not None and g1 is not None:
            gpu = (slot.ref_ns + int(round(g0 * 1e6)), slot.ref_ns + int(round(g1 * 1e6)))
    return (e.name, e.path, e.scope, e.kind, e.phase, item[1], item[2], item[3], item[4], gpu)


def calls_since(n: int) -> Tuple[List[tuple], int]:
    """The calls recorded after the first ``n`` (as :func:`snapshot` gives them), and how
    many there are now: what a reader that had taken ``n`` has not seen (all of them after
    a :func:`clear` left fewer than ``n``)."""
    if n > len(_kept):
        n = 0
    tail = _kept[n:]  # one slice: calls appended meanwhile are the next reader's
    return [_plain(item) for item in tail], n + len(tail)


def snapshot() -> Dict[str, Any]:
    """What was recorded, as plain data: ``calls``, one tuple per call ``(name, path, scope,
    kind, phase, t0, t1, thread, link, gpu)`` (``gpu``: ``(start ns, end ns)`` on the CPU
    clock's axis, or None), with ``limit``, ``recording``, ``truncated`` (the CPU clock when
    the limit stopped it, or None), ``notes`` (:func:`note`'s), ``iterations``
    (:func:`iteration`'s: the duty cycle's recorded iterations), the main thread's ident and
    ``wall_offset_ns`` (add it to the CPU clock for nanoseconds since the epoch)."""
    return {
        "calls": calls_since(0)[0],
        "notes": list(_notes),
        "iterations": list(_iterations),
        "limit": limit,
        "recording": events is not None,
        "truncated": _truncated,
        "main_thread": threading.main_thread().ident,
        "wall_offset_ns": time.time_ns() - clock.cpu_now(),
    }
