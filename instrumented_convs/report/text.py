"""The text table of a summary: the study's table, extended, drawn from the column spec.

:class:`TableRenderer` takes one summary object (anything with ``rows``, ``by`` and
``total``, and ``world_size`` when merged over ranks; in practice
:class:`~instrumented_convs.report.Summary`) and returns the table of the original study,
extended with self time, spread and nesting: a step's label (:func:`label`), its layer when
grouped by layer, then the columns of :mod:`.columns` (their headers and cells; for a
summary merged over ranks also the slowest rank's total and the spread, so a straggler
shows at a glance), and the notes the rows call for.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from ..core.storage.entry import BACKWARD_MARK
from . import columns
from .compiled import compiled_note

#: After the name of a layer running upstream's own forward (a row of kind ``upstream``).
UPSTREAM_MARK = " (upstream code)"


def label(row: Any) -> str:
    """A row's label in a table: its step, indented by depth, marked backward or upstream."""
    return (
        ("  " * row.depth)
        + "- "
        + row.step
        + (BACKWARD_MARK if row.phase == "backward" else "")
        + (UPSTREAM_MARK if row.kind == "upstream" else "")
    )


def sampling_note(sampling: Optional[Dict[str, Any]]) -> str:
    """What a sampled run's table says of its duty cycle (empty for a run recorded in full):
    how many iterations were recorded of how many, at which rate, what the marks mean, and
    (under a budget) why the rate is what it is."""
    if not sampling:
        return ""
    rates = [s for s in sampling.get("strata", ()) if s.get("every")]
    every = ", then ".join(f"one in {s['every']}" for s in rates) or f"one in {sampling['every']}"
    name = sampling.get("iteration") or "optimizer step"
    what = (
        "from one optimizer step to the next"
        if name == "optimizer step"
        else f"calls of the region {name!r}"
    )
    text = (
        f"Sampled: {sampling['recorded']} of {sampling['iterations']} iterations "
        f"({what}) recorded, {every} at random "
        f"after the first {sampling['first']}; what ran before the first iteration ended or "
        "outside iterations is recorded in full. Rows marked ~ are scaled to the whole run: "
        "Count and times are estimates, ±SE the standard error of Total (calls taken as "
        "independent); Min, Max and Std are of the recorded calls."
    )
    if sampling.get("budget") is not None:
        text += f" Budget {100 * sampling['budget']:g}%: {sampling.get('why') or ''}."
    eager = sampling.get("eager")
    if eager:
        text += " " + eager_note(eager)
    return text


def eager_note(eager: Dict[str, Any]) -> str:
    """What the eager breakdown of compiled models says (``configure(compiled="eager")``)."""
    if not eager.get("available"):
        return (
            "compiled='eager' was asked, but this torch has no torch.compiler.set_stance "
            "(2.6+): compiled code ran compiled, its layers not broken down."
        )

    def one(part: Dict[str, Any], name: str) -> str:
        ms = part.get("ms")
        return f"{name} {'?' if ms is None else f'{ms:.3g}'} ms ({part['iterations']})"

    return (
        "Compiled code ran eagerly in the recorded iterations (compiled='eager'): an "
        f"iteration took {one(eager['compiled'], 'compiled')}, "
        f"{one(eager['eager'], 'eager')} (medians, of how many iterations; the first ones "
        "left out); the steps are the eager iterations'."
    )


class TableRenderer:
    """Renders a :class:`~instrumented_convs.report.Summary` as the study's table, extended.

    Columns: Event (indented by depth), Layer (grouped by layer), then :data:`.columns.COLUMNS`
    (Count, Average, Total, Self, Min, Max, Std, Frac.; for a summary merged over ranks also
    Slowest and Spread, unless ``spread=False``). One time unit for the whole table,
    :func:`.columns.unit_of`, stated in the title line.
    """

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
        unit, scale = columns.unit_of(rows, self.unit)
        by_layer = summary.by == "layer"
        world = getattr(summary, "world_size", None)
        spread = self.spread and world is not None
        labels = [label(r) for r in rows]
        event_w = max([30] + [len(text) for text in labels])
        layer_w = max([5] + [len(r.scope or "") for r in rows]) if by_layer else 0
        shown = columns.shown(
            world is not None,
            self.spread,
            sampled=getattr(summary, "sampling", None) is not None,
            memory=columns.recorded_memory(rows),
        )
        cols = [c.header for c in shown]
        over = getattr(summary, "over", "ranks")
        cells: List[List[str]] = [
            [columns.cell(c, r, scale, world, over) for c in shown] for r in rows
        ]
        widths = [max([len(col)] + [len(c[i]) for c in cells]) for i, col in enumerate(cols)]
        header = "  " + "Event".ljust(event_w)
        if by_layer:
            header += " | " + "Layer".ljust(layer_w)
        header += "".join(" | " + col.rjust(w) for col, w in zip(cols, widths))
        width = len(header)
        merged = f", {world} {over} merged" if world is not None else ""
        one = over[:-1]
        head = f"--- {self.title}{merged} (times in {unit}) "
        lines = [head + "-" * max(3, width - len(head)), header]
        for r, text, c in zip(rows, labels, cells):
            line = text.ljust(event_w + 2)
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
                f"Count, times and Frac. are over all {world} {over}: counts and totals summed, "
                f"Min and Max over every {one}'s calls."
            )
        if spread:
            lines.append(
                f"Slowest: the largest total of one {one} ({over[0]}<{one}>); Spread: slowest "
                f"/ fastest {one}'s total, over the {over} that ran the step (k/n: only k of n "
                f"{over} did)."
            )
        if columns.recorded_memory(rows):
            lines.append(
                "Saved/call: bytes of the tensors a step made that autograd kept for backward, "
                "per call; Peak: the most bytes alive above a call's start (memory: "
                "summary.table(memory=True) says more)."
            )
        compiled = compiled_note(summary)
        if compiled:
            lines.append(compiled)
        note = sampling_note(getattr(summary, "sampling", None))
        if note:
            lines.append(note)
        sampled = [r for r in rows if r.estimated]
        if sampled and note:
            lines.append(
                "~ also marks backward rows timed in part: in the recorded iterations the "
                "first calls of each layer, then one in N at random "
                "(configure(backward_every=N)); the others' time is the mean of those timed "
                "at random."
            )
        elif sampled:
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
