"""Two summaries side by side: per step, the change in mean time and whether it is real.

A diff says whether a change is more than noise, from what both runs recorded (spread and
calls), so that a slower step is not reported on one noisy run. It imports nothing above
the row and table helpers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from ..core.storage.entry import BACKWARD_MARK
from . import memory, page
from .columns import UNITS, choose_unit

__all__ = ["DiffRow", "SummaryDiff", "diff", "MIN_CHANGE", "MIN_CHANGE_US"]

#: The relative floor: a change under this share of the baseline's mean is no change that
#: counts (``diff --min-change``, in %, defaults to it).
MIN_CHANGE = 0.05
#: The absolute floor, µs a call: a change under it is below what a user can act on.
MIN_CHANGE_US = 1.0

Key = Tuple[str, str, Optional[str], Optional[str]]  # (path, phase, scope, relation)


@dataclass(frozen=True)
class DiffRow:
    """One step in two runs: ``a`` and ``b`` are its rows (``None`` where it is absent)."""

    name: str  #: the step path
    step: str  #: its last component
    depth: int  #: 0 at the top level
    phase: str  #: ``forward`` or ``backward``
    scope: Optional[str]  #: the layer instance (by layer), or the relation (by relation)
    a: Any  #: the baseline's Row, or ``None`` (an added step)
    b: Any  #: the candidate's Row, or ``None`` (a missing step)
    change: Optional[float]  #: b's mean - a's mean, seconds per call
    relative: Optional[float]  #: change / a's mean
    error: Optional[float]  #: standard error of the change (None: fewer than 2 timed calls)
    verdict: str  #: slower, faster, unchanged, too noisy, added, missing, untimed


def _timed(row: Any) -> int:
    """The calls of ``row`` that were timed: of those recorded, in a sampled run."""
    return (row.sampled or row.count) - row.estimated


def _verdict(
    a: Any, b: Any, min_change: float, min_change_us: float = MIN_CHANGE_US
) -> Tuple[Optional[float], ...]:
    """The change of ``b`` over ``a``, its share, its standard error and the verdict; the
    floor is the larger of ``min_change`` of a's mean and ``min_change_us`` a call."""
    if _timed(a) == 0 or _timed(b) == 0 or a.mean == 0:
        return None, None, None, "untimed"
    change = b.mean - a.mean
    relative = change / a.mean
    if (a.mean, a.std, _timed(a)) == (b.mean, b.std, _timed(b)):  # the same calls
        return change, relative, None, "unchanged"
    if _timed(a) < 2 or _timed(b) < 2:
        return change, relative, None, "too noisy"
    error = math.sqrt(a.std**2 / _timed(a) + b.std**2 / _timed(b))
    floor = max(min_change * a.mean, min_change_us * 1e-6)
    if abs(change) >= floor and abs(change) > 3 * error:
        return change, relative, error, "slower" if change > 0 else "faster"
    if abs(change) + 3 * error <= floor:
        return change, relative, error, "unchanged"
    return change, relative, error, "too noisy"


