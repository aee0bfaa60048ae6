"""An entry of the registry: the statistics of one step path in one scope and phase.

The hot path appends durations to an entry's buffer without a lock (a list append is
atomic); :func:`fold_buffer` folds them into its statistics under the registry's lock, as
:data:`FOLDS` says, with the C arithmetic where it is built. Summaries read an entry as
:class:`EntryStats`.
"""

from __future__ import annotations

from operator import add, mul
from typing import Any, Callable, Dict, Iterator, List, NamedTuple, Optional, Tuple, Union

from ..native import speedups

_sums = speedups.sums if speedups is not None else None

__all__ = [
    "Entry",
    "EntryStats",
    "FOLD_AT",
    "FOLDS",
    "REDUCTIONS",
    "BACKWARD_MARK",
    "ASIDE",
    "backward_key",
    "fold_buffer",
]

Key = Union[str, Tuple[str, Optional[str]]]
_NO_MIN = 1 << 62  # larger than any duration in ns
#: Durations an entry buffers before they are folded into its statistics.
FOLD_AT = 64
#: What ends the label of a step's backward (its NVTX range, profiler label, table row): the
#: backward entry of a forward step has the same path and name, phase ``backward``.
BACKWARD_MARK = " [backward]"
#: ``Entry.retired`` of an entry whose tree is not the current one while its step is open
#: (the duty cycle's strata: :meth:`~.registry.Registry.use`): a step opened in it continues
#: in the current tree, its own calls close into it. ``True``: retired by a reset for good.
ASIDE = "aside"

#: Each reduction a fold can make of a chunk of durations, in Python. The C ``sums`` makes
#: those it knows (``sum``, ``sumsq``, ``min``, ``max``) and leaves the others to these.
REDUCTIONS: Dict[str, Callable[[List[int]], int]] = {
    "sum": sum,
    "sumsq": lambda chunk: sum(map(mul, chunk, chunk)),
    "min": min,
    "max": max,
}
#: How a fold merges a chunk into an entry: (its slot, the chunk's reduction in
#: :data:`REDUCTIONS`, how the two join). A new statistic of durations is a line here, its
#: slot in :class:`Entry` and its field in :class:`EntryStats`; no C.
FOLDS: Tuple[Tuple[str, str, Callable[[int, int], int]], ...] = (
    ("total", "sum", add),
    ("sumsq", "sumsq", add),
    ("min", "min", min),
    ("max", "max", max),
)
#: The four folds every entry makes, written out in :func:`fold_buffer` (the hot end of a
#: fold); any further line of :data:`FOLDS` is joined by its function.
_FIRST = ("total", "sumsq", "min", "max")
assert tuple(slot for slot, _, _ in FOLDS[:4]) == _FIRST


def _kinds(folds: Tuple[Tuple[str, str, Callable[[int, int], int]], ...]) -> Tuple[str, ...]:
    """The reductions ``folds`` asks of a chunk, in order."""
    return tuple(kind for _, kind, _ in folds)


_kinds_of: Tuple[Any, Tuple[str, ...]] = (FOLDS, _kinds(FOLDS))  # (FOLDS, its kinds), cached


def backward_key(key: Any) -> Tuple[Any, str]:
    """The child key of the backward counterpart of a forward step keyed ``key``."""
    return (key, "backward")


class EntryStats(NamedTuple):
    """One registry entry as plain data (times in integer nanoseconds)."""

    name: str  #: the step name (last path component)
    path: str  #: the ``/``-separated step path
    scope: Optional[str]  #: the layer instance, or None
    kind: str  #: ``step`` or ``region``
    depth: int  #: 0 for top-level steps
    parent: int  #: index of the parent record in the snapshot, -1 at the top level
    count: int  #: timed calls
    total: int  #: sum of the durations
    sumsq: int  #: sum of the squared durations
    min: int  #: shortest duration (0 when ``count`` is 0)
    max: int  #: longest duration
    errors: int  #: calls that raised
    untimed: int  #: calls that could not be timed
    phase: str = "forward"  #: ``forward`` or ``backward``
    skipped: int = 0  #: calls counted but not timed, by choice (backward sampling)
    rcount: int = 0  #: timed calls chosen at random (a subset of ``count``)
    rtotal: int = 0  #: their total: the sample the time of ``skipped`` calls is estimated from
    # The counters (configure(counters=True), see .counters): this entry's own ops.
    flops: int = 0  #: floating-point operations of its own ops (not its children's)
    bytes_read: int = 0  #: bytes its own ops read
    bytes_written: int = 0  #: bytes its own ops wrote
    ops: int = 0  #: how many ops it ran itself
    unknown: str = ""  #: ops no formula knows: ``"aten.foo:3;aten.bar:1"``
    alloc_bytes: int = 0  #: bytes of the tensors its own ops allocated
    cuda_calls: int = 0  #: calls whose CUDA memory was read (0: not on CUDA, or off)
    cuda_left: int = 0  #: CUDA allocator bytes its calls left allocated (children in)
    cuda_peak: int = 0  #: the most CUDA bytes allocated above a call's start (children in)
    # Memory (configure(memory=True), see .memory).
    saved_bytes: int = 0  #: bytes of the storages it made that autograd saved (own, once)
    mem_calls: int = 0  #: calls whose peak was measured
    peak_bytes: int = 0  #: the most bytes alive above a call's start (children in)
    saved_aside: int = 0  #: calls begun under the user's own saved-tensor hooks (unseen)
    #: What each recorded call stands for: its stratum's iterations over those it recorded
    #: (the duty cycle, :mod:`.cycle`); 1.0: recorded in full.
    weight: float = 1.0
    # Host and device (calls timed with CUDA events, see core.clocks.pending): their host time
    # (the CPU clock from the start event to the end event, the tool's own time left out),
    # how far the device was behind the host when each ended (its lag), and how many ended
    # with the device caught up (a lag under LAG_FLOOR_NS: the device waited for the host).
    host: int = 0  #: host time (ns) of the calls with a device time and a lag
    dcalls: int = 0  #: calls timed on the device whose host time and lag were read
    lag: int = 0  #: the sum of their end lags (ns)
    caught: int = 0  #: of those, calls that ended with the device caught up
    #: The device's busy time in those calls (ns): the summed durations of the work they
    #: launched, where that is known (an Nsight Systems report read back; report.nsys).
    busy: int = 0
    #: The relation of a heterogeneous model its scope computes (``author__writes__paper``:
    #: :meth:`~.registry.Registry.relate`), or None.
    relation: Optional[str] = None


