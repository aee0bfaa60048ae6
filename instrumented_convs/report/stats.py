"""The arithmetic of a summary: from a registry snapshot (:class:`EntryStats`, integer ns)
to rows. Each statistic of a row is one :class:`Statistic` in :data:`STATISTICS`: what it
takes of an entry and of its children, how entries merge (layer instances, ranks, strata),
what the row gets. :func:`summarize` applies them; :func:`merge_ranks` merges ranks.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..core.storage.entry import EntryStats
from .compiled import unscaled
from .row import FIELDS, TOOL, Row
from .summary import Summary

_GroupKey = Tuple[Optional[str], str, str]
_TOP: _GroupKey = (None, "", "")


def _variance(n: int, total: float, sumsq: float) -> float:
    """Sample variance (ns squared) from count, sum and sum of squares; 0 under two calls."""
    if n < 2:
        return 0.0
    return max((sumsq - total * total / n) / (n - 1), 0.0)


def _std_seconds(n: int, total: int, sumsq: int) -> float:
    """Sample standard deviation in seconds from count, sum and sum of squares (ns)."""
    return math.sqrt(_variance(n, total, sumsq)) * 1e-9


#: The groupings of a summary's rows: by step path, by layer instance (scope), by relation.
BY = ("step", "layer", "relation")


def check_by(by: str) -> None:
    """Raise ValueError unless ``by`` is a grouping a summary knows (:data:`BY`)."""
    if by not in BY:
        raise ValueError(f"by must be 'step', 'layer' or 'relation', not {by!r}")


def _label(by: str) -> Callable[[EntryStats], Optional[str]]:
    """What tells an entry's row apart besides its path and phase, grouped ``by``."""
    if by == "layer":
        return attrgetter("scope")
    if by == "relation":
        return attrgetter("relation")
    return lambda s: None


def estimated_total(s: EntryStats) -> float:
    """The total of every call of ``s`` in ns: the timed ones, plus the ``skipped`` ones at
    the mean of the calls timed at random (at the mean of all timed calls while no call was
    timed at random yet). Exact (an integer) when nothing was skipped."""
    if not s.skipped:
        return s.total
    if s.rcount:
        return s.total + s.skipped * s.rtotal / s.rcount
    return s.total + (s.skipped * s.total / s.count if s.count else 0)


@dataclass(frozen=True)
class Statistic:
    """One statistic of a summary's rows, all of it in one place.

    ``name``: its name in a row (a :class:`Row` field, else a key of ``Row.extra``) and
    among the merged values that ``row`` functions read. ``of``: an entry's own share
    (None: a value of the row alone, made by ``row`` from the others'). ``children``: how
    an entry takes its children's shares: ``""`` not at all, ``"add"`` its share merges
    theirs (a step's counters include its children's), ``"less"`` its own less theirs
    (self time). ``weigh``: a share and its entry's weight (the duty cycle's strata) to
    the share merged, once its children's are in. ``merge``: how the shares of the entries
    of one row (layer instances, ranks, strata) combine, from ``start``. ``row``: the
    row's value, from the merged values and the grand total in ns (None: the merged value
    itself); ``field``: whether the row has it (False: a value that others read).
    """

    name: str
    of: Optional[Callable[[EntryStats], Any]] = None
    children: str = ""
    weigh: Optional[Callable[[Any, float], Any]] = None
    merge: Callable[[Any, Any], Any] = operator.add
    start: Any = 0
    row: Optional[Callable[[Dict[str, Any], float], Any]] = None
    field: bool = True

    def __post_init__(self) -> None:
        """Refuse what :func:`summarize` could not apply."""
        if self.children not in ("", "add", "less"):
            raise ValueError(f"{self.name}: children is '', 'add' or 'less'")
        if self.of is None and self.row is None:
            raise ValueError(f"{self.name}: a statistic has a share (of), a row, or both")


