"""The arithmetic of a summary, in one place: from raw per-entry statistics to rows.

The registry hands over a snapshot, a list of
:class:`~instrumented_convs.core.storage.entry.EntryStats`
(plain data: integer nanoseconds and the index of each record's parent); :func:`summarize` groups it
by step path (merging layer instances) or by layer, computes self time, mean, standard deviation and
the fractions of the grand total, and returns a :class:`~instrumented_convs.report.Summary`.
:func:`merge_ranks` does the same for the snapshots of several processes, merged. Nothing here knows
how the numbers were measured, stored or gathered.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..core.storage.entry import EntryStats
from .row import Row
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


def check_by(by: str) -> None:
    """Raise ValueError unless ``by`` is a grouping a summary knows: ``step`` or ``layer``."""
    if by not in ("step", "layer"):
        raise ValueError(f"by must be 'step' or 'layer', not {by!r}")


def estimated_total(s: EntryStats) -> float:
    """The total of every call of ``s`` in ns: the timed ones, plus the ``skipped`` ones at
    the mean of the calls timed at random (at the mean of all timed calls while no call was
    timed at random yet). Exact (an integer) when nothing was skipped."""
    if not s.skipped:
        return s.total
    if s.rcount:
        return s.total + s.skipped * s.rtotal / s.rcount
    return s.total + (s.skipped * s.total / s.count if s.count else 0)


def _inclusive_counters(stats: Sequence[EntryStats]) -> List[Optional[tuple]]:
    """Per record, its counters with its descendants' added (as a total includes its
    children's): ``(flops, bytes read, bytes written, ops, {unknown op: n}, allocated)``, or
    None where nothing in its subtree was counted."""
    out: List[Optional[tuple]] = [None] * len(stats)
    for i in range(len(stats) - 1, -1, -1):  # depth first: children come after their parent
        s = stats[i]
        if not s.ops and out[i] is None:
            continue
        own = out[i] or (0, 0, 0, 0, {}, 0)
        unknown = dict(own[4])
        for item in filter(None, s.unknown.split(";")):
            op, n = item.rsplit(":", 1)
            unknown[op] = unknown.get(op, 0) + int(n)
        mine = (
            own[0] + s.flops,
            own[1] + s.bytes_read,
            own[2] + s.bytes_written,
            own[3] + s.ops,
            unknown,
            own[5] + s.alloc_bytes,
        )
        out[i] = mine
        if s.parent >= 0:
            up = out[s.parent] or (0, 0, 0, 0, {}, 0)
            merged = dict(up[4])
            for op, n in unknown.items():
                merged[op] = merged.get(op, 0) + n
            out[s.parent] = (
                up[0] + mine[0],
                up[1] + mine[1],
                up[2] + mine[2],
                up[3] + mine[3],
                merged,
                up[5] + mine[5],
            )
    return out


def summarize(
    stats: Sequence[EntryStats],
    by: str = "step",
    unit: Optional[str] = None,
    sampling: Optional[Dict[str, Any]] = None,
    compiled: Optional[Dict[str, Any]] = None,
) -> Summary:
    """Group ``stats`` (a registry snapshot, depth first) into a :class:`Summary`.

    ``by="step"`` merges each step path across layer instances; ``by="layer"`` keeps one
    row per (layer instance, step path). Rows come in tree order, siblings in order of first
    use; rows that recorded nothing are left out. Fractions are shares of the grand total
    (the sum of the top-level rows), so they add up at every depth. Calls counted but not
    timed (backward sampling) are in the counts, and their time is estimated per entry
    (:func:`estimated_total`) before entries are merged; ``Row.estimated`` says how many.

    A sampled run (the duty cycle; ``sampling``: what it says of itself, kept with the
    summary): an entry of ``weight`` w stands for w times its calls, so its counts, times
    and counters are scaled by w before entries are merged; ``Row.sampled`` says how many
    calls were recorded so, and ``Row.se`` is the standard error of the scaled total (a
    sample of 1/w of the iterations, without replacement, its calls taken as independent:
    w²(1 - 1/w) calls s², s the calls' standard deviation). ``compiled``: what ran under
    ``torch.compile`` (:attr:`Summary.compiled`), kept with the summary.
    """
    check_by(by)
    layer = by == "layer"
    totals = [estimated_total(s) * s.weight for s in stats]
    child_total: List[float] = [0] * len(stats)
    for s, t in zip(stats, totals):
        if s.parent >= 0:
            child_total[s.parent] += t
    counted = _inclusive_counters(stats)
    saved = [s.saved_bytes * s.weight for s in stats]  # a step's includes its children's
    for i in range(len(stats) - 1, -1, -1):  # depth first: children come after their parent
        if stats[i].parent >= 0:
            saved[stats[i].parent] += saved[i]

    groups: Dict[_GroupKey, Dict[str, Any]] = {}
    children_of: Dict[_GroupKey, List[_GroupKey]] = {_TOP: []}
    for i, s in enumerate(stats):
        key = (s.scope if layer else None, s.path, s.phase)
        g = groups.get(key)
        if g is None:
            g = groups[key] = dict(
                name=s.path,
                step=s.name,
                depth=s.depth,
                kind=s.kind,
                scope=key[0],
                phase=s.phase,
                count=0,
                calls=0.0,
                recorded=0,
                scaled=False,
                var=0.0,
                total=0,
                timed=0,
                sumsq=0,
                min=None,
                max=0,
                self=0,
                errors=0,
                untimed=0,
                skipped=0,
                flops=0,
                bytes_read=0,
                bytes_written=0,
                ops=0,
                unknown={},
                alloc_bytes=0,
                cuda_calls=0,
                cuda_left=0,
                cuda_peak=0,
                saved_bytes=0.0,
                mem_calls=0,
                peak_bytes=0,
                saved_aside=0,
            )
            if s.parent < 0:
                pkey = _TOP
            else:
                p = stats[s.parent]
                pkey = (p.scope if layer else None, p.path, p.phase)
            children_of.setdefault(pkey, []).append(key)
            children_of[key] = []
        if s.count:
            g["min"] = s.min if g["min"] is None else min(g["min"], s.min)
            g["max"] = max(g["max"], s.max)
        w = s.weight
        g["count"] += s.count
        g["calls"] += (s.count + s.skipped) * w
        g["recorded"] += s.count + s.skipped
        if w != 1.0 and s.count + s.skipped:
            g["scaled"] = True
            g["var"] += (
                w * w * (1 - 1 / w) * (s.count + s.skipped) * _variance(s.count, s.total, s.sumsq)
            )
        g["total"] += totals[i]
        g["timed"] += s.total
        g["sumsq"] += s.sumsq
        g["self"] += totals[i] - child_total[i]
        g["errors"] += s.errors
        g["untimed"] += s.untimed
        g["skipped"] += s.skipped
        g["cuda_calls"] += s.cuda_calls  # a call's CUDA memory is read with its children in
        g["cuda_left"] += s.cuda_left
        g["cuda_peak"] = max(g["cuda_peak"], s.cuda_peak)
        g["saved_bytes"] += saved[i]
        g["mem_calls"] += s.mem_calls
        g["peak_bytes"] = max(g["peak_bytes"], s.peak_bytes)
        g["saved_aside"] += s.saved_aside
        if counted[i] is not None:
            flops, read, written, ops, unknown, allocated = counted[i]
            g["alloc_bytes"] += round(allocated * w)
            g["flops"] += round(flops * w)
            g["bytes_read"] += round(read * w)
            g["bytes_written"] += round(written * w)
            g["ops"] += round(ops * w)
            for op, n in unknown.items():
                g["unknown"][op] = g["unknown"].get(op, 0) + round(n * w)

    order: List[_GroupKey] = []
    todo = list(reversed(children_of[_TOP]))
    while todo:  # depth first, siblings in order of first use
        key = todo.pop()
        order.append(key)
        todo.extend(reversed(children_of.get(key, ())))

    grand = sum(groups[k]["total"] for k in order if groups[k]["depth"] == 0)
    rows = []
    for k in order:
        g = groups[k]
        n = g["count"]  # timed calls
        calls = round(g["calls"])  # and those estimated, scaled to the whole run if sampled
        if n + g["skipped"] == 0 and g["untimed"] == 0 and g["errors"] == 0:
            continue
        rows.append(
            Row(
                name=g["name"],
                step=g["step"],
                depth=g["depth"],
                scope=g["scope"],
                kind=g["kind"],
                count=calls,
                total=g["total"] * 1e-9,
                self_time=g["self"] * 1e-9,
                mean=(g["total"] / g["calls"] * 1e-9) if g["calls"] else 0.0,
                min=(g["min"] or 0) * 1e-9,
                max=g["max"] * 1e-9,
                std=_std_seconds(n, g["timed"], g["sumsq"]),
                fraction=(g["total"] / grand) if grand else 0.0,
                self_fraction=(g["self"] / grand) if grand else 0.0,
                errors=g["errors"],
                untimed=g["untimed"],
                phase=g["phase"],
                estimated=g["skipped"],
                flops=g["flops"],
                bytes_read=g["bytes_read"],
                bytes_written=g["bytes_written"],
                ops=g["ops"],
                unknown=";".join(f"{k}:{n}" for k, n in sorted(g["unknown"].items())),
                alloc_bytes=g["alloc_bytes"],
                cuda_calls=g["cuda_calls"],
                cuda_left=g["cuda_left"],
                cuda_peak=g["cuda_peak"],
                saved_bytes=round(g["saved_bytes"]),
                mem_calls=g["mem_calls"],
                peak_bytes=g["peak_bytes"],
                saved_aside=g["saved_aside"],
                sampled=g["recorded"] if g["scaled"] else 0,
                se=math.sqrt(g["var"]) * 1e-9,
            )
        )
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
        own = summarize(stats, by=by, unit=unit, sampling=sampling)
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
    merged = summarize(combined, by=by, unit=unit, sampling=sampling)

    seen: Dict[Tuple[Optional[str], str, str], List[Tuple[float, int]]] = {}
    for rank, part in enumerate(parts):
        for r in part.rows:
            if r.count:  # a rank whose calls were all untimed has no total to compare
                seen.setdefault((r.scope, r.name, r.phase), []).append((r.total, rank))
    rows = []
    for r in merged.rows:
        totals = seen.get((r.scope, r.name, r.phase), [])
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
