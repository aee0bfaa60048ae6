"""The registry: streaming statistics per (scope, step path), thread-safe.

Each distinct step path in each scope is one :class:`Entry`, a node of a tree whose
parent is the enclosing step. An entry keeps count, total, sum of squares, min and max of
its durations as integer nanoseconds, so the arithmetic is exact and memory does not grow
with the number of calls. All writes happen under one lock. The registry knows nothing of
PyG or DGL, and nothing of rendering: :meth:`Registry.summary` hands plain rows to
:mod:`instrumented_convs.report`.
"""
from __future__ import annotations

import math
import threading
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

from ._clock import EventPool, PendingTimes, _new_cuda_event

Key = Union[str, Tuple[str, Optional[str]]]
_NO_MIN = 1 << 62  # larger than any duration in ns


class Entry:
    """Statistics of one step path in one scope, and the node of the nesting tree."""

    __slots__ = (
        "name", "path", "scope", "kind", "parent", "children", "depth", "key", "gen",
        "count", "total", "sumsq", "min", "max", "errors", "untimed",
    )

    def __init__(
        self, name: str, path: str, scope: Optional[str], kind: str,
        parent: Optional["Entry"], depth: int, key: Any = None, gen: int = 0,
    ) -> None:
        """Create an empty entry (no calls recorded)."""
        self.key = key
        self.gen = gen
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

    def _add(self, ns: int) -> None:
        # Caller holds the registry lock. (Step.__exit__ inlines this for speed.)
        if ns < self.min:
            self.min = ns
        if ns > self.max:
            self.max = ns
        self.count += 1
        self.total += ns
        self.sumsq += ns * ns

    def walk(self) -> Iterator["Entry"]:
        """This entry's descendants, depth first, siblings in order of first use."""
        for child in list(self.children.values()):
            yield child
            yield from child.walk()

    def __repr__(self) -> str:
        """``Entry('path', scope=..., count=..., total=...ns)``."""
        return f"Entry({self.path!r}, scope={self.scope!r}, count={self.count}, total={self.total}ns)"