def _least(a: Optional[int], b: Optional[int]) -> Optional[int]:
    """The smaller of two values, either None when no call was timed."""
    return b if a is None else a if b is None else min(a, b)


def _op_counts(s: EntryStats) -> Dict[str, int]:
    """``{op: calls}`` of the ops no formula knows, from ``s.unknown`` (``"aten.foo:3;..."``)."""
    out: Dict[str, int] = {}
    for item in filter(None, s.unknown.split(";")):
        op, n = item.rsplit(":", 1)
        out[op] = out.get(op, 0) + int(n)
    return out


def _add_counts(a: Dict[str, int], b: Dict[str, int]) -> Dict[str, int]:
    """Two ``{op: calls}`` added up (a new dict)."""
    out = dict(a)
    for op, n in b.items():
        out[op] = out.get(op, 0) + n
    return out


def _weighed(value: int, weight: float) -> int:
    """A count of a sampled stratum's entry scaled to the whole run."""
    return round(value * weight)


def _scaled_variance(s: EntryStats) -> float:
    """What a sampled entry adds to the variance of its scaled total: w²(1 - 1/w) calls s²."""
    w, calls = s.weight, s.count + s.skipped
    if w == 1.0 or not calls:
        return 0.0
    return w * w * (1 - 1 / w) * calls * _variance(s.count, s.total, s.sumsq)


def _weighted_total(s: EntryStats) -> float:
    """The entry's total in ns (:func:`estimated_total`), scaled to the whole run."""
    return estimated_total(s) * s.weight


#: The statistics of a summary's rows (see :class:`Statistic`); add one with :func:`add`.
#: Times merge in ns; a row's are in seconds. :func:`summarize` reads ``total`` (the grand
#: total) and ``timed_calls``, ``estimated``, ``untimed``, ``errors`` (whether a row recorded
#: anything).
STATISTICS: List[Statistic] = [
    Statistic("timed_calls", attrgetter("count"), field=False),
    Statistic("calls", lambda s: (s.count + s.skipped) * s.weight, start=0.0, field=False),
    Statistic("count", row=lambda g, _: round(g["calls"])),
    Statistic("estimated", attrgetter("skipped")),
    Statistic("errors", attrgetter("errors")),
    Statistic("untimed", attrgetter("untimed")),
    Statistic("total", _weighted_total, row=lambda g, _: g["total"] * 1e-9),
    Statistic("self_time", _weighted_total, "less", row=lambda g, _: g["self_time"] * 1e-9),
    Statistic("mean", row=lambda g, _: g["total"] / g["calls"] * 1e-9 if g["calls"] else 0.0),
    Statistic(
        "min",
        lambda s: s.min if s.count else None,
        merge=_least,
        start=None,
        row=lambda g, _: (g["min"] or 0) * 1e-9,
    ),
    Statistic(
        "max", lambda s: s.max if s.count else 0, merge=max, row=lambda g, _: g["max"] * 1e-9
    ),
    Statistic("timed", attrgetter("total"), field=False),
    Statistic("sumsq", attrgetter("sumsq"), field=False),
    Statistic("std", row=lambda g, _: _std_seconds(g["timed_calls"], g["timed"], g["sumsq"])),
    Statistic("fraction", row=lambda g, grand: g["total"] / grand if grand else 0.0),
    Statistic("self_fraction", row=lambda g, grand: g["self_time"] / grand if grand else 0.0),
    # the duty cycle: the calls recorded, whether scaled, the variance of the scaled total
    Statistic("recorded", lambda s: s.count + s.skipped, field=False),
    Statistic(
        "scaled",
        lambda s: s.weight != 1.0 and s.count + s.skipped > 0,
        merge=operator.or_,
        start=False,
        field=False,
    ),
    Statistic("var", _scaled_variance, start=0.0, field=False),
    Statistic("sampled", row=lambda g, _: g["recorded"] if g["scaled"] else 0),
    Statistic("se", row=lambda g, _: math.sqrt(g["var"]) * 1e-9),
    # the counters: a step's include its children's
    *(
        Statistic(name, attrgetter(name), "add", _weighed)
        for name in ("flops", "bytes_read", "bytes_written", "ops", "alloc_bytes")
    ),
    Statistic(
        "unknown",
        _op_counts,
        "add",
        lambda ops, w: {op: round(n * w) for op, n in ops.items()},
        merge=_add_counts,
        start={},
        row=lambda g, _: ";".join(f"{k}:{n}" for k, n in sorted(g["unknown"].items())),
    ),
    # CUDA memory, read with a call's children in
    Statistic("cuda_calls", attrgetter("cuda_calls")),
    Statistic("cuda_left", attrgetter("cuda_left")),
    Statistic("cuda_peak", attrgetter("cuda_peak"), merge=max),
    # memory: what autograd saved (a step's includes its children's), peaks
    Statistic(
        "saved_bytes",
        lambda s: s.saved_bytes * s.weight,
        "add",
        start=0.0,
        row=lambda g, _: round(g["saved_bytes"]),
    ),
    Statistic("mem_calls", attrgetter("mem_calls")),
    Statistic("peak_bytes", attrgetter("peak_bytes"), merge=max),
    Statistic("saved_aside", attrgetter("saved_aside")),
    # host and device: the device-timed calls' host time and end lags (inclusive, like total)
    Statistic("host", lambda s: s.host * s.weight, start=0.0, row=lambda g, _: g["host"] * 1e-9),
    Statistic("device_calls", attrgetter("dcalls"), weigh=_weighed),
    Statistic("lag", lambda s: s.lag * s.weight, start=0.0, row=lambda g, _: g["lag"] * 1e-9),
    Statistic("caught", attrgetter("caught"), weigh=_weighed),
    Statistic("busy", lambda s: s.busy * s.weight, start=0.0, row=lambda g, _: g["busy"] * 1e-9),
]
_ROW_FIELDS = frozenset(FIELDS)


