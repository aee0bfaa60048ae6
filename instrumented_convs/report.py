"""The summary of a run: rows of numbers, and renderers that only read those rows.

:class:`Summary` is what ``registry.summary()`` returns. ``str(summary)`` is the table;
``summary.rows`` are :class:`Row` dataclasses with the numbers (seconds), so tests and
programs read numbers, never text. Fractions are shares of the *grand total*, the sum of the
top-level steps: the top-level rows add up to 100%, and under every step its children's
fractions plus its own self fraction add up to its fraction, so nothing is counted twice.

A row's ``phase`` is ``forward`` or ``backward`` (its forward step's name, a path mirroring
the forward's, marked ``[backward]`` in the table; see :mod:`instrumented_convs._backward`).
"""
from __future__ import annotations

import csv
import dataclasses
import io
import json
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

#: Time units a table can use, largest first: (name, seconds per unit).
UNITS: Tuple[Tuple[str, float], ...] = (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9))


@dataclass(frozen=True)
class Row:
    """One step path (in one layer instance when grouped by layer); times in seconds."""

    name: str  #: the step path, ``/``-separated (``forward/GCNConv/gcn_norm``)
    step: str  #: the last component of the path
    depth: int  #: 0 for top-level steps
    scope: Optional[str]  #: the layer instance (``None`` when merged, or outside layers)
    kind: str  #: ``step`` or ``region``
    count: int  #: timed calls
    total: float  #: inclusive time, all calls
    self_time: float  #: total minus the totals of the children
    mean: float  #: total / count
    min: float  #: shortest call
    max: float  #: longest call
    std: float  #: sample standard deviation of the calls
    fraction: float  #: total / grand total
    self_fraction: float  #: self_time / grand total
    errors: int = 0  #: calls that ended with an exception (timed all the same)
    untimed: int = 0  #: calls not timed (CUDA-graph capture, or a partial backward)
    phase: str = "forward"  #: ``forward``, or ``backward`` for the backward of a step

    @property
    def parent(self) -> Optional[str]:
        """The path of the enclosing step, or ``None`` at the top level."""
        return self.name.rsplit("/", 1)[0] if "/" in self.name else None


_FIELDS = [f.name for f in dataclasses.fields(Row)]
_INT_FIELDS = {"depth", "count", "errors", "untimed"}
_STR_FIELDS = {"name", "step", "scope", "kind", "phase"}
#: The label suffix of backward rows in the table (and of their NVTX ranges).
BACKWARD_MARK = " [backward]"


def choose_unit(seconds: Sequence[float]) -> Tuple[str, float]:
    """The unit in which the largest of ``seconds`` reads between 1 and 1000."""
    largest = max((abs(s) for s in seconds), default=0.0)
    for name, scale in UNITS:
        if largest >= scale:
            return name, scale
    return UNITS[-1]


