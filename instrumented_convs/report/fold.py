"""A table's rows of many relations folded: a knowledge graph's model has hundreds of relations,
and a table by layer or by relation shows the steps of its largest ones, the rest as one line
each (:func:`fold`). JSON, CSV and the page keep every row.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Sequence, Tuple

from .row import Row

__all__ = ["SHOWN", "fold", "SUMMED"]

#: How many relations a table shows among rows of the same step (the largest by total).
SHOWN = 10

#: What a folded line adds up of its rows (the other columns are left empty there).
SUMMED = ("count", "total", "self_time", "fraction", "self_fraction", "estimated", "sampled")


def _label(row: Row, by: str) -> Optional[str]:
    return row.scope if by == "layer" else row.relation if by == "relation" else None


def fold(rows: Sequence[Row], by: str, shown: int = SHOWN) -> List[Tuple[Row, int]]:
    """``rows`` (tree order) with, among the siblings of one step (same parent, path and
    phase) that compute more than ``shown`` relations, only the rows of the ``shown`` largest
    relations kept with their descendants (by layer: a relation's layers added to rank it):
    the others are one row at the place of the first left out, their counts and times added
    up (:data:`SUMMED`), paired with how many rows it folds (0 for a row shown as it is)."""
    if by not in ("layer", "relation") or not any(r.relation for r in rows):
        return [(r, 0) for r in rows]
    parent_of: List[int] = []
    open_at: Dict[int, int] = {}  # depth -> index of the last row there
    for i, r in enumerate(rows):
        parent_of.append(open_at.get(r.depth - 1, -1) if r.depth else -1)
        open_at[r.depth] = i
    groups: Dict[Tuple[int, str, str], List[int]] = {}
    for i, r in enumerate(rows):
        if r.relation is not None and _label(r, by) is not None:
            groups.setdefault((parent_of[i], r.name, r.phase), []).append(i)
    hidden: Dict[int, List[int]] = {}  # the first row left out -> the rows it stands for
    dropped = set()
    for members in groups.values():
        totals: Dict[Optional[str], float] = {}  # per relation (by layer: its layers added)
        for i in members:
            totals[rows[i].relation] = totals.get(rows[i].relation, 0.0) + rows[i].total
        if len(totals) <= shown:
            continue
        kept = set(sorted(totals, key=lambda k: -totals[k])[:shown])
        out = [i for i in members if rows[i].relation not in kept]
        hidden[out[0]] = out
        dropped.update(out)
    if not hidden:
        return [(r, 0) for r in rows]
    result: List[Tuple[Row, int]] = []
    skip_below: Optional[int] = None  # the depth of a dropped row whose descendants go too
    for i, r in enumerate(rows):
        if skip_below is not None and r.depth > skip_below:
            continue
        skip_below = None
        if i in dropped:
            skip_below = r.depth
            if i in hidden:
                result.append((_summed([rows[j] for j in hidden[i]]), len(hidden[i])))
            continue
        result.append((r, 0))
    return result


def _summed(rows: List[Row]) -> Row:
    """One row standing for ``rows``: the first's path, the sums of :data:`SUMMED`, no label."""
    sums = {name: sum(getattr(r, name) for r in rows) for name in SUMMED}
    count = sums["count"]
    return dataclasses.replace(
        rows[0], scope=None, relation=None, mean=sums["total"] / count if count else 0.0, **sums
    )