def add(statistic: Statistic) -> Statistic:
    """Add ``statistic`` to :data:`STATISTICS` (its name must be new); returns it. Rows
    then have it: as their field of that name, else in ``Row.extra``."""
    if any(s.name == statistic.name for s in STATISTICS):
        raise ValueError(f"a statistic named {statistic.name!r} exists already")
    STATISTICS.append(statistic)
    return statistic


def remove(name: str) -> Statistic:
    """Take the statistic named ``name`` out of :data:`STATISTICS`; returns it."""
    for i, s in enumerate(STATISTICS):
        if s.name == name:
            return STATISTICS.pop(i)
    raise KeyError(name)


def _shares(statistic: Statistic, stats: Sequence[EntryStats]) -> List[Any]:
    """Each entry's share of ``statistic``: its own, with its children's as the statistic
    takes them (the snapshot is depth first: children come after their parent), weighed."""
    share = [statistic.of(s) for s in stats]  # type: ignore[misc]
    if statistic.children == "add":
        for i in range(len(stats) - 1, -1, -1):
            if stats[i].parent >= 0:
                share[stats[i].parent] = statistic.merge(share[stats[i].parent], share[i])
    elif statistic.children == "less":
        below: List[Any] = [0] * len(stats)
        for s, x in zip(stats, share):
            if s.parent >= 0:
                below[s.parent] += x
        share = [x - b for x, b in zip(share, below)]
    if statistic.weigh is not None:
        share = [statistic.weigh(x, s.weight) for x, s in zip(share, stats)]
    return share


