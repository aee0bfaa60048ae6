"""The registry: streaming statistics per (scope, step path, phase), thread-safe.

Each distinct step path in each scope and phase is one :class:`Entry`, a node of a tree
whose parent is the enclosing step (for a backward entry: the backward of the enclosing
step, or whatever step was open when the backward ran). An entry keeps count, total, sum
of squares, min and max of its durations as integer nanoseconds, so the arithmetic is
exact and memory does not grow with the number of calls. All writes happen under one lock,
through a narrow API (:meth:`Registry.child`, :meth:`~Registry.record`,
:meth:`~Registry.record_pending`, :meth:`~Registry.record_untimed`, :meth:`~Registry.add`,
:meth:`~Registry.reset`).

The registry is storage only: it knows nothing of PyG or DGL, nothing of rendering, and no
arithmetic beyond sums. :meth:`Registry.snapshot` hands plain records to
:mod:`instrumented_convs._stats`, which builds the :class:`~instrumented_convs.report.Summary`.
"""
from __future__ import annotations

import threading
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

from ._clock import PendingTimes
from ._stats import EntryStats, summarize
from .distributed import merged_summary
from .report import Summary

Key = Union[str, Tuple[str, Optional[str]]]
_NO_MIN = 1 << 62  # larger than any duration in ns


def backward_key(key: Any) -> Tuple[Any, str]:
    """The child key of the backward counterpart of a forward step keyed ``key``."""
    return (key, "backward")


