"""The columns of a summary, in one list (:data:`COLUMNS`): what each reads from a row, its
header, its format, and its doc, which the table's footnotes say. The table, the page, JSON,
CSV and pandas all read the list, so a new column is one :class:`Column` here. Times are in
one unit per table (:func:`unit_of`). Imports nothing from the package but :mod:`.row`.
"""

from __future__ import annotations

import dataclasses
import string
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .row import FIELDS, TOOL, Row, host_estimate

__all__ = [
    "Column",
    "COLUMNS",
    "UNITS",
    "add",
    "remove",
    "shown",
    "derived",
    "cell",
    "unit_of",
    "choose_unit",
    "spread_text",
    "footnotes",
    "bytes_text",
    "recorded_memory",
    "timed_on_device",
    "grid",
]

#: Time units a table can use, largest first: (name, seconds per unit).
UNITS: Tuple[Tuple[str, float], ...] = (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9))


@dataclass(frozen=True)
class Column:
    """One column of a summary's table.

    ``key``: the :class:`~.row.Row` field it shows, or the name its computed value has in
    JSON, CSV and pandas; ``header``: its title; ``kind``: how its value is written
    (``count``, ``time`` in the table's unit, ``error`` a sampled row's standard error in
    that unit, ``fraction`` as a percentage, ``slowest`` a time and its rank, ``spread`` a
    ratio, ``bytes`` in binary units, ``number``); ``value``: how to compute it from a
    row, for a column no field holds; ``merged``: shown only for a summary merged over
    ranks; ``estimated``: marked ``~`` on a row whose time is partly estimated;
    ``sampled``: shown only for a sampled run (the duty cycle); ``memory``: shown only for
    a summary that recorded memory (``configure(memory=True)``); ``device``: only for one
    with calls timed on a device (:func:`timed_on_device`). ``doc``: what it holds;
    with ``note``, also the table's footnote on it (:func:`footnotes`).
    """

    key: str
    header: str
    kind: str = "number"
    value: Optional[Callable[[Row], Any]] = None
    merged: bool = False
    estimated: bool = False
    doc: str = ""
    sampled: bool = False
    memory: bool = False
    note: bool = False
    device: bool = False
    #: Shown only where this says so of the table's rows (None: as the flags above say).
    when: Optional[Callable[[Sequence[Row]], bool]] = None

    def of(self, row: Row) -> Any:
        """This column's value for ``row``."""
        return self.value(row) if self.value is not None else getattr(row, self.key)


#: The columns of a summary's table, in order (after the step's label and, by layer, its
#: layer). Change it with :func:`add` and :func:`remove`.
COLUMNS: List[Column] = [
    Column("count", "Count", "count", doc="calls (timed, and counted with their time estimated)"),
    Column("mean", "Average", "time", estimated=True, doc="total / count"),
    Column("total", "Total", "time", estimated=True, doc="inclusive time, all calls"),
    Column(
        "host",
        "Host",
        "time",
        lambda r: host_estimate(r) if r.device_calls else None,
        estimated=True,
        doc="the CPU's time to issue the calls timed on the device, from the start event's "
        "record to the end event's, the tool's own left out (their Total is the device's; "
        "read with each call's lag: where only some were, their mean times Count); from an "
        "Nsight Systems report, their ranges' durations.",
        note=True,
        device=True,
    ),
    Column(
        "busy",
        "Busy",
        "time",
        lambda r: r.busy if r.busy else None,
        estimated=True,
        doc="the device's busy time in the calls timed on it: the summed durations of the "
        "kernels, copies and memsets they launched (their Total is the span from the first "
        "one's start to the last one's end), as an Nsight Systems report says.",
        note=True,
        device=True,
        when=lambda rows: any(r.busy for r in rows),
    ),
    Column("self_time", "Self", "time", estimated=True, doc="total less the children's"),
    Column("min", "Min", "time", doc="the shortest timed call"),
    Column("max", "Max", "time", doc="the longest timed call"),
    Column("std", "Std", "time", doc="the timed calls' standard deviation"),
    Column(
        "fraction",
        "Frac.",
        "fraction",
        estimated=True,
        doc="share of the total of top-level steps ({total}); a step's Frac. = its Self share "
        "+ its children's Frac.\nCount, times and Frac. are over all {world} {over}: counts and "
        "totals summed, Min and Max over every {one}'s calls.",
        note=True,
    ),
    Column(
        "se",
        "±SE",
        "error",
        sampled=True,
        doc="a sampled run: the standard error of the scaled total",
    ),
    Column(
        "slowest",
        "Slowest",
        "slowest",
        merged=True,
        doc="the largest total of one {one} ({over[0]}<{one}>)",
        note=True,
    ),
    Column(
        "spread",
        "Spread",
        "spread",
        lambda r: r.spread,
        merged=True,
        doc="slowest / fastest {one}'s total, over the {over} that ran the step (k/n: only k "
        "of n {over} did).",
        note=True,
    ),
    Column(
        "saved_per_call",
        "Saved/call",
        "bytes",
        lambda r: r.saved_bytes / r.count if r.phase == "forward" and r.count else None,
        memory=True,
        doc="bytes of the tensors a step made that autograd kept for backward, per call",
        note=True,
    ),
    Column(
        "peak_bytes",
        "Peak",
        "bytes",
        memory=True,
        doc="the most bytes alive above a call's start (memory: summary.table(memory=True) "
        "says more).",
        note=True,
    ),
]