def _groups(
    stats: Sequence[EntryStats], by: str
) -> Tuple[Dict[_GroupKey, List[int]], Dict[_GroupKey, List[_GroupKey]]]:
    """The entries of each row (by step path and phase, and by layer or relation, ``by``),
    and each row's children: rows in order of first use."""
    members: Dict[_GroupKey, List[int]] = {}
    children_of: Dict[_GroupKey, List[_GroupKey]] = {_TOP: []}
    label = _label(by)
    for i, s in enumerate(stats):
        key = (label(s), s.path, s.phase)
        if key not in members:
            members[key] = []
            if s.parent < 0:
                pkey = _TOP
            else:
                p = stats[s.parent]
                pkey = (label(p), p.path, p.phase)
            children_of.setdefault(pkey, []).append(key)
            children_of[key] = []
        members[key].append(i)
    return members, children_of


def _merged(
    stats: Sequence[EntryStats], members: Dict[_GroupKey, List[int]]
) -> Dict[_GroupKey, Dict[str, Any]]:
    """Per row, each statistic's shares of its entries merged, in the entries' order."""
    out: Dict[_GroupKey, Dict[str, Any]] = {key: {} for key in members}
    for statistic in STATISTICS:
        if statistic.of is None:
            continue
        share, merge = _shares(statistic, stats), statistic.merge
        for key, entries in members.items():
            value = statistic.start
            for i in entries:
                value = merge(value, share[i])
            out[key][statistic.name] = value
    return out


def _tree_order(children_of: Dict[_GroupKey, List[_GroupKey]]) -> List[_GroupKey]:
    """The rows depth first, siblings in order of first use."""
    order: List[_GroupKey] = []
    todo = list(reversed(children_of[_TOP]))
    while todo:
        key = todo.pop()
        order.append(key)
        todo.extend(reversed(children_of.get(key, ())))
    return order


def _row(first: EntryStats, label: Optional[str], g: Dict[str, Any], grand: float, by: str) -> Row:
    """The row of the merged values ``g`` (``first``: its first entry; ``label``: its scope
    or relation, grouped ``by`` layer or relation; ``grand``: ns)."""
    fields: Dict[str, Any] = {}
    extra: Dict[str, Any] = {}
    for statistic in STATISTICS:
        if statistic.field:
            value = g[statistic.name] if statistic.row is None else statistic.row(g, grand)
            (fields if statistic.name in _ROW_FIELDS else extra)[statistic.name] = value
    if extra:
        fields["extra"] = extra
    return Row(
        name=first.path,
        step=first.name,
        depth=first.depth,
        scope=label if by == "layer" else None,
        kind=first.kind,
        phase=first.phase,
        relation=label if by == "relation" else first.relation if by == "layer" else None,
        **fields,
    )


def summarize(
    stats: Sequence[EntryStats],
    by: str = "step",
    unit: Optional[str] = None,
    sampling: Optional[Dict[str, Any]] = None,
    compiled: Optional[Dict[str, Any]] = None,
) -> Summary:
    """Group ``stats`` (a registry snapshot, depth first) into a :class:`Summary`.

    ``by="step"`` merges each step path across layer instances; ``by="layer"`` keeps one
    row per (layer instance, step path); ``by="relation"`` one per (relation of a
    heterogeneous model, step path), each relation's layers added together (steps of no
    relation merged as by step). Rows come in tree order, siblings in order of first
    use; rows that recorded nothing are left out. Fractions are shares of the grand total
    (the sum of the top-level rows), so they add up at every depth; the tool's own row
    (kind ``tool``: its one-time work) comes last, outside the grand total. Calls counted but not
    timed (backward sampling) are in the counts, and their time is estimated per entry
    (:func:`estimated_total`) before entries are merged; ``Row.estimated`` says how many.

    A sampled run (the duty cycle; ``sampling``: what it says of itself, kept with the
    summary): an entry of ``weight`` w stands for w times its calls, so its counts, times
    and counters are scaled by w before entries are merged; ``Row.sampled`` says how many
    calls were recorded so, and ``Row.se`` is the standard error of the scaled total (a
    sample of 1/w of the iterations, without replacement, its calls taken as independent:
    w²(1 - 1/w) calls s², s the calls' standard deviation). ``compiled``: what ran under
    ``torch.compile`` (:attr:`Summary.compiled`), kept with the summary. Each statistic is
    one of :data:`STATISTICS`. Under the eager breakdown nothing is scaled
    (:func:`~.compiled.unscaled`).
    """
    check_by(by)
    stats = unscaled(list(stats), sampling)
    members, children_of = _groups(stats, by)
    merged = _merged(stats, members)
    order = _tree_order(children_of)
    tool = [k for k in order if stats[members[k][0]].kind == TOOL]  # the tool's own: last
    order = [k for k in order if k not in tool] + tool
    grand = sum(
        merged[k]["total"]
        for k in order
        if stats[members[k][0]].depth == 0 and stats[members[k][0]].kind != TOOL
    )
    rows = [
        _row(stats[members[k][0]], k[0], merged[k], grand, by)
        for k in order
        if merged[k]["timed_calls"] + merged[k]["estimated"]
        or merged[k]["untimed"]
        or merged[k]["errors"]
    ]
    return Summary(rows, unit=unit, by=by, total=grand * 1e-9, sampling=sampling, compiled=compiled)


