"""The text table of a summary: the study's table, extended with self time, nesting and,
merged over ranks, the spread. :class:`TableRenderer` draws each row's label (:func:`label`)
and the cells of :mod:`.columns`; below the table, the shown columns' footnotes (their docs)
and the notes its rows or run call for (:data:`NOTES`).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence

from ..core.storage.entry import BACKWARD_MARK
from . import columns, hostdevice
from .compiled import compiled_note, eager_breakdown
from .fold import SUMMED, fold
from .row import TOOL

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
    eager = sampling.get("eager")
    ran_eagerly = bool(eager and eager.get("available"))
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
        "outside iterations is recorded in full. "
    )
    if ran_eagerly:  # the others ran compiled: nothing stands for them
        text += (
            f"The rows are the {sampling['recorded']} recorded iterations' own, not scaled to "
            f"the whole run (the other {sampling['iterations'] - sampling['recorded']} ran "
            "compiled)."
        )
    else:
        text += (
            "Rows marked ~ are scaled to the whole run: Count and times are estimates, ±SE "
            "the standard error of Total (calls taken as independent); Min, Max and Std are "
            "of the recorded calls."
        )
    if sampling.get("budget") is not None:
        text += f" Budget {100 * sampling['budget']:g}%: {sampling.get('why') or ''}."
    if eager:
        text += " " + eager_note(eager, sampling["first"])
    return text


def eager_note(eager: Dict[str, Any], first: Optional[int] = None) -> str:
    """What the eager breakdown of compiled models says (``configure(compiled="eager")``):
    an eager iteration's time (the table's) beside a compiled one's, medians of the
    iterations after the ``first``; where either kind never ran, why, and what to do."""
    if not eager.get("available"):
        return (
            "compiled='eager' was asked, but this torch has no torch.compiler.set_stance "
            "(2.6+): compiled code ran compiled, its layers not broken down."
        )
    left_out = "the first ones" if first is None else f"the first {first}"
    times = {
        name: f"{eager[name]['ms']:.3g} ms ({eager[name]['iterations']})"
        for name in ("eager", "compiled")
        if eager[name]["iterations"] and eager[name].get("ms") is not None
    }
    text = "Compiled code ran eagerly in the recorded iterations (compiled='eager'): "
    if len(times) == 2:
        return text + (
            f"an iteration took compiled {times['compiled']}, eager {times['eager']} "
            f"(medians, of how many iterations; {left_out} left out)."
        )
    if "eager" in times:
        return text + (
            f"an iteration took eager {times['eager']} (median, of how many; {left_out} "
            "left out). Every iteration was recorded, so none ran compiled to time beside "
            "it: record fewer (--record-every K, or configure(record_every=K)) for that."
        )
    if "compiled" in times:
        return text + (
            f"an iteration took compiled {times['compiled']} (median, of how many; "
            f"{left_out} left out); no iteration after those was recorded, so none ran "
            "eagerly to time beside it: record more (a smaller --record-every K)."
        )
    return text + (
        f"no iteration after {left_out} ended, so none was timed, eager or compiled: "
        "a longer run gives both."
    )


def empty_note(summary: Any) -> List[str]:
    """Why a table has no row, and what to try: nothing was recorded, or the filter of
    ``Summary.select`` (``view --prefix``...) matched no step, with the paths there are."""
    chosen = getattr(summary, "filtered", None)
    if not chosen:
        return [
            "Nothing was recorded: no instrumented layer ran (import the convs from "
            "instrumented_convs.pyg or .dgl, or call instrument(model)),",
            "or recording was off (configure(enabled=True); INSTRUMENTED_CONVS_DISABLE=1 "
            "turns it off),",
            "or steps pushed NVTX ranges only (configure(record='ranges')): the table is in "
            "the Nsight Systems report (view REPORT).",
        ]
    what = ", ".join(
        f"{key} {chosen[key]!r}"
        for key in ("prefix", "phase", "max_depth")
        if chosen[key] is not None
    )
    tops = ", ".join(top + "/" for top in chosen["tops"]) + (", ..." if chosen["more"] else "")
    lines = [f"The filter ({what}) matched no step: the paths start with {tops}"]
    if chosen["near"]:
        lines.append(f"A prefix starts at the top: did you mean {', '.join(chosen['near'])}?")
    elif chosen["phase"] is not None and chosen["phase"] not in chosen["phases"]:
        lines.append(f"No {chosen['phase']} step was recorded.")
    return lines


class TableRenderer:
    """Renders a :class:`~instrumented_convs.report.Summary` as the study's table, extended.

    Columns: Event (indented by depth), Layer or Relation (grouped so; the steps of the
    largest relations, the others folded: :func:`.fold.fold`), then :data:`.columns.COLUMNS`
    (Count, Average, Total, Self, Min, Max, Std, Frac.; for a summary merged over ranks also
    Slowest and Spread, unless ``spread=False``). One time unit for the whole table,
    :func:`.columns.unit_of`, stated in the title line.
    """

    def __init__(
        self,
        unit: Optional[str] = None,
        title: str = "Timer summary",
        spread: bool = True,
        notes: Sequence[str] = (),
    ) -> None:
        """A renderer with a fixed ``unit`` (or automatic), a title, the spread columns, and
        ``notes`` of the run's own under the table (a capture's: what it covers)."""
        self.unit = unit
        self.title = title
        self.spread = spread
        self.notes = list(notes)

    def render(self, summary: Any) -> str:
        """The table as a string (no trailing newline)."""
        rows = summary.rows
        unit, scale = columns.unit_of(rows, self.unit)
        world = getattr(summary, "world_size", None)
        over = getattr(summary, "over", "ranks")
        sampling = getattr(summary, "sampling", None)
        shown = columns.shown(
            world is not None,
            self.spread,
            sampled=sampling is not None and not eager_breakdown(sampling),
            memory=columns.recorded_memory(rows),
            device=columns.timed_on_device(rows),
            rows=rows,
        )
        lines = self._grid(summary, shown, unit, scale)
        notes = [text for note in NOTES for text in note(summary)] + self.notes
        if not rows:  # the title, and why there is nothing under it (a note may say: compiled)
            filtered = getattr(summary, "filtered", None)
            return "\n".join(
                lines[:1] + (empty_note(summary) if filtered or not notes else []) + notes
            )
        lines += columns.footnotes(
            shown,
            total=f"{summary.total / scale:.3f} {unit}",
            unit=unit,
            world=world,
            over=over,
            one=over[:-1],
        )
        return "\n".join(lines + notes)

    def _grid(
        self, summary: Any, shown: List[columns.Column], unit: str, scale: float
    ) -> List[str]:
        """The title line, the header, a line per row and the closing rule."""
        by = summary.by
        listed = fold(summary.rows, by)
        rows = [r for r, _ in listed]
        grouped = by in ("layer", "relation")
        world = getattr(summary, "world_size", None)
        over = getattr(summary, "over", "ranks")
        labels = [label(r) for r in rows]
        groups = [_group(r, by, n) for r, n in listed]
        event_w = max([30] + [len(text) for text in labels])
        group_w = max([5 if by == "layer" else 8] + [len(g) for g in groups]) if grouped else 0
        cols = [c.header for c in shown]
        cells: List[List[str]] = [
            [
                columns.cell(c, r, scale, world, over) if not n or c.key in SUMMED else ""
                for c in shown
            ]
            for r, n in listed
        ]
        widths = [max([len(col)] + [len(c[i]) for c in cells]) for i, col in enumerate(cols)]
        header = "  " + "Event".ljust(event_w)
        if grouped:
            header += " | " + ("Layer" if by == "layer" else "Relation").ljust(group_w)
        header += "".join(" | " + col.rjust(w) for col, w in zip(cols, widths))
        merged = f", {world} {over} merged" if world is not None else ""
        head = f"--- {self.title}{merged} (times in {unit}) "
        lines = [head + "-" * max(3, len(header) - len(head)), header]
        for text, group, c in zip(labels, groups, cells):
            line = text.ljust(event_w + 2)
            if grouped:
                line += " | " + group.ljust(group_w)
            line += "".join(" | " + v.rjust(w) for v, w in zip(c, widths))
            lines.append(line)
        lines.append("-" * len(header))
        return lines


def _group(row: Any, by: str, folded: int) -> str:
    """A row's cell of the Layer or Relation column (a folded line: how many it stands for)."""
    if folded:
        return f"({folded} more {'layers' if by == 'layer' else 'relations'})"
    return (row.scope if by == "layer" else row.relation) or ""