class Entry:
    """Statistics of one step path in one scope, and the node of the nesting tree."""

    __slots__ = (
        "name",
        "path",
        "scope",
        "kind",
        "phase",
        "parent",
        "children",
        "depth",
        "key",
        "retired",
        "buf",
        "count",
        "total",
        "sumsq",
        "min",
        "max",
        "errors",
        "untimed",
        "skipped",
        "rcount",
        "rtotal",
        "sampling",
        "host",
        "dcalls",
        "lag",
        "caught",
    )

    def __init__(
        self,
        name: str,
        path: str,
        scope: Optional[str],
        kind: str,
        parent: Optional["Entry"],
        depth: int,
        key: Any = None,
        phase: str = "forward",
    ) -> None:
        """Create an empty entry (no calls recorded)."""
        self.key = key
        self.phase = phase  #: ``forward`` or ``backward``
        #: True once ``reset()`` has replaced the tree this entry belongs to; a step still
        #: open on it asks :meth:`Registry.relocate` for its counterpart in the new tree.
        self.retired = False
        self.name = name
        self.path = path
        self.scope = scope
        self.kind = kind
        self.parent = parent
        self.depth = depth
        self.children: Dict[Key, Entry] = {}
        self.buf: List[int] = []  #: durations (ns) not yet folded into the statistics below
        self.count = 0
        self.total = 0
        self.sumsq = 0
        self.min = _NO_MIN  # so the hot path needs no "first call?" test
        self.max = 0
        self.errors = 0
        self.untimed = 0
        #: Calls counted but not timed, by choice (backward sampling): their time is estimated.
        self.skipped = 0
        #: Timed calls that were chosen at random (a subset of ``count``), and their total:
        #: the unbiased sample that the time of ``skipped`` calls is estimated from.
        self.rcount = 0
        self.rtotal = 0
        #: State the step machinery keeps for this entry (backward sampling); never read here.
        self.sampling: Any = None
        #: Calls timed on a device (CUDA): host time, calls, lags, caught up (see EntryStats).
        self.host = 0
        self.dcalls = 0
        self.lag = 0
        self.caught = 0

    def walk(self) -> Iterator["Entry"]:
        """This entry's descendants, depth first, siblings in order of first use."""
        for child in list(self.children.values()):
            yield child
            yield from child.walk()

    def stats(self, parent: int) -> EntryStats:
        """This entry as plain data (its buffer folded first by the caller); ``parent``: the
        index of its parent's record in the snapshot, -1 at the top level."""
        return EntryStats(
            self.name,
            self.path,
            self.scope,
            self.kind,
            self.depth,
            parent,
            self.count,
            self.total,
            self.sumsq,
            self.min if self.count else 0,
            self.max,
            self.errors,
            self.untimed,
            self.phase,
            self.skipped,
            self.rcount,
            self.rtotal,
            host=self.host,
            dcalls=self.dcalls,
            lag=self.lag,
            caught=self.caught,
        )

    def __repr__(self) -> str:
        """``Entry('path', scope=..., count=..., total=...ns)``."""
        return (
            f"Entry({self.path!r}, scope={self.scope!r}, count={self.count}, total={self.total}ns)"
        )


def fold_buffer(entry: Entry) -> None:
    """Fold the durations buffered in ``entry`` into its statistics, as :data:`FOLDS` says
    (the caller holds the lock): exactly those read, from the front, so concurrent appends
    are kept."""
    global _kinds_of
    buf = entry.buf
    n = len(buf)
    if not n:
        return
    folds, kinds = _kinds_of
    if folds is not FOLDS:  # FOLDS changed (a test's statistic): its kinds anew
        folds = FOLDS
        kinds = _kinds(folds)
        _kinds_of = (folds, kinds)
    got = _sums(buf, n, kinds) if _sums is not None else None  # the C arithmetic
    if got is None or None in got:  # the Python twin, or reductions the C does not make
        chunk = buf[:n]
        got = [
            REDUCTIONS[kind](chunk) if got is None or got[i] is None else got[i]
            for i, kind in enumerate(kinds)
        ]
    del buf[:n]
    entry.count += n
    if len(got) == 4:
        total, sumsq, lo, hi = got
    else:
        total, sumsq, lo, hi = got[:4]
        for (slot, _, join), value in zip(folds[4:], got[4:]):
            setattr(entry, slot, join(getattr(entry, slot), value))
    entry.total += total
    entry.sumsq += sumsq
    if lo < entry.min:
        entry.min = lo
    if hi > entry.max:
        entry.max = hi
