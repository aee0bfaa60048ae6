"""The per-thread stack of open steps: each thread nests its own, and the start of a step
lives in a :class:`Frame` on it, never on the step object, so one step object can be entered
recursively and from many threads at once. Frames are reused: opening a step allocates
nothing. At run time it imports only the C extension.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional

from ..native import speedups

if TYPE_CHECKING:
    from ..clocks.events import GpuSlot

#: Clock modes of a frame: the CPU clock, a CUDA event pair, not timed, the bottom sentinel.
CPU, CUDA, UNTIMED, BOTTOM = 0, 1, 2, 3
#: Bits of ``Frame.flags``: what the frame opened besides its clock, so its close undoes that
#: (an NVTX range, a profiler label); SAMPLED: a backward frame of a call timed at random;
#: RANGED: a frame of the ranges mode (``record="ranges"``), its range all it records;
#: ASIDE: a region the tool's one-time work ran in (``frames.setup``), to leave out at its close.
PUSHED, LABELLED, SAMPLED, RANGED, ASIDE = 1, 2, 4, 8, 16


class Frame:
    """One open step on a thread's stack: what its exit needs, read by name.

    The bottom of every stack is a sentinel frame (no entry, no owner), and each frame keeps
    in ``spare`` the frame last opened directly above it: that one is never on the stack
    while its frame is on top (it was pushed after its frame, and frames keep their order),
    so it is free to reuse. Filling a reused frame's slots costs about what building a tuple
    does, less than building a ``NamedTuple``. What a frame holds of its clock depends on
    ``mode``: a CPU frame's start is ``start``; a CUDA frame's is ``event`` (from the pool of
    ``event_device``), with ``start`` its CPU start and, while the timeline records, ``gpu``.

    When the C extension is in use this is its ``Frame`` (the fast path of steps reads its
    fields directly, see :mod:`~instrumented_convs.core.steps.stepbase`), with the same
    attributes.
    """

    __slots__ = (
        "entry",
        "start",
        "event",
        "event_device",
        "mode",
        "flags",
        "rf",
        "owner",
        "cuda",
        "dev",
        "spare",
        "log",
        "seq0",
        "anchor",
        "outputs",
        "task",
        "gpu",
        "own",
        "opened",
    )

    def __init__(self) -> None:
        """An unused frame (also the bottom sentinel: no entry, no owner)."""
        self.entry: Any = None  #: the registry entry the step records into
        self.start: int = 0  #: the CPU clock (integer ns) at a CPU or CUDA frame's entry
        self.event: Any = None  #: a CUDA frame's start event (None: not a CUDA frame)
        self.event_device: int = 0  #: the device ``event`` was recorded on: its pool's key
        self.mode: int = BOTTOM  #: CPU, CUDA or UNTIMED (BOTTOM for the sentinel)
        self.flags: int = (
            0  #: PUSHED (an NVTX range is open), LABELLED (a profiler label is), SAMPLED
        )
        self.rf: Any = None  #: the open record_function handle (when LABELLED)
        self.owner: Any = None  #: the Step (or backward record) that opened the frame
        self.cuda: bool = False  #: the frame's steps time with CUDA events (children inherit it)
        self.dev: Optional[int] = None  #: CUDA device index (None: the current device)
        self.spare: Optional[Frame] = None  #: the frame last opened directly above this one
        # Backward timing (see backward.anchor): forward steps log the autograd nodes they create.
        self.log: Optional[list] = None  #: the anchor's log of nested steps, or None
        self.seq0: int = -1  #: autograd sequence number at entry (-1: this step logs nothing)
        self.anchor: bool = False  #: this step's exit walks the autograd graph it built
        self.outputs: Any = None  #: the step's output tensors, when its code says them
        self.task: Optional[int] = None  #: for a backward step: its autograd graph task id
        #: A CUDA frame's slot on the timeline's GPU track, while the timeline records.
        self.gpu: Optional[GpuSlot] = None
        #: The tool's own time on this thread, in ns (see backward.hooks): the bottom sentinel's is
        #: its running total; a CPU backward frame's, that total at its start.
        self.own: int = 0
        #: The bottom sentinel's: how many steps were opened on this thread (the duty cycle
        #: tells an iteration that recorded nothing by it).
        self.opened: int = 0

    def __repr__(self) -> str:
        """``Frame('path', mode=...)``."""
        path = getattr(self.entry, "path", None)
        return f"Frame({path!r}, mode={self.mode})"


class _ThreadState(threading.local):
    """Per-thread nesting stack of open steps, bottom sentinel first."""

    def __init__(self) -> None:
        self.stack: List[Frame] = [Frame()]


#: The per-thread state: ``_tls.stack`` is this thread's stack of frames.
_tls: Any = _ThreadState()
if speedups is not None:  # the same, in C: frames with C fields, the stack found faster
    Frame = speedups.Frame  # type: ignore[misc]  # noqa: F811
    _tls = speedups.ThreadState()


def thread_stack() -> List[Frame]:
    """This thread's stack itself (the sentinel at index 0); the hot path holds it."""
    return _tls.stack