class SummaryDiff:
    """The rows of two summaries paired in tree order; ``str()`` is the table."""

    def __init__(
        self,
        rows: List[DiffRow],
        min_change: float,
        unit: Optional[str] = None,
        a: Any = None,
        b: Any = None,
        min_change_us: float = MIN_CHANGE_US,
    ):
        """Wrap paired ``rows``; ``min_change`` is the share of a change that counts,
        ``min_change_us`` the µs a call; ``a`` and ``b``: the two summaries (optional:
        without them, :meth:`to_html` takes each run's rows from the pairs)."""
        self.rows, self.min_change, self.unit = rows, min_change, unit
        self.a, self.b, self.min_change_us = a, b, min_change_us

    def to_html(
        self, labels: Tuple[str, str] = ("A", "B"), *, path: Any = None, **kwargs: Any
    ) -> Optional[str]:
        """A self-contained HTML page: both runs' icicles on one scale, the change per step
        and both tables (``page.diff_page``); written to ``path`` (UTF-8; None returned),
        else returned, as :meth:`.Summary.to_html`."""
        html = page.diff_page(self, self.a, self.b, labels, **kwargs)
        if path is None:
            return html
        with open(path, "w", encoding="utf-8") as f:
            f.write(html)
        return None

    def __iter__(self) -> Any:
        """The paired rows, in tree order."""
        return iter(self.rows)

    def worse_than(self, share: float) -> List[DiffRow]:
        """Rows judged ``slower`` by more than ``share`` (0.05: 5%) of the baseline's mean."""
        return [r for r in self.rows if r.verdict == "slower" and (r.relative or 0) > share]

    def table(self, unit: Optional[str] = None, title: str = "a -> b") -> str:
        """The table: mean per call in each run, the change, its share, the verdict."""
        means = [r.mean for d in self.rows for r in (d.a, d.b) if r is not None]
        unit = unit or self.unit
        name, scale = (unit, dict(UNITS)[unit]) if unit else choose_unit(means)
        labels = [
            "  " * d.depth + "- " + d.step + (BACKWARD_MARK if d.phase == "backward" else "")
            for d in self.rows
        ]
        layer = any(d.scope for d in self.rows)
        cols = ("a mean", "b mean", "change", "change %", "+-3se %", "verdict")
        cells = []
        for d in self.rows:
            pct = "" if d.relative is None else f"{100 * d.relative:+.1f}%"
            err = "" if d.error is None or not d.a.mean else f"{300 * d.error / d.a.mean:.1f}%"
            cells.append(
                [
                    "-" if d.a is None else f"{d.a.mean / scale:.3f}",
                    "-" if d.b is None else f"{d.b.mean / scale:.3f}",
                    "" if d.change is None else f"{d.change / scale:+.3f}",
                    pct,
                    err,
                    d.verdict,
                ]
            )
        event_w = max([30] + [len(x) for x in labels])
        layer_w = max([5] + [len(d.scope or "") for d in self.rows]) if layer else 0
        widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(cols)]
        group = "Relation" if getattr(self.a, "by", "step") == "relation" else "Layer"
        header = "  " + "Event".ljust(event_w) + (" | " + group.ljust(layer_w) if layer else "")
        header += "".join(" | " + c.rjust(w) for c, w in zip(cols, widths))
        head = f"--- {title}: mean per call (times in {name}) "
        lines = [head + "-" * max(3, len(header) - len(head)), header]
        for d, label, row in zip(self.rows, labels, cells):
            line = label.ljust(event_w + 2) + (
                " | " + (d.scope or "").ljust(layer_w) if layer else ""
            )
            lines.append(line + "".join(" | " + v.rjust(w) for v, w in zip(row, widths)))
        lines.append("-" * len(header))
        counts: Dict[str, int] = {}
        for d in self.rows:
            counts[d.verdict] = counts.get(d.verdict, 0) + 1
        lines.append(
            f"The floor: {self.floor_text()}. slower/faster: a change of the floor or more and "
            "over 3 standard errors; unchanged: within the floor even 3 standard errors out, "
            "or the same calls (a run with itself). "
            + ", ".join(f"{v}: {n}" for v, n in sorted(counts.items()))
        )
        for side, summary in (("a", self.a), ("b", self.b)):
            sampling = getattr(summary, "sampling", None)
            if sampling:
                lines.append(
                    f"{side} is a sampled run ({sampling['recorded']} of "
                    f"{sampling['iterations']} iterations recorded): its means and standard "
                    "errors are of the calls it recorded."
                )
        kept = memory.diff_text(self.rows, self.min_change)
        if kept:
            lines += ["", kept]
        return "\n".join(lines)

    def __str__(self) -> str:
        """The table."""
        return self.table()

    def floor_text(self) -> str:
        """The floor under which a change is none, in words (the table's and page's)."""
        return (
            f"{100 * self.min_change:g}% of a's mean or {self.min_change_us:g} µs a call, "
            "the larger"
        )


def diff(
    a: Any, b: Any, min_change: float = MIN_CHANGE, min_change_us: float = MIN_CHANGE_US
) -> SummaryDiff:
    """The rows of summaries ``a`` (the baseline) and ``b`` (the candidate), paired by step
    path, phase and layer, in the tree's order (rows only one side has are ``added`` or
    ``missing``), each pair with a verdict from the numbers both runs recorded, in the spirit
    of ``torch.utils.benchmark.Compare``:

    - the change is the difference of mean time per call, ``b - a``, and its share of ``a``;
    - its standard error comes from each side's standard deviation and number of timed calls;
    - the floor: the larger of ``min_change`` of ``a``'s mean and ``min_change_us`` µs a
      call (:data:`MIN_CHANGE`, :data:`MIN_CHANGE_US`);
    - ``slower`` / ``faster``: the change is at least the floor and more than three standard
      errors from zero;
    - ``unchanged``: the change is within the floor even three standard errors out, or
      both rows are the same calls (a run with itself);
    - ``too noisy``: neither can be said (few calls, or a spread wider than the change).

    Where either run recorded memory (``configure(memory=True)``), the table is followed by the
    memory's: per step what it keeps for backward per call and its peak in each run, each with
    ``more``, ``less`` or ``unchanged`` (:func:`.memory.verdict`).

    Means per call, not totals, are compared, so runs of different lengths compare, and so do a
    sampled run (the duty cycle) and a full one: a sampled row's standard error counts the calls
    it recorded, not the calls it is scaled to.
    """
    if a.by != b.by:
        raise ValueError(f"one summary is by {a.by!r}, the other by {b.by!r}: summarise both alike")
    rows_a: Dict[Key, Any] = {r.key: r for r in a.rows}
    rows_b: Dict[Key, Any] = {r.key: r for r in b.rows}
    order: List[Key] = list(rows_a)
    keys_b = list(rows_b)
    for i, key in enumerate(keys_b):  # b's own rows go after the row b has before them
        if key in rows_a:
            continue
        before = keys_b[i - 1] if i else None
        at = order.index(before) + 1 if before in order else len(order)
        order.insert(at, key)
    rows = []
    for key in order:
        ra, rb = rows_a.get(key), rows_b.get(key)
        row = ra or rb
        if ra is None or rb is None:
            change = relative = error = None
            verdict = "added" if ra is None else "missing"
        else:
            change, relative, error, verdict = _verdict(ra, rb, min_change, min_change_us)
        rows.append(
            DiffRow(
                row.name,
                row.step,
                row.depth,
                row.phase,
                row.relation if a.by == "relation" else row.scope,
                ra,
                rb,
                change,
                relative,
                error,
                verdict,
            )
        )
    return SummaryDiff(rows, min_change, a.unit or b.unit, a, b, min_change_us)