def add(column: Column, before: Optional[str] = None) -> Column:
    """Add ``column`` to :data:`COLUMNS` (at the end, or before the column keyed
    ``before``); its key must be new. Returns it."""
    if any(c.key == column.key for c in COLUMNS):
        raise ValueError(f"a column keyed {column.key!r} exists already")
    keys = [c.key for c in COLUMNS]
    COLUMNS.insert(keys.index(before) if before is not None else len(COLUMNS), column)
    return column


def remove(key: str) -> Column:
    """Take the column keyed ``key`` out of :data:`COLUMNS`; returns it."""
    for i, c in enumerate(COLUMNS):
        if c.key == key:
            return COLUMNS.pop(i)
    raise KeyError(key)


def shown(
    merged: bool,
    spread: bool = True,
    sampled: bool = False,
    memory: bool = False,
    device: bool = False,
    rows: Sequence[Row] = (),
) -> List[Column]:
    """The columns of a table: the merged-only ones for a summary merged over ranks (and
    ``spread``: its Slowest and Spread, unless turned off), the sampled-only ones for a
    sampled run, the memory ones for a run that recorded memory, the device ones for a run
    with calls timed on a device, each with a ``when`` only where it says so of ``rows``."""
    return [
        c
        for c in COLUMNS
        if (not c.merged or (merged and spread))
        and (not c.sampled or sampled)
        and (not c.memory or memory)
        and (not c.device or device)
        and (c.when is None or c.when(rows))
    ]


def recorded_memory(rows: Sequence[Row]) -> bool:
    """Whether memory was recorded for any of ``rows`` (``configure(memory=True)``)."""
    return any(r.mem_calls or r.saved_bytes or r.saved_aside for r in rows)


def timed_on_device(rows: Sequence[Row]) -> bool:
    """Whether any of ``rows`` has calls timed on a device whose host time was read (CUDA)."""
    return any(r.device_calls for r in rows)


def grid(
    title: str, head: Sequence[str], labels: Sequence[str], cells: Sequence[Sequence[str]]
) -> List[str]:
    """A table's lines: ``title`` and a rule, the header (``Event`` and ``head``), a row per
    label with its ``cells`` right-aligned, a closing rule (the counters' table, memory's)."""
    event_w = max([30] + [len(x) for x in labels])
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(head)]
    header = (
        "  " + "Event".ljust(event_w) + "".join(" | " + h.rjust(w) for h, w in zip(head, widths))
    )
    top = title + " "
    lines = [top + "-" * max(3, len(header) - len(top)), header]
    for label, c in zip(labels, cells):
        lines.append(
            label.ljust(event_w + 2) + "".join(" | " + v.rjust(w) for v, w in zip(c, widths))
        )
    lines.append("-" * len(header))
    return lines


def bytes_text(n: float) -> str:
    """``n`` bytes in binary units: ``512 B``, ``3.2 KiB``, ``1.25 GiB``."""
    for scale, unit in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if abs(n) >= scale:
            v = n / scale
            return f"{v:.3g} {unit}" if abs(v) < 1000 else f"{v:.0f} {unit}"
    return f"{int(n)} B"


