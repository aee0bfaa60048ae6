"""The text table of a summary: units, labels, and the renderer that only reads rows.

:class:`TableRenderer` takes one summary object (anything with ``rows``, ``by`` and
``total``, and ``world_size`` when merged over ranks; in practice
:class:`~instrumented_convs.report.Summary`) and returns
the table of the original study, extended with self time, spread and nesting. A summary
merged over processes gets two more columns per step: the slowest rank's total (and which
rank it was) and the spread, slowest over fastest rank, so a straggler shows at a glance.
This module imports nothing from the package: ``report`` re-exports what users need.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

#: Time units a table can use, largest first: (name, seconds per unit).
UNITS: Tuple[Tuple[str, float], ...] = (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9))
#: The label suffix of backward rows in the table (and of their NVTX ranges).
BACKWARD_MARK = " [backward]"
#: After the name of a layer running upstream's own forward (a row of kind ``upstream``).
UPSTREAM_MARK = " (upstream code)"


def choose_unit(seconds: Sequence[float]) -> Tuple[str, float]:
    """The unit in which the largest of ``seconds`` reads between 1 and 1000."""
    largest = max((abs(s) for s in seconds), default=0.0)
    for name, scale in UNITS:
        if largest >= scale:
            return name, scale
    return UNITS[-1]


def spread_text(row: Any, world_size: int) -> str:
    """A merged row's spread cell: ``1.08x``, and ``k/n`` when only k of n ranks ran it."""
    spread = row.spread
    if spread is None:
        return "-"
    text = "inf" if spread == float("inf") else f"{spread:.2f}x"
    if row.ranks is not None and row.ranks < world_size:
        text += f" {row.ranks}/{world_size}"
    return text


class TableRenderer:
    """Renders a :class:`~instrumented_convs.report.Summary` as the study's table, extended.

    Columns: Event (indented by depth), Count, Average, Total, Self, Min, Max, Std, Frac.;
    for a summary merged over ranks also Slowest (the slowest rank's total, ``r<rank>``)
    and Spread (slowest / fastest rank's total), unless ``spread=False``. One time unit for
    the whole table, chosen so the largest average reads between 1 and 1000, and stated in
    the title line.
    """

    COLUMNS = ("Count", "Average", "Total", "Self", "Min", "Max", "Std", "Frac.")
    SPREAD_COLUMNS = ("Slowest", "Spread")

    def __init__(
        self, unit: Optional[str] = None, title: str = "Timer summary", spread: bool = True
    ) -> None:
        """A renderer with a fixed ``unit`` (or automatic), a title, and the spread columns."""
        self.unit = unit
        self.title = title
        self.spread = spread

    def render(self, summary: Any) -> str:
        """The table as a string (no trailing newline)."""
        rows = summary.rows
        if self.unit is not None:
            unit, scale = self.unit, dict(UNITS)[self.unit]
        else:
            unit, scale = choose_unit([r.mean for r in rows])
        by_layer = summary.by == "layer"
        world = getattr(summary, "world_size", None)
        spread = self.spread and world is not None
        labels = [
            ("  " * r.depth) + "- " + r.step + (BACKWARD_MARK if r.phase == "backward" else "")
            + (UPSTREAM_MARK if r.kind == "upstream" else "")
            for r in rows
        ]  # fmt: skip
        event_w = max([30] + [len(label) for label in labels])
        layer_w = max([5] + [len(r.scope or "") for r in rows]) if by_layer else 0

        def num(seconds: float, estimate: bool = False) -> str:
            return ("~" if estimate else "") + f"{seconds / scale:.3f}"

        columns = self.COLUMNS + (self.SPREAD_COLUMNS if spread else ())
        cells: List[List[str]] = []
        for r in rows:
            est = bool(r.estimated)
            cells.append(
                [
                    str(r.count),
                    num(r.mean, est),
                    num(r.total, est),
                    num(r.self_time, est),
                    num(r.min),
                    num(r.max),
                    num(r.std),
                    ("~" if est else "") + f"{100.0 * r.fraction:.1f}%",
                ]
            )
            if spread:
                slowest = "-" if r.slowest is None else f"{num(r.slowest)} r{r.slowest_rank}"
                cells[-1] += [slowest, spread_text(r, world)]
        widths = [max([len(col)] + [len(c[i]) for c in cells]) for i, col in enumerate(columns)]
        header = "  " + "Event".ljust(event_w)
        if by_layer:
            header += " | " + "Layer".ljust(layer_w)
        header += "".join(" | " + col.rjust(w) for col, w in zip(columns, widths))
        width = len(header)
        merged = f", {world} ranks merged" if world is not None else ""
        head = f"--- {self.title}{merged} (times in {unit}) "
        lines = [head + "-" * max(3, width - len(head)), header]
        for r, label, c in zip(rows, labels, cells):
            line = label.ljust(event_w + 2)
            if by_layer:
                line += " | " + (r.scope or "").ljust(layer_w)
            line += "".join(" | " + v.rjust(w) for v, w in zip(c, widths))
            lines.append(line)
        lines.append("-" * width)
        total = summary.total
        lines.append(
            f"Frac.: share of the total of top-level steps ({total / scale:.3f} {unit}); "
            "a step's Frac. = its Self share + its children's Frac."
        )
        if world is not None:
            lines.append(
                f"Count, times and Frac. are over all {world} ranks: counts and totals summed, "
                "Min and Max over every rank's calls."
            )
        if spread:
            lines.append(
                "Slowest: the largest total of one rank (r<rank>); Spread: slowest / fastest "
                "rank's total, over the ranks that ran the step (k/n: only k of n ranks did)."
            )
        sampled = [r for r in rows if r.estimated]
        if sampled:
            calls = sum(r.count for r in sampled)
            timed = calls - sum(r.estimated for r in sampled)
            lines.append(
                f"~: estimated. Of the {calls} calls in the rows marked ~, {timed} were timed "
                "(the first calls of each layer, then one in N at random; "
                "configure(backward_every=N)); Count is exact, the time of the others is the "
                "mean of those timed at random. Min, Max, Std: timed calls."
            )
        if any(r.kind == "upstream" for r in rows):
            lines.append(
                f"{UPSTREAM_MARK.strip()}: the installed release differs from our copy of the "
                "layer's forward, so its own code runs, its parts timed from outside; what "
                "they leave out (GCNConv: the bias) is in the row's Self."
            )
        notes = [f"{r.name}: {r.errors} call(s) raised" for r in rows if r.errors] + [
            f"{r.name}: {r.untimed} call(s) not timed (CUDA graph capture, or a backward "
            "that ran part of the step)"
            for r in rows
            if r.untimed
        ]
        lines.extend(notes)
        return "\n".join(lines)