def _run_notes(summary: Any) -> List[str]:
    """What ran compiled, and a sampled run's duty cycle."""
    notes = [compiled_note(summary), sampling_note(getattr(summary, "sampling", None))]
    return [text for text in notes if text]


def _estimated_note(summary: Any) -> List[str]:
    """What ``~`` says of rows whose time is partly estimated (backward sampling)."""
    sampled = [r for r in summary.rows if r.estimated]
    if not sampled:
        return []
    if getattr(summary, "sampling", None):
        return [
            "~ also marks backward rows timed in part: in the recorded iterations the "
            "first calls of each layer, then one in N at random "
            "(configure(backward_every=N)); the others' time is the mean of those timed "
            "at random."
        ]
    calls = sum(r.count for r in sampled)
    timed = calls - sum(r.estimated for r in sampled)
    return [
        f"~: estimated. Of the {calls} calls in the rows marked ~, {timed} were timed "
        "(the first calls of each layer, then one in N at random; "
        "configure(backward_every=N)); Count is exact, the time of the others is the "
        "mean of those timed at random. Min, Max, Std: timed calls."
    ]


def _upstream_note(summary: Any) -> List[str]:
    """What the mark of a layer running upstream's own forward says."""
    if not any(r.kind == "upstream" for r in summary.rows):
        return []
    return [
        f"{UPSTREAM_MARK.strip()}: the installed release differs from our copy of the "
        "layer's forward, so its own code runs, its parts timed from outside; what "
        "they leave out (GCNConv: the bias) is in the row's Self."
    ]


def _tool_note(summary: Any) -> List[str]:
    """What the row of the tool's own one-time work is."""
    row = next((r for r in summary.rows if r.kind == TOOL), None)
    if row is None:
        return []
    return [
        f"{row.step}: the tool's one-time work at first calls (a model instrumented by run, "
        "a layer class's statements made into steps), left out of every other row and of "
        "the total."
    ]


def _call_notes(summary: Any) -> List[str]:
    """The rows whose calls raised, or were not timed."""
    rows = summary.rows
    return [f"{r.name}: {r.errors} call(s) raised" for r in rows if r.errors] + [
        f"{r.name}: {r.untimed} call(s) not timed (CUDA graph capture, or a backward "
        "that ran part of the step)"
        for r in rows
        if r.untimed
    ]


#: The notes below a table that are not the footnotes of its columns, in order: each gives
#: the lines a summary calls for (none, mostly).
NOTES: List[Callable[[Any], List[str]]] = [
    _run_notes,
    _estimated_note,
    _upstream_note,
    _tool_note,
    _call_notes,
    hostdevice.lines,
]
