"""The registry: every step path's statistics, as a tree of entries, behind a narrow write API.

Writes are cheap (a lock-free append to an entry's buffer, folded every ``FOLD_AT`` records
or when read); reads take a ``snapshot()`` of plain data for the report. The duty cycle
keeps one tree per *stratum* (a part of the run recorded at one rate), each weighted by the
iterations it stands for. Storage only: the meters' figures are added in
``core.meters.readings``.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence

from ..clocks import events as _events
from ..clocks.events import GpuSlot
from ..clocks.pending import LAG_FLOOR_NS, PendingTimes
from ..labels import nvtx as _nvtx
from . import timeline as _timeline
from .entry import ASIDE, FOLD_AT, Entry, EntryStats, backward_key, fold_buffer

#: Skipped calls queued before :meth:`Registry.record_skipped` counts them (the C count hook
#: leaves the append that reaches it to that method).
SKIPS_FOLD_AT = 1024


class Stratum:
    """A part of the run recorded at one rate, with its own tree of entries: ``every`` 0 is
    the exact stratum (recorded in full); else ``iterations`` ended while it was the cycle's
    rate (one in ``every``, drawn), of which ``recorded`` were recorded, and ``open`` (0 or
    1) a recorded one under way that counts already (it recorded something)."""

    __slots__ = ("root", "every", "iterations", "recorded", "open")

    def __init__(self, every: int = 0) -> None:
        """An empty stratum (an empty tree; no iterations yet)."""
        self.root = Entry("", "", None, "root", None, -1)
        self.every = every
        self.iterations = 0
        self.recorded = 0
        self.open = 0

    def __repr__(self) -> str:
        """``Stratum(every=10, recorded 3 of 30 iterations)``."""
        n, of = self.recorded, self.iterations
        return f"Stratum(every={self.every}, recorded {n} of {of} iterations)"


def _root_of(entry: Entry) -> Entry:
    while entry.parent is not None:
        entry = entry.parent
    return entry


class Registry:
    """Thread-safe store of step timings: a tree of :class:`Entry` with a narrow write API."""

    def __init__(self) -> None:
        """Create an empty registry."""
        self._lock = threading.RLock()  # reentrant: the C clock's folds run inside record_pending
        #: The strata, the exact one first (see the module docstring), and the current one.
        self.strata: List[Stratum] = [Stratum()]
        self.stratum = self.strata[0]
        #: The invisible root of the current tree: top-level steps are its children.
        #: ``reset()`` and :meth:`use` replace it (a plain attribute: steps read it on their
        #: hot path).
        self.root = self.stratum.root
        self._aside: List[Entry] = []  # entries set aside by use()
        #: How many times the registry was reset (what holds a stratum checks it).
        self.generation = 0
        #: CUDA event pairs waiting to be read
        #: (:class:`~instrumented_convs.core.clocks.pending.PendingTimes`):
        #: ``len(registry.pending)``, and its ``poll_at`` / ``hard_limit`` thresholds.
        self.pending = PendingTimes(self._fold_locked)
        #: Calls counted by backward sampling, not yet added (see :meth:`record_skipped`).
        self._skips: Deque[List[Entry]] = deque()
        #: scope -> the relation it computes (:meth:`relate`); kept across resets, as the
        #: layers are.
        self.relations: Dict[str, str] = {}

    # -- writing ------------------------------------------------------------------------
    def child(
        self,
        parent: Entry,
        name: str,
        scope: Optional[str] = None,
        kind: str = "step",
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
        self,
        parent: Entry,
        name: str,
        scope: Optional[str],
        kind: str,
        phase: str = "forward",
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

    def counterparts(self, entry: Entry) -> List[Entry]:
        """The entries of ``entry``'s path (the same keys from the root) in the other strata."""
        keys: List[Any] = []
        e: Optional[Entry] = entry
        while e is not None and e.depth >= 0:
            keys.append(e.key)
            e = e.parent
        out = []
        for stratum in self.strata:
            node: Optional[Entry] = stratum.root
            for k in reversed(keys):
                node = node.children.get(k) if node is not None else None
            if node is not None and node is not entry:
                out.append(node)
        return out

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

        This is the hot path of every CPU-timed step: an append to the entry's buffer,
        folded every :data:`FOLD_AT` durations (see the module docstring).
        """
        if entry.retired is True:  # a reset's (not set aside)
            entry = self.relocate(entry)
        buf = entry.buf
        buf.append(ns)
        if error or len(buf) >= FOLD_AT:
            with self._lock:
                if error:
                    entry.errors += 1
                fold_buffer(entry)

    def fold(self, entry: Entry) -> None:
        """Fold ``entry``'s buffered durations into its statistics (writers that append to
        ``entry.buf`` themselves call it when the buffer reaches ``FOLD_AT``)."""
        with self._lock:
            fold_buffer(entry)

    def record_sampled(self, entry: Entry, ns: int) -> None:
        """Add the duration of a call chosen at random for timing (see :attr:`Entry.rcount`)."""
        with self._lock:
            if entry.retired is True:  # a reset's (not set aside)
                entry = self._relocate_locked(entry)
            entry.buf.append(ns)
            entry.rcount += 1
            entry.rtotal += ns
            if len(entry.buf) >= FOLD_AT:
                fold_buffer(entry)

    def record_skipped(self, entries: List[Entry]) -> None:
        """Count one call of each of ``entries`` that was not timed, by choice (sampling).

        An append (atomic, no lock), counted when the registry is read or :data:`SKIPS_FOLD_AT`
        are queued.
        """
        skips = self._skips
        skips.append(entries)
        if len(skips) >= SKIPS_FOLD_AT:
            with self._lock:
                self._fold_skips_locked()

    def _fold_skips_locked(self) -> None:
        skips = self._skips
        while skips:
            try:
                entries = skips.popleft()
            except IndexError:  # another thread folded the last one
                return
            for entry in entries:
                if entry.retired is True:  # a reset's (not set aside)
                    entry = self._relocate_locked(entry)
                entry.skipped += 1

    def record_untimed(self, entry: Entry, error: bool = False) -> None:
        """Count a call that could not be timed (CUDA-graph capture, an unreadable event)."""
        with self._lock:
            if entry.retired is True:  # a reset's (not set aside)
                entry = self._relocate_locked(entry)
            entry.untimed += 1
            if error:
                entry.errors += 1

    def record_pending(
        self,
        entry: Entry,
        start: Any,
        end: Any,
        device: int,
        error: bool = False,
        sampled: bool = False,
        slot: Optional[GpuSlot] = None,
        t1: Optional[int] = None,
        host: int = 0,
    ) -> None:
        """Queue a CUDA event pair for ``entry`` (taken from ``device``'s pool), folded in
        when read (:class:`~instrumented_convs.core.clocks.pending.PendingTimes`);
        ``sampled``: as :meth:`record_sampled`; ``slot``: the call's place on the timeline's
        GPU track, whose times are set then (:mod:`.timeline`); ``t1``: the CPU clock when
        ``end`` was recorded and ``host`` the call's host time (ns), for its lag."""
        with self._lock:
            if entry.retired is True:  # a reset's (not set aside)
                entry = self._relocate_locked(entry)
            if error:
                entry.errors += 1
            self.pending.add(entry, start, end, device, sampled, slot, t1, host)

    def fold_device(
        self, entry: Entry, ns: Optional[int], sampled: bool, host: int, lag: Optional[int]
    ) -> None:
        """Fold one resolved CUDA pair (the C clock's uncommon cases: sampled, retired,
        unreadable); see :meth:`_fold_locked`."""
        with self._lock:
            if entry.retired is True:
                entry = self._relocate_locked(entry)
            self._fold_locked(entry, ns, sampled, host, lag)

    def _fold_locked(
        self,
        entry: Entry,
        ns: Optional[int],
        sampled: bool = False,
        host: int = 0,
        lag: Optional[int] = None,
    ) -> None:
        """Fold one resolved CUDA duration (None: unreadable, untimed) into ``entry``, with
        its host time and lag when the lag was read (see :class:`EntryStats`)."""
        if ns is None:
            entry.untimed += 1
            return
        entry.buf.append(ns)
        if sampled:
            entry.rcount += 1
            entry.rtotal += ns
        if lag is not None:
            entry.host += host
            entry.dcalls += 1
            entry.lag += lag
            entry.caught += lag < LAG_FLOOR_NS
        if len(entry.buf) >= FOLD_AT:
            fold_buffer(entry)

    def add(self, path: str, seconds: float, scope: Optional[str] = None) -> None:
        """Record a duration in seconds for a ``/``-separated step path, outside any step."""
        entry = self.root
        names = path.split("/")
        if not all(names):
            raise ValueError(f"a step path is names joined by '/', not {path!r}")
        for name in names:
            entry = self.child(entry, name, scope)
        self.record(entry, int(round(seconds * 1e9)))

    # -- strata (the duty cycle) ---------------------------------------------------------
    def sampled(self, every: int) -> Stratum:
        """A new stratum for iterations recorded one in ``every`` (not yet the current one)."""
        with self._lock:
            stratum = Stratum(every)
            self.strata.append(stratum)
            return stratum

    def use(self, stratum: Stratum, stack: Optional[List[Any]] = None) -> None:
        """Make ``stratum``'s tree the current one. The entries of the steps open on
        ``stack`` (the calling thread's) that belong to another tree are set aside (see the
        module docstring); those set aside before that belong to ``stratum`` are back."""
        if stratum is self.stratum:
            return
        with self._lock:
            if stratum not in self.strata:  # a stratum of before a reset: nothing to record in
                return
            root = stratum.root
            keep = []
            for e in self._aside:
                if e.retired is ASIDE:
                    if _root_of(e) is root:
                        e.retired = False
                    else:
                        keep.append(e)
            for frame in stack or ():
                e = frame.entry
                if isinstance(e, Entry) and e.retired is False and e.depth >= 0:
                    if _root_of(e) is not root:
                        e.retired = ASIDE
                        keep.append(e)
            self._aside = keep
            self.stratum = stratum
            self.root = root

    def relate(self, scope: str, relation: Optional[str]) -> None:
        """Say that the steps of ``scope`` compute ``relation`` of a heterogeneous model (an
        edge type); None forgets it. Snapshots carry it in each entry of the scope."""
        with self._lock:
            if relation is None:
                self.relations.pop(scope, None)
            else:
                self.relations[scope] = relation

    def reset(self) -> None:
        """Forget every recorded time (the timeline too) and start a new tree.

        Steps open during the reset are recorded, whole, into the new tree when they close,
        and steps opened inside them later nest under them there as usual. The strata start
        again: an exact one, and one for the current rate if a sampled one is current (it
        is the current one then, its counts at zero).
        """
        with self._lock:
            self.pending.clear()
            self._skips.clear()
            _timeline.clear()
            for stratum in self.strata:
                old = stratum.root
                old.retired = True
                for e in old.walk():
                    e.retired = True
            self._aside = []
            self.generation += 1
            every = self.stratum.every
            self.strata = [Stratum()]
            if every:
                self.strata.append(Stratum(every))
            self.stratum = self.strata[-1]
            self.root = self.stratum.root
        _nvtx.mark_reset()  # a report read back drops what ended before it

    # -- reading ------------------------------------------------------------------------
    def resolve(self) -> int:
        """Fold every pending CUDA event pair (waits for them); return how many."""
        with self._lock:
            return self.pending.drain()

    def _fold_all_locked(self) -> List[Entry]:
        self._fold_skips_locked()
        entries = [e for stratum in self.strata for e in stratum.root.walk()]
        for e in entries:
            if e.buf:
                fold_buffer(e)
        return entries

    def entries(self) -> List[Entry]:
        """Every entry, depth first, its statistics up to date (pending CUDA times resolved);
        stratum by stratum (the exact one first)."""
        self.resolve()
        with self._lock:
            return self._fold_all_locked()

    def _weights_locked(self) -> List[float]:
        """Each stratum's weight: its iterations over those it recorded (1 when exact). A
        sampled stratum that has recorded nothing yet hands its iterations to the sampled
        stratum before it (their rate's estimate stands for them)."""
        weights = [1.0] * len(self.strata)
        carry = 0
        for i in range(len(self.strata) - 1, 0, -1):
            s = self.strata[i]
            if not s.recorded + s.open:
                carry += s.iterations
                continue
            weights[i] = (s.iterations + s.open + carry) / (s.recorded + s.open)
            carry = 0
        return weights

    def snapshot(
        self, readers: Sequence[Callable[[Entry], Optional[Dict[str, Any]]]] = ()
    ) -> List[EntryStats]:
        """Every entry as plain data, depth first (after resolving pending CUDA times): an
        :class:`~.entry.EntryStats` each (raw statistics, integer ns, its counters, the
        index of its parent record, -1 at the top level, and its stratum's weight), all a
        summary is made of."""
        self.resolve()
        with self._lock:
            entries = self._fold_all_locked()
            index = {id(e): i for i, e in enumerate(entries)}
            weight = {id(s.root): w for s, w in zip(self.strata, self._weights_locked())}
            out = [e.stats(index.get(id(e.parent), -1)) for e in entries]
            relations = self.relations
            for i, e in enumerate(entries):
                w = weight[id(_root_of(e))]
                if w != 1.0:
                    out[i] = out[i]._replace(weight=w)
                if relations and e.scope in relations:
                    out[i] = out[i]._replace(relation=relations[e.scope])
        for read in readers:  # fields others keep per entry (the meters': meters.readings)
            for i, e in enumerate(entries):
                fields = read(e)
                if fields is not None:
                    out[i] = out[i]._replace(**fields)
        return out


#: The process-wide registry every step writes to.
registry = Registry()
_events.bind_folds(registry.fold_device, Entry)  # the C clock folds with these


def backward_parent(stack: List[Any], fwd_stack: List[Any]) -> Any:
    """The entry a backward's rows nest under: the step open on this thread (``stack``), else
    (a CUDA device thread, where none is) the one open on the forward's thread, else the root."""
    parent = stack[-1].entry
    if parent is None:
        parent = fwd_stack[-1].entry if fwd_stack is not stack else None
        if parent is None:
            parent = registry.root
    return parent