class Entry:
    """Statistics of one step path in one scope, and the node of the nesting tree."""

    __slots__ = (
        "name", "path", "scope", "kind", "phase", "parent", "children", "depth", "key", "retired",
        "count", "total", "sumsq", "min", "max", "errors", "untimed",
    )

    def __init__(
        self, name: str, path: str, scope: Optional[str], kind: str,
        parent: Optional["Entry"], depth: int, key: Any = None, phase: str = "forward",
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
        self.count = 0
        self.total = 0
        self.sumsq = 0
        self.min = _NO_MIN  # so the hot path needs no "first call?" test
        self.max = 0
        self.errors = 0
        self.untimed = 0

    def walk(self) -> Iterator["Entry"]:
        """This entry's descendants, depth first, siblings in order of first use."""
        for child in list(self.children.values()):
            yield child
            yield from child.walk()

    def __repr__(self) -> str:
        """``Entry('path', scope=..., count=..., total=...ns)``."""
        return f"Entry({self.path!r}, scope={self.scope!r}, count={self.count}, total={self.total}ns)"


class Registry:
    """Thread-safe store of step timings: a tree of :class:`Entry` with a narrow write API."""

    def __init__(self) -> None:
        """Create an empty registry."""
        self._lock = threading.Lock()
        #: The invisible root of the current tree: top-level steps are its children.
        #: ``reset()`` replaces it (a plain attribute: steps read it on their hot path).
        self.root = Entry("", "", None, "root", None, -1)
        #: CUDA event pairs waiting to be read (:class:`~instrumented_convs._clock.PendingTimes`):
        #: ``len(registry.pending)``, and its ``poll_at`` / ``hard_limit`` thresholds.
        self.pending = PendingTimes(self._fold_locked)

    # -- writing ------------------------------------------------------------------------
    def child(
        self, parent: Entry, name: str, scope: Optional[str] = None, kind: str = "step",
        phase: str = "forward",
    ) -> Entry:
        """The entry for step ``name`` nested in ``parent``, in ``scope`` or else the parent's.

        Forward children that inherit the parent's scope are keyed by name alone, those with
        a scope of their own by ``(name, scope)``; a backward child by :func:`backward_key`
        of that. A retired ``parent`` is relocated first.
        """
        with self._lock:
            if parent.retired:
                parent = self._relocate_locked(parent)
            return self._child_locked(parent, name, scope, kind, phase)

    def _child_locked(
        self, parent: Entry, name: str, scope: Optional[str], kind: str, phase: str = "forward",
    ) -> Entry:
        key: Any = name if scope is None else (name, scope)
        if phase != "forward":
            key = backward_key(key)
        entry = parent.children.get(key)
        if entry is None:
            path = f"{parent.path}/{name}" if parent.path else name
            own_scope = parent.scope if scope is None else scope
            entry = Entry(name, path, own_scope, kind, parent, parent.depth + 1, key, phase)
            parent.children[key] = entry
        return entry

    def relocate(self, entry: Entry) -> Entry:
        """The entry of the same path and scopes in the current tree (after a reset)."""
        with self._lock:
            return self._relocate_locked(entry)

    def _relocate_locked(self, entry: Entry) -> Entry:
        chain = []
        e: Optional[Entry] = entry
        while e is not None and e.depth >= 0:
            chain.append(e)
            e = e.parent
        node = self.root
        for old in reversed(chain):
            key = old.key if old.phase == "forward" else old.key[0]
            scope = None if isinstance(key, str) else key[1]
            node = self._child_locked(node, old.name, scope, old.kind, old.phase)
        return node

    def record(self, entry: Entry, ns: int, error: bool = False) -> None:
        """Add one duration (integer nanoseconds) to ``entry`` (relocated if retired).

        This is the hot path of every CPU-timed step: keep it short.
        """
        with self._lock:
            if entry.retired:
                entry = self._relocate_locked(entry)
            entry.count += 1
            entry.total += ns
            entry.sumsq += ns * ns
            if ns < entry.min:
                entry.min = ns
            if ns > entry.max:
                entry.max = ns
            if error:
                entry.errors += 1

    def record_untimed(self, entry: Entry, error: bool = False) -> None:
        """Count a call that could not be timed (CUDA-graph capture, an unreadable event)."""
        with self._lock:
            if entry.retired:
                entry = self._relocate_locked(entry)
            entry.untimed += 1
            if error:
                entry.errors += 1

    def record_pending(self, entry: Entry, start: Any, end: Any, error: bool = False) -> None:
        """Queue a CUDA event pair (``(event, device key)`` each) for ``entry``.

        The pair is folded in when resolved (see :class:`~instrumented_convs._clock.PendingTimes`).
        """
        with self._lock:
            if entry.retired:
                entry = self._relocate_locked(entry)
            if error:
                entry.errors += 1
            self.pending.add(entry, start, end)

    def _fold_locked(self, entry: Entry, ns: Optional[int]) -> None:
        if ns is None:
            entry.untimed += 1
            return
        entry.count += 1
        entry.total += ns
        entry.sumsq += ns * ns
        if ns < entry.min:
            entry.min = ns
        if ns > entry.max:
            entry.max = ns

    def add(self, path: str, seconds: float, scope: Optional[str] = None) -> None:
        """Record a duration in seconds for a ``/``-separated step path, outside any step."""
        entry = self.root
        names = path.split("/")
        if not all(names):
            raise ValueError(f"a step path is names joined by '/', not {path!r}")
        for name in names:
            entry = self.child(entry, name, scope)
        self.record(entry, int(round(seconds * 1e9)))

    def reset(self) -> None:
        """Forget every recorded time and start a new tree.

        Steps open during the reset are recorded, whole, into the new tree when they close,
        and steps opened inside them later nest under them there as usual.
        """
        with self._lock:
            self.pending.clear()
            old = self.root
            old.retired = True
            for e in old.walk():
                e.retired = True
            self.root = Entry("", "", None, "root", None, -1)

    # -- reading ------------------------------------------------------------------------
    def resolve(self) -> int:
        """Fold every pending CUDA event pair (waits for them); return how many."""
        with self._lock:
            return self.pending.drain()

    def entries(self) -> List[Entry]:
        """Every entry, depth first (after resolving pending CUDA times)."""
        self.resolve()
        with self._lock:
            return list(self.root.walk())

    def snapshot(self) -> List[EntryStats]:
        """Every entry as plain data, depth first (after resolving pending CUDA times).

        Each record carries the raw integer statistics and the index of its parent record
        (-1 for top-level steps): all :mod:`instrumented_convs._stats` needs for a summary.
        """
        self.resolve()
        with self._lock:
            entries = list(self.root.walk())
            index = {id(e): i for i, e in enumerate(entries)}
            return [
                EntryStats(
                    e.name, e.path, e.scope, e.kind, e.depth,
                    index.get(id(e.parent), -1),
                    e.count, e.total, e.sumsq, e.min if e.count else 0, e.max, e.errors, e.untimed,
                    e.phase,
                )
                for e in entries
            ]

    def summary(
        self, by: str = "step", unit: Optional[str] = None, all_ranks: bool = False, group: Any = None,
    ) -> Summary:
        """A :class:`~instrumented_convs.report.Summary` of everything recorded so far.

        ``by="step"`` merges each step path across layer instances (scopes);
        ``by="layer"`` gives one row per (layer instance, step path).

        ``all_ranks=True`` merges the registries of every rank of a torch.distributed job: a
        collective over ``group`` (default: the default process group) that every rank must
        call, returning on every rank the merged summary, with the spread across ranks per
        step and ``by_rank()`` (see :mod:`instrumented_convs.distributed`). Without an
        initialised process group it raises RuntimeError.
        """
        if by not in ("step", "layer"):
            raise ValueError(f"by must be 'step' or 'layer', not {by!r}")
        if all_ranks:
            return merged_summary(self.snapshot(), by=by, unit=unit, group=group)
        return summarize(self.snapshot(), by=by, unit=unit)


#: The process-wide registry every step writes to.
registry = Registry()