def derived() -> List[Column]:
    """The columns no :class:`~.row.Row` field holds: JSON, CSV and pandas write their
    values beside the fields."""
    fields = set(FIELDS)
    return [c for c in COLUMNS if c.key not in fields]


def derived_values(row: Row) -> Dict[str, Any]:
    """``{key: value}`` of the :func:`derived` columns for ``row``."""
    return {c.key: c.of(row) for c in derived()}


def choose_unit(seconds: Sequence[float]) -> Tuple[str, float]:
    """The unit in which the largest of ``seconds`` reads between 1 and 1000."""
    largest = max((abs(s) for s in seconds), default=0.0)
    for name, scale in UNITS:
        if largest >= scale:
            return name, scale
    return UNITS[-1]


def unit_of(rows: Sequence[Row], unit: Optional[str] = None) -> Tuple[str, float]:
    """The table's unit: ``unit`` if given, else the one its largest mean reads best in."""
    if unit is not None:
        return unit, dict(UNITS)[unit]
    return choose_unit([r.mean for r in rows])


def spread_text(row: Row, world_size: Optional[int]) -> str:
    """A merged row's spread cell: ``1.08x``, and ``k/n`` when only k of n ranks ran it."""
    spread = row.spread
    if spread is None:
        return "-"
    text = "inf" if spread == float("inf") else f"{spread:.2f}x"
    if row.ranks is not None and world_size is not None and row.ranks < world_size:
        text += f" {row.ranks}/{world_size}"
    return text


def footnotes(shown: Sequence[Column], **table: Any) -> List[str]:
    """The footnotes of the columns ``shown`` whose ``note`` is set, in their order: each
    its header and its doc, ``Header: doc``, formatted with ``table`` (the table's
    ``total``, ``unit``, ``world``, ``over``, ``one``). A doc that ends without a full stop
    runs on into the next footnote, after ``; ``; each further line of a doc is a footnote
    line of its own, left out where it names what the table has not (a value None: the
    ``world`` of a summary of one process)."""
    lines: List[str] = []
    for column in shown:
        if not column.note:
            continue
        first, *more = column.doc.split("\n")
        text = f"{column.header}: {first.format(**table)}"
        if lines and not lines[-1].endswith("."):
            lines[-1] += "; " + text
        else:
            lines.append(text)
        for line in more:
            names = [name for _, name, _, _ in string.Formatter().parse(line) if name]
            if all(table.get(name.split("[")[0]) is not None for name in names):
                lines.append(line.format(**table))
    return lines


def cell(
    column: Column, row: Row, scale: float, world_size: Optional[int] = None, over: str = "ranks"
) -> str:
    """``column``'s cell of ``row`` as text, times in the unit of ``scale`` seconds
    (``over``: what a merged summary is merged over, ``ranks`` or ``workers``)."""
    value = column.of(row)
    estimate = row.estimated or row.sampled
    scaled = column.kind == "count" and row.sampled  # a count scaled to the whole run
    mark = "~" if (column.estimated and estimate) or scaled else ""
    if column.kind == "count":
        return mark + str(value)
    if column.kind == "error":
        return f"{value / scale:.3f}" if row.sampled else ""
    if column.kind == "time":
        return "" if value is None else f"{mark}{value / scale:.3f}"
    if column.kind == "fraction":  # (the tool's own row: outside the total)
        return "-" if row.kind == TOOL else f"{mark}{100.0 * value:.1f}%"
    if column.kind == "slowest":
        return "-" if value is None else f"{value / scale:.3f} {over[0]}{row.slowest_rank}"
    if column.kind == "spread":
        return spread_text(row, world_size)
    if column.kind == "bytes":
        if value is None or (column.key == "peak_bytes" and not row.mem_calls):
            return "-"
        return mark + bytes_text(value)
    if value is None:
        return "-"
    return mark + (f"{value:.4g}" if isinstance(value, float) else str(value))


def as_dict(row: Row) -> Dict[str, Any]:
    """``row``'s fields and its :func:`derived` values: what JSON, CSV and pandas write."""
    out = dataclasses.asdict(row)
    del out["extra"]  # a statistic kept there is written by its column, if shown
    out.update(derived_values(row))
    return out