class Registry:
    """Thread-safe store of step timings: ``add`` and ``reset`` write, ``summary`` reads."""

    def __init__(self) -> None:
        """Create an empty registry."""
        self._lock = threading.Lock()
        self.gen = 0  # bumped by reset(): entries of older generations are relocated
        self._root = Entry("", "", None, "root", None, -1)
        self.pending = PendingTimes(self._fold_locked, EventPool(_new_cuda_event))

    # -- writing ------------------------------------------------------------------------
    def child(self, parent: Entry, name: str, scope: Optional[str] = None, kind: str = "step") -> Entry:
        """The entry for step ``name`` nested in ``parent``, in ``scope`` or else the parent's.

        Children that inherit the parent's scope are keyed by name alone, those with a scope
        of their own by ``(name, scope)``.
        """
        key: Key = name if scope is None else (name, scope)
        with self._lock:
            entry = parent.children.get(key)
            if entry is None:
                path = f"{parent.path}/{name}" if parent.path else name
                own_scope = parent.scope if scope is None else scope
                entry = Entry(name, path, own_scope, kind, parent, parent.depth + 1, key, parent.gen)
                parent.children[key] = entry
            return entry

    def relocate(self, entry: Entry) -> Entry:
        """The entry of the same path and scopes in the current tree (after a reset)."""
        chain = []
        e: Optional[Entry] = entry
        while e is not None and e.depth >= 0:
            chain.append(e)
            e = e.parent
        node = self._root
        for old in reversed(chain):
            scope = None if isinstance(old.key, str) else old.key[1]
            node = self.child(node, old.name, scope, old.kind)
        return node

    @property
    def root(self) -> Entry:
        """The invisible root: top-level steps are its children."""
        return self._root

    def record(self, entry: Entry, ns: int, error: bool = False) -> None:
        """Add one duration (integer nanoseconds) to ``entry``."""
        with self._lock:
            entry._add(ns)
            if error:
                entry.errors += 1

    def record_untimed(self, entry: Entry, error: bool = False) -> None:
        """Count a call that could not be timed (CUDA-graph capture, an unreadable event)."""
        with self._lock:
            entry.untimed += 1
            if error:
                entry.errors += 1

    def record_pending(self, entry: Entry, start: Any, end: Any, error: bool = False) -> None:
        """Queue a CUDA event pair for ``entry``; it is folded in when resolved."""
        with self._lock:
            if error:
                entry.errors += 1
            self.pending.add(entry, start, end)

    def _fold_locked(self, entry: Entry, ns: Optional[int]) -> None:
        if ns is None:
            entry.untimed += 1
        else:
            entry._add(ns)

    def add(self, path: str, seconds: float, scope: Optional[str] = None) -> None:
        """Record a duration in seconds for a ``/``-separated step path, outside any step."""
        entry = self._root
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
            self.gen += 1
            self._root = Entry("", "", None, "root", None, -1, None, self.gen)

    # -- reading ------------------------------------------------------------------------
    def resolve(self) -> int:
        """Fold every pending CUDA event pair (waits for them); return how many."""
        with self._lock:
            return self.pending.drain()

    def entries(self) -> List[Entry]:
        """Every entry, depth first (after resolving pending CUDA times)."""
        self.resolve()
        with self._lock:
            return list(self._root.walk())

    def summary(self, by: str = "step", unit: Optional[str] = None) -> "Any":
        """A :class:`~instrumented_convs.report.Summary` of everything recorded so far.

        ``by="step"`` merges each step path across layer instances (scopes);
        ``by="layer"`` gives one row per (layer instance, step path).
        """
        from .report import Row, Summary

        if by not in ("step", "layer"):
            raise ValueError(f"by must be 'step' or 'layer', not {by!r}")
        self.resolve()
        with self._lock:
            entries = list(self._root.walk())
            snapshot = [
                (e, e.count, e.total, e.sumsq, e.min if e.count else 0, e.max, e.errors, e.untimed,
                 sum(c.total for c in e.children.values()))
                for e in entries
            ]
        GroupKey = Tuple[Optional[str], str]
        groups: Dict[GroupKey, Dict[str, Any]] = {}
        children_of: Dict[GroupKey, List[GroupKey]] = {(None, ""): []}
        for e, count, total, sumsq, lo, hi, errors, untimed, child_total in snapshot:
            key = (e.scope if by == "layer" else None, e.path)
            g = groups.get(key)
            if g is None:
                g = groups[key] = dict(
                    name=e.path, step=e.name, depth=e.depth, kind=e.kind,
                    scope=key[0], count=0, total=0, sumsq=0, min=None, max=0,
                    self=0, errors=0, untimed=0,
                )
                parent = e.parent
                assert parent is not None
                pkey = (parent.scope if by == "layer" and parent.depth >= 0 else None, parent.path)
                children_of.setdefault(pkey, []).append(key)
                children_of[key] = []
            if count:
                g["min"] = lo if g["min"] is None else min(g["min"], lo)
                g["max"] = max(g["max"], hi)
            g["count"] += count
            g["total"] += total
            g["sumsq"] += sumsq
            g["self"] += total - child_total
            g["errors"] += errors
            g["untimed"] += untimed

        order: List[GroupKey] = []

        def visit(key: GroupKey) -> None:
            for child in children_of.get(key, ()):
                order.append(child)
                visit(child)

        visit((None, ""))
        grand = sum(groups[k]["total"] for k in order if groups[k]["depth"] == 0)
        rows = []
        for k in order:
            g = groups[k]
            if g["count"] == 0 and g["untimed"] == 0 and g["errors"] == 0:
                continue
            n = g["count"]
            if n > 1:
                var = (g["sumsq"] - g["total"] * g["total"] / n) / (n - 1)
                std = math.sqrt(max(var, 0.0)) * 1e-9
            else:
                std = 0.0
            rows.append(Row(
                name=g["name"], step=g["step"], depth=g["depth"], scope=g["scope"],
                kind=g["kind"], count=n, total=g["total"] * 1e-9,
                self_time=g["self"] * 1e-9, mean=(g["total"] / n * 1e-9) if n else 0.0,
                min=(g["min"] or 0) * 1e-9, max=g["max"] * 1e-9, std=std,
                fraction=(g["total"] / grand) if grand else 0.0,
                self_fraction=(g["self"] / grand) if grand else 0.0,
                errors=g["errors"], untimed=g["untimed"],
            ))
        return Summary(rows, unit=unit, by=by, grand_total=grand * 1e-9)


#: The process-wide registry every step writes to.
registry = Registry()