class Summary:
    """Per-step statistics; ``str()`` renders the table, ``rows`` hold the numbers."""

    def __init__(
        self, rows: Sequence[Row], unit: Optional[str] = None, by: str = "step",
        grand_total: Optional[float] = None,
    ) -> None:
        """Wrap ``rows`` (tree order); ``unit`` forces the table's time unit.

        ``grand_total`` (seconds) is what the fractions are shares of; it defaults to the
        sum of the top-level rows, and a :meth:`select`-ed part keeps its parent's.
        """
        if unit is not None and unit not in dict(UNITS):
            raise ValueError(f"unit must be one of {[u for u, _ in UNITS]}, not {unit!r}")
        self.rows: List[Row] = list(rows)
        self.unit = unit
        self.by = by
        self.grand_total = (
            grand_total if grand_total is not None
            else sum(row.total for row in self.rows if row.depth == 0)
        )

    # -- access ---------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Row]:
        """Iterate over the rows in tree order."""
        return iter(self.rows)

    def __len__(self) -> int:
        """Number of rows."""
        return len(self.rows)

    def __getitem__(self, path: str) -> Row:
        """The row of a step path (the first one, when grouped by layer)."""
        for row in self.rows:
            if row.name == path:
                return row
        raise KeyError(path)

    def __contains__(self, path: object) -> bool:
        """Whether a row has this step path."""
        return any(row.name == path for row in self.rows)

    def __eq__(self, other: object) -> bool:
        """Same rows, unit and grouping."""
        if not isinstance(other, Summary):
            return NotImplemented
        return (self.rows, self.unit, self.by, self.grand_total) == (
            other.rows, other.unit, other.by, other.grand_total)

    def find(self, step: str) -> List[Row]:
        """Every row whose last path component is ``step``."""
        return [row for row in self.rows if row.step == step]

    def children(self, path: Optional[str]) -> List[Row]:
        """The rows directly under ``path`` (``None``: the top-level rows)."""
        return [row for row in self.rows if row.parent == path]

    @property
    def total(self) -> float:
        """The grand total in seconds, of which every ``fraction`` is a share."""
        return self.grand_total

    def select(
        self, prefix: Optional[str] = None, max_depth: Optional[int] = None,
        phase: Optional[str] = None,
    ) -> "Summary":
        """The rows under (and including) ``prefix``, down to ``max_depth``, of ``phase``.

        ``phase`` is ``"forward"``, ``"backward"`` or ``None`` (both); fractions stay shares
        of this summary's grand total.
        """
        if phase not in (None, "forward", "backward"):
            raise ValueError(f"phase must be 'forward', 'backward' or None, not {phase!r}")
        rows = [
            r for r in self.rows
            if (prefix is None or r.name == prefix or r.name.startswith(prefix + "/"))
            and (max_depth is None or r.depth <= max_depth)
            and (phase is None or r.phase == phase)
        ]
        return Summary(rows, unit=self.unit, by=self.by, grand_total=self.grand_total)

    # -- rendering --------------------------------------------------------------------------
    def table(self, unit: Optional[str] = None, title: str = "Timer summary") -> str:
        """The rendered table (see :class:`TableRenderer`)."""
        return TableRenderer(unit=unit or self.unit, title=title).render(self)

    def __str__(self) -> str:
        """The rendered table."""
        return self.table()

    def __repr__(self) -> str:
        """``Summary(N rows, total=..., by=...)``."""
        return f"Summary({len(self.rows)} rows, total={self.total:.6g}s, by={self.by!r})"

    # -- serialisation ----------------------------------------------------------------------
    def to_dict(self) -> Dict[str, Any]:
        """A JSON-ready dict: ``{"by", "unit", "rows": [row fields...]}``."""
        return {
            "by": self.by, "unit": self.unit, "grand_total": self.grand_total,
            "rows": [dataclasses.asdict(r) for r in self.rows],
        }

    def to_json(self, indent: Optional[int] = 2) -> str:
        """The summary as JSON text (``Summary.from_json`` reads it back exactly)."""
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "Summary":
        """Rebuild a summary from :meth:`to_dict` output."""
        return cls(
            [Row(**r) for r in data["rows"]], unit=data.get("unit"), by=data.get("by", "step"),
            grand_total=data.get("grand_total"),
        )

    @classmethod
    def from_json(cls, text: str) -> "Summary":
        """Rebuild a summary from :meth:`to_json` output."""
        return cls.from_dict(json.loads(text))

    def to_csv(self) -> str:
        """The rows as CSV text with a header line (times in seconds, repr precision)."""
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=_FIELDS, lineterminator="\n")
        writer.writeheader()
        for row in self.rows:
            d = dataclasses.asdict(row)
            d = {k: ("" if v is None else (repr(v) if isinstance(v, float) else v)) for k, v in d.items()}
            writer.writerow(d)
        return out.getvalue()

    @classmethod
    def from_csv(cls, text: str, by: str = "step", grand_total: Optional[float] = None) -> "Summary":
        """Rebuild a summary from :meth:`to_csv` output (pass ``grand_total`` for a part)."""
        rows = []
        for d in csv.DictReader(io.StringIO(text)):
            rows.append(Row(**{k: _parse(k, v) for k, v in d.items()}))
        return cls(rows, by=by, grand_total=grand_total)

    def to_dataframe(self) -> Any:
        """The rows as a pandas DataFrame, one column per :class:`Row` field."""
        import pandas as pd

        return pd.DataFrame([dataclasses.asdict(r) for r in self.rows], columns=_FIELDS)

    @classmethod
    def from_dataframe(cls, frame: Any, by: str = "step", grand_total: Optional[float] = None) -> "Summary":
        """Rebuild a summary from :meth:`to_dataframe` output (pass ``grand_total`` for a part)."""
        rows = []
        for record in frame.to_dict(orient="records"):
            values = {}
            for k in _FIELDS:
                if k not in record:  # a frame saved before the field existed
                    continue
                v = record[k]
                if k == "scope" and (v is None or v != v):  # NaN from pandas
                    v = None
                elif k in _INT_FIELDS:
                    v = int(v)
                elif k not in _STR_FIELDS:
                    v = float(v)
                values[k] = v
            rows.append(Row(**values))
        return cls(rows, by=by, grand_total=grand_total)