def depth() -> int:
    """How many steps are open on this thread."""
    return len(_tls.stack) - 1


def current_path() -> str:
    """The ``/``-separated path of the innermost open step on this thread (``""`` if none)."""
    entry = _tls.stack[-1].entry
    return entry.path if entry is not None else ""


def open_steps() -> List[str]:
    """The paths of the steps open on this thread, outermost first."""
    return [f.entry.path for f in _tls.stack[1:]]


def pop_own(stack: List[Frame], owner: Any) -> Optional[Frame]:
    """Remove and return ``owner``'s innermost frame when it is not on top of the stack.

    That happens when contexts do not nest, e.g. a generator suspended inside a step while
    the step around its caller closes; the other frames stay until their steps close.
    """
    for i in range(len(stack) - 1, 0, -1):
        if stack[i].owner is owner:
            return stack.pop(i)
    return None


def follow(calls: List[List[Any]], stack: List[Any], level: int, close: Any) -> None:
    """Close (``close(calls, keep)``) the tracked ``calls`` no longer open on this thread's
    ``stack``; track those opened since, from ``level``: ``[frame, call, entry, base, last,
    peak]`` each (the counters' CUDA memory, and the memory meter's peaks: what watches ops
    follows the step calls open around them so). ``call`` tells a call of a frame from the
    next call reusing it: a timed frame's start, None for an untimed one."""
    n = 0
    while n < len(calls) and n + 1 < len(stack):
        frame = stack[n + 1]
        call = None if frame.mode == UNTIMED else frame.start
        if calls[n][0] is not frame or calls[n][1] != call:  # a start: a new int per read
            break  # (the C fast path), compared by value
        n += 1
    if n < len(calls):
        close(calls, n)
    for frame in stack[len(calls) + 1 :]:
        call = None if frame.mode == UNTIMED else frame.start
        calls.append([frame, call, frame.entry, level, level, level])


class Followed:
    """The step calls open around the ops a watcher sees, one list per thread (see
    :func:`follow`): :meth:`calls` is this thread's; :meth:`settle` closes every thread's,
    :meth:`clear` forgets them (the counters' CUDA memory, and the memory meter's peaks)."""

    def __init__(self, lock: Any) -> None:
        """Lists guarded by ``lock`` (the watcher's own)."""
        self._lock = lock
        self._lists: Dict[int, List[List[Any]]] = {}
        self._local = threading.local()

    def calls(self) -> List[List[Any]]:
        """This thread's list of tracked calls."""
        calls = getattr(self._local, "calls", None)
        if calls is None:
            calls = self._local.calls = []
            with self._lock:
                self._lists[threading.get_ident()] = calls
        return calls

    def any_open(self) -> bool:
        """Whether a call is tracked on any thread."""
        return any(self._lists.values())

    def settle(self, close: Callable[[List[List[Any]], int], None]) -> None:
        """``close(calls, 0)`` every thread's tracked calls."""
        with self._lock:
            for calls in self._lists.values():
                if calls:
                    close(calls, 0)

    def clear(self) -> None:
        """Forget every thread's tracked calls."""
        with self._lock:
            for calls in self._lists.values():
                del calls[:]
