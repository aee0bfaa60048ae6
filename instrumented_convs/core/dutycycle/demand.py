"""On demand (``configure(record="on-demand")``): the layers are instrumented and nothing is
recorded until a capture asks for N iterations, from the next one or from a given one (every
rank of a job from the same); they are handed to whoever listens for captures, and recording
stops again.

Another thread asks (:meth:`Demand.ask`); the loop's own thread decides at each iteration's
beginning (:meth:`Demand.begins`, called by the duty cycle off its common path), so nothing
runs in a signal handler and an idle iteration pays what an unrecorded one of the cycle pays.
A capture begins with one iteration recorded and dropped (a layer's first recorded call
after a pause pays for what the tool sets up then); the steps that iteration left open close
into the dropped tree. It is handed over one boundary after its last iteration: the steps
still open at that boundary (a region around ``opt.step()``; the step of a second
optimizer, whose boundary the cycle takes back) have closed by then, so nothing records
into what is being read.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable, Dict, Optional

from ..clocks import cpu as clock
from ..frames import stack as _stack
from ..meters import readings
from ..storage.entry import ASIDE, Entry

__all__ = ["NEVER", "Busy", "Capture", "Demand"]

#: An iteration number no job reaches: the cycle's next recorded iteration while idle.
NEVER = 1 << 62


class Busy(RuntimeError):
    """A capture was asked for and cannot be taken: one is under way, the job is not on
    demand, or (``late``) the iteration asked for is not two iterations ahead."""

    def __init__(self, message: str, late: bool = False) -> None:
        super().__init__(message)
        self.late = late


class Capture:
    """One capture: ``iterations`` from ``start`` (None: the next one to begin), into the
    folder ``name``. ``state``: ``asked``, ``warming`` (the iteration before ``start``,
    recorded and dropped), ``recording``, ``complete`` (its last iteration ended; handed
    over at the next boundary), then ``writing`` (handed over); or, handed over to be
    dropped, ``missed`` (a rank that began past ``start``) or ``cancelled``. ``reason`` says
    why one ended early."""

    __slots__ = ("number", "iterations", "start", "name", "first", "recorded", "state")
    __slots__ += ("reason", "asked", "began", "handed", "part", "t0", "warm")

    def __init__(self, number: int, iterations: int, start: Optional[int], name: str) -> None:
        """A capture asked for now."""
        self.number, self.iterations, self.start, self.name = number, iterations, start, name
        self.first: Optional[int] = None  #: the iteration it began at
        self.recorded = 0  #: its iterations ended so far
        self.part = False  #: cut short, it holds part of one more (the one under way)
        self.state = "asked"
        self.reason: Optional[str] = None
        self.asked = time.time()
        self.began: Optional[float] = None  #: when its first iteration began (time.time())
        self.t0: Optional[int] = None  #: the same on the CPU clock (the timeline's)
        self.warm: Optional[int] = None  #: the iteration of its warm-up
        self.handed = False  #: handed over (to be written, or dropped)

    @property
    def complete(self) -> bool:
        """Whether every iteration asked for was recorded to its end."""
        return self.reason is None and self.recorded == self.iterations

    def describe(self) -> Dict[str, Any]:
        """The capture as plain data (what ``capture`` is told, and run.json keeps)."""
        last = None if self.first is None else self.first + self.recorded - 1 + self.part
        return {
            "number": self.number,
            "name": self.name,
            "iterations": self.iterations,
            "start": self.start,
            "first": self.first,
            "last": last,
            "recorded": self.recorded,
            "part": self.part,
            "state": self.state,
            "complete": self.complete,
            "reason": self.reason,
            "asked": self.asked,
            "began": self.began,
        }


class Demand:
    """The on-demand state of the process (the duty cycle's :attr:`~.cycle.Cycle.demand`).

    ``owner`` is the cycle: its ``i`` (the iteration under way) and ``_next`` (the next
    iteration whose beginning it must see), written here under the lock only, so that an
    arm from another thread is never overwritten by the loop."""

    def __init__(self, owner: Any) -> None:
        """Off, no capture, nobody listening."""
        self.on = False  #: the mode is on (``configure(record="on-demand")``)
        #: where captures go (``configure(captures=DIR)``; INSTRUMENTED_CONVS_CAPTURES)
        self.folder: Optional[str] = os.environ.get("INSTRUMENTED_CONVS_CAPTURES") or None
        self.listening = False  #: a listener takes captures' requests (the server sets it)
        self.failed = False  #: starting one failed (or a forked child): not tried again
        #: what starts (True) or stops (False) the listener: set by the package's face, the
        #: listener and the captures' writer being above the core
        self.server: Optional[Callable[[bool], None]] = None
        #: called on the loop's thread when a capture's warm-up (or first iteration) begins
        self.began: Optional[Callable[[Capture], None]] = None
        #: called when a capture is handed over (recorded, missed, cancelled or cut short)
        self.finished: Optional[Callable[[Capture], None]] = None
        self.capture: Optional[Capture] = None  #: asked for, recording, or being written
        self.count = 0  #: captures asked for so far
        self.named = False  #: iterations are calls of a named region
        self._owner = owner
        self._lock = threading.RLock()  # (the callbacks may ask it again)

    # -- switching ------------------------------------------------------------------------
    def register(self, server: Callable[[bool], None]) -> None:
        """``server`` starts and stops the listener from now on; a process on demand since
        its start (the environment) starts it at its next iteration's beginning."""
        self.server = server
        if self.on and not self.listening:
            with self._lock:
                self._owner._next = 0

    def serve(self) -> None:
        """Start listening, if nobody does yet (the mode turned on, or the first boundary
        of a process the environment put on demand)."""
        if not self.listening and not self.failed and self.server is not None:
            try:
                self.server(True)
            finally:
                self.failed = not self.listening

    def unserve(self) -> None:
        """Stop listening: a capture under way is handed over as it is."""
        if self.listening and self.server is not None:
            self.server(False)
        self.stop("on demand was turned off")

    def forked(self) -> None:
        """In a forked child (a loader's worker): no listener, none started, a fresh lock
        (the parent's may have been held by one of its threads)."""
        self._lock = threading.RLock()
        self.listening, self.failed, self.capture = False, True, None
        self.began = self.finished = None

    # -- another thread's side ------------------------------------------------------------
    def ask(self, iterations: int, start: Optional[int] = None, name: str = "") -> Capture:
        """Arm a capture of ``iterations`` from iteration ``start`` (None: the next to begin);
        raises :class:`Busy` when one is under way, the mode is off, or ``start`` is not two
        iterations ahead (``late``: the loop reads its next boundary without the lock, so the
        one beginning now may not see it)."""
        with self._lock:
            if not self.on:
                raise Busy("the job is not on demand now (configure(record='all') was called)")
            c = self.capture
            if c is not None:
                raise Busy(f"{_called(c.name)} is under way ({_progress(c)})")
            i = self._owner.i
            if start is not None and start < i + 2:
                raise Busy(f"the job is at iteration {i}, too near {start}", late=True)
            self.count += 1
            c = self.capture = Capture(self.count, iterations, start, name or f"{self.count}")
            self._owner._next = self._next_locked(i)
            return c

    def cancel(self, name: str) -> bool:
        """Cancel the capture ``name``, nothing written: whether it was (not once it is
        handed over to be written)."""
        with self._lock:
            c = self.capture
            if c is None or c.name != name or c.handed:
                return False
            if c.state == "asked":
                c.state, c.reason = "cancelled", "cancelled"
                self._hand_locked(c)  # (whoever waits for it hears so)
            else:
                c.state, c.reason = "cancelled", "cancelled"  # handed at the next boundary
            self._owner._next = self._next_locked(self._owner.i)
            return True

    def status(self) -> Dict[str, Any]:
        """What a listener answers: the mode, the iteration under way, the capture."""
        c = self.capture
        return {
            "on": self.on,
            "i": self._owner.i,
            "named": self.named,
            "capture": None if c is None else c.describe(),
        }

    def written(self, capture: Capture) -> None:
        """The listener wrote (or dropped) ``capture``: the next one may be asked for."""
        with self._lock:
            if self.capture is capture:
                self.capture = None

    # -- the loop's side ------------------------------------------------------------------
    def schedule(self, i: int) -> None:
        """Set the cycle's next boundary, iteration ``i`` under way."""
        with self._lock:
            self._owner._next = self._next_locked(i)

    def rewake(self) -> None:
        """A boundary was taken back (its values restored without the lock): the next
        boundary is the nearer of those, and of what a capture asked meanwhile needs."""
        with self._lock:
            owner = self._owner
            owner._next = min(owner._next, self._next_locked(owner.i))

    def _next_locked(self, i: int) -> int:
        if not self.listening and not self.failed and self.server is not None:
            return 0  # the next boundary starts listening
        c = self.capture
        if c is None or c.handed:
            return NEVER
        if c.state == "asked":  # (its warm-up: the iteration before)
            return 0 if c.start is None else c.start - 1
        return i + 1  # warming, recording, complete or cancelled: the next boundary

    def begins(self, i: int) -> bool:
        """Iteration ``i`` begins: whether it is recorded (and the cycle's next boundary set).
        The first of a capture resets the registry; the one after its last hands it over."""
        if not self.listening:
            self.serve()
        with self._lock:
            c = self.capture
            now = c is not None and self._begins_locked(c, i)
            self._owner._next = self._next_locked(i)
            return now

    def _begins_locked(self, c: Capture, i: int) -> bool:
        if c.handed:
            return False
        if c.state == "asked":
            if c.start is not None and i < c.start - 1:
                return False
            if c.start is not None and i > c.start:
                c.state, c.reason = "missed", f"the job was at iteration {i} when it began"
                self._hand_locked(c)
                return False
            warm = c.start is None or i < c.start
            c.warm = i if warm else None
            if self.began is not None:
                self.began(c)
            if warm:  # the warm-up, from a clean registry
                readings.reset()
                c.state = "warming"
                return True
            self._begin_locked(c, i)  # (it came at the start itself: no warm-up)
        elif c.state == "warming":
            if i == c.warm:  # (begun again: its boundary was taken back)
                return True
            self._begin_locked(c, i)
        elif c.state == "recording" and i == c.first:  # begun again: what was recorded since
            self._begin_locked(c, i)  # is the warm-up's (its second optimizer's step)
        if c.state == "cancelled":
            self._hand_locked(c)
            return False
        end = c.first + c.iterations  # type: ignore[operator]
        c.recorded = max(0, min(i, end) - c.first)  # type: ignore[operator]
        if i < end:
            return True
        if i == end:  # complete: what is still open closes before the next boundary
            c.state = "complete"
            return False
        c.state = "writing"
        self._hand_locked(c)
        return False

    def _begin_locked(self, c: Capture, i: int) -> None:
        """The capture's first iteration begins: the warm-up's records dropped, and the
        steps it left open (a region around ``opt.step()``) closing into the dropped tree."""
        readings.reset()
        for frame in _stack.thread_stack():
            e = frame.entry
            if isinstance(e, Entry) and e.retired is True:
                e.retired = ASIDE  # (its calls close into it, not into the new tree)
        c.first, c.began, c.t0, c.state = i, time.time(), clock.cpu_now(), "recording"

    def ended(self, i: int) -> None:
        """A named iteration ``i`` ended (its region closed): the capture it completes is
        handed over now."""
        with self._lock:
            c = self.capture
            if c is not None and c.state == "recording" and c.first is not None:
                c.recorded = max(0, min(i + 1 - c.first, c.iterations))
                if c.recorded == c.iterations:
                    c.state = "writing"
                    self._hand_locked(c)

    def recording(self) -> bool:
        """Whether a capture is recording now (a boundary taken back stays unrecorded
        once its capture was handed over)."""
        c = self.capture
        return c is not None and not c.handed and c.state in ("warming", "recording", "complete")

    def stop(self, reason: str, drop: bool = False) -> Optional[Capture]:
        """Hand over the capture under way as it is (``reason``: why it ends early, unless
        it was complete), or with ``drop`` to be dropped."""
        with self._lock:
            c = self.capture
            if c is None or c.handed:
                return None
            if c.state == "recording" and not drop:  # the iteration under way: part of one
                owner = self._owner
                c.part = owner._open is not None if self.named else owner.did_something()
                c.recorded = max(0, min(owner.i - c.first, c.iterations))
                c.state, c.reason = "writing", reason
            elif c.state == "complete" and not drop:
                c.state = "writing"
            elif c.state == "warming":  # nothing of its own recorded yet
                c.state, c.reason = "cancelled", reason
            else:
                c.state, c.reason = "cancelled", c.reason or reason
            self._hand_locked(c)
            self._owner._next = NEVER
            return c

    def _hand_locked(self, c: Capture) -> None:
        c.handed = True
        if self.finished is not None:
            self.finished(c)
        else:  # nobody to write it
            self.capture = None


def _called(name: str) -> str:
    """``capture-2`` as it is (``capture``'s names), ``capture 2`` for a name of its own."""
    return name if name.startswith("capture") else f"capture {name}"


def _progress(c: Capture) -> str:
    """``5 of 20 iterations recorded``, ``asked, not begun``, ``being written``."""
    if c.state == "asked":
        start = "the next iteration" if c.start is None else f"iteration {c.start}"
        return f"{c.iterations} iterations asked from {start}, not begun yet"
    if c.state == "warming":
        return "its warm-up iteration under way"
    if c.state == "recording":
        return f"{c.recorded} of {c.iterations} iterations recorded"
    return "being written" if c.state in ("complete", "writing") else c.state