def _parse(field: str, value: str) -> Any:
    if field == "scope":
        return value or None
    if field in _STR_FIELDS:
        return value
    if field in _INT_FIELDS:
        return int(value)
    return float(value)


class TableRenderer:
    """Renders a :class:`Summary` as the text table of the original study, extended.

    Columns: Event (indented by depth), Count, Average, Total, Self, Min, Max, Std, Frac.
    One time unit for the whole table, chosen so the largest average reads between 1 and
    1000, and stated in the title line.
    """

    COLUMNS = ("Count", "Average", "Total", "Self", "Min", "Max", "Std", "Frac.")

    def __init__(self, unit: Optional[str] = None, title: str = "Timer summary") -> None:
        """A renderer with a fixed ``unit`` (or automatic) and a title."""
        self.unit = unit
        self.title = title

    def render(self, summary: Summary) -> str:
        """The table as a string (no trailing newline)."""
        rows = summary.rows
        if self.unit is not None:
            unit, scale = self.unit, dict(UNITS)[self.unit]
        else:
            unit, scale = choose_unit([r.mean for r in rows])
        by_layer = summary.by == "layer"
        labels = [
            ("  " * r.depth) + "- " + r.step + (BACKWARD_MARK if r.phase == "backward" else "")
            for r in rows
        ]
        event_w = max([30] + [len(label) for label in labels])
        layer_w = max([5] + [len(r.scope or "") for r in rows]) if by_layer else 0

        def num(seconds: float) -> str:
            return f"{seconds / scale:.3f}"

        cells = []
        for r in rows:
            cells.append([
                str(r.count), num(r.mean), num(r.total), num(r.self_time), num(r.min),
                num(r.max), num(r.std), f"{100.0 * r.fraction:.1f}%",
            ])
        widths = [
            max([len(col)] + [len(c[i]) for c in cells]) for i, col in enumerate(self.COLUMNS)
        ]
        header = "  " + "Event".ljust(event_w)
        if by_layer:
            header += " | " + "Layer".ljust(layer_w)
        header += "".join(" | " + col.rjust(w) for col, w in zip(self.COLUMNS, widths))
        width = len(header)
        head = f"--- {self.title} (times in {unit}) "
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
        notes = [
            f"{r.name}: {r.errors} call(s) raised" for r in rows if r.errors
        ] + [f"{r.name}: {r.untimed} call(s) not timed (CUDA graph capture, or a backward "
                 "that ran part of the step)" for r in rows if r.untimed]
        lines.extend(notes)
        return "\n".join(lines)