def merge_ranks(
    snapshots: Sequence[Sequence[EntryStats]],
    by: str = "step",
    unit: Optional[str] = None,
    sampling: Optional[Dict[str, Any]] = None,
    compiled: Optional[Dict[str, Any]] = None,
    over: str = "ranks",
) -> Summary:
    """One :class:`Summary` of the snapshots of several ranks (``snapshots[rank]``;
    ``over="workers"``: of a loader's worker processes, so said in its table).

    The merged rows are the summary of all the ranks' entries together: counts, totals,
    self times and squared sums add up, min and max are over every rank's calls, and a
    step that only some ranks ran still has its row (siblings in order of first use, rank
    0's first). Each merged row also says how the ranks differ: how many ranks recorded the
    step, the slowest rank's total (and which rank), and the fastest total of a rank that
    recorded it (ranks whose calls of the step were all untimed are left out of these).
    ``by_rank()`` of the result gives each rank's own summary, whose rows carry
    their ``rank``. A sampled run (``sampling``, rank 0's: every rank draws the same
    iterations) is scaled rank by rank, and the standard errors of the ranks add up in
    quadrature. ``compiled``: rank 0's, kept with the summary.
    """
    parts = []
    for rank, stats in enumerate(snapshots):
        own = summarize(stats, by=by, sampling=sampling)
        parts.append(
            Summary(
                [dataclasses.replace(r, rank=rank) for r in own.rows],
                unit=unit,
                by=by,
                total=own.total,
                sampling=sampling,
            )
        )
    combined: List[EntryStats] = []
    for stats in snapshots:
        offset = len(combined)
        combined.extend(s._replace(parent=s.parent + offset) if s.parent >= 0 else s for s in stats)
    merged = summarize(combined, by=by, sampling=sampling)

    seen: Dict[Tuple[str, str, Optional[str], Optional[str]], List[Tuple[float, int]]] = {}
    for rank, part in enumerate(parts):
        for r in part.rows:
            if r.count:  # a rank whose calls were all untimed has no total to compare
                seen.setdefault(r.key, []).append((r.total, rank))
    rows = []
    for r in merged.rows:
        totals = seen.get(r.key)
        if totals:
            slow, slow_rank = max(totals, key=lambda t: (t[0], -t[1]))  # a tie: the lowest rank
            r = dataclasses.replace(
                r,
                ranks=len(totals),
                slowest=slow,
                slowest_rank=slow_rank,
                fastest=min(t for t, _ in totals),
            )
        rows.append(r)
    out = Summary(
        rows,
        unit=unit,
        by=by,
        total=merged.total,
        per_rank=parts,
        sampling=sampling,
        compiled=compiled,
    )
    out.over = over
    return out
