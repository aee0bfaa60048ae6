"""The summary of a run: :class:`Summary`, what ``registry.summary()`` returns.

Its rows hold the numbers, so that programs and tests read numbers, never text; selecting
rows, diffing two summaries and reading them back (JSON, CSV, pandas) are here, while every
output (the table, the page, JSON, CSV...) is drawn by a renderer (:mod:`.renderers`).
"""

from __future__ import annotations

import csv
import io
import json
import os
from typing import Any, Dict, Iterator, List, Optional, Sequence, Union

from . import columns, diff, hostdevice, page, rules, saved, tensorboard
from .columns import UNITS
from .diff import SummaryDiff
from .renderers import RenderInput, render
from .row import FIELDS, TOOL, Row, value_of

__all__ = ["Summary"]

_FIELD_SET = frozenset(FIELDS)

#: Where an export goes: a file's name or path.
PathLike = Union[str, "os.PathLike[str]"]


def _written(text: str, path: Optional[PathLike]) -> Optional[str]:
    """``text``, or None once written to ``path`` (UTF-8), as pandas' ``to_csv`` does."""
    if path is None:
        return text
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(
            f"path takes a file name (str or os.PathLike), not {type(path).__name__} "
            f"{path!r} (to_json's indent is a keyword: to_json(indent=4))"
        )
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(text)
    return None


def _filter(
    rows: List[Row], prefix: Optional[str], max_depth: Optional[int], phase: Optional[str]
) -> Dict[str, Any]:
    """What :meth:`Summary.select` chose ``rows`` by, with the paths a user may have meant."""
    tops = list(dict.fromkeys(r.name for r in rows if r.depth == 0))
    near: List[str] = []
    if prefix and not any(r.name == prefix or r.name.startswith(prefix + "/") for r in rows):
        for name in (r.name for r in rows if prefix in r.name):
            end = name.find("/", name.index(prefix) + len(prefix))
            near.append(name if end < 0 else name[:end])
    return dict(
        prefix=prefix,
        max_depth=max_depth,
        phase=phase,
        tops=tops[:4],
        more=len(tops) > 4,
        near=list(dict.fromkeys(near))[:3],
        phases=sorted({r.phase for r in rows}),
    )


class Summary:
    """Per-step statistics; ``str()`` renders the table, ``rows`` hold the numbers (seconds).

    Fractions are shares of the *grand total*, the sum of the top-level steps: the
    top-level rows add up to 100%, and under every step its children's fractions plus its
    own self fraction add up to its fraction, so nothing is counted twice. A row's
    ``phase`` is ``forward`` or ``backward`` (a path mirroring its forward step's, marked
    ``[backward]`` in the table). A summary merged over processes
    (``registry.summary(all_ranks=True)``) keeps one summary per rank (:meth:`by_rank`),
    and its rows say how the ranks differ (``slowest``, ``slowest_rank``, ``fastest``,
    ``spread``)."""

    def __init__(
        self,
        rows: Sequence[Row],
        unit: Optional[str] = None,
        by: str = "step",
        total: Optional[float] = None,
        per_rank: Optional[Sequence["Summary"]] = None,
        sampling: Optional[Dict[str, Any]] = None,
        compiled: Optional[Dict[str, Any]] = None,
    ) -> None:
        """Wrap ``rows`` (tree order); ``unit`` forces the table's time unit.

        ``total`` (seconds) is what the fractions are shares of; it defaults to the
        sum of the top-level rows, and a :meth:`select`-ed part keeps its parent's.
        ``per_rank`` makes this a summary merged over ranks: one summary per rank, in rank
        order (what :meth:`by_rank` returns). ``sampling``: a sampled run's duty cycle, as
        it describes itself (:attr:`sampling`); ``compiled``: what ran compiled
        (:attr:`compiled`).
        """
        if unit is not None and unit not in dict(UNITS):
            raise ValueError(f"unit must be one of {[u for u, _ in UNITS]}, not {unit!r}")
        self.rows: List[Row] = list(rows)
        self.unit = unit
        self.by = by
        #: The grand total in seconds, of which every ``fraction`` is a share.
        self.total: float = (
            total
            if total is not None
            else sum(r.total for r in self.rows if r.depth == 0 and r.kind != TOOL)
        )
        self._per_rank = None if per_rank is None else list(per_rank)
        #: What a merged summary is merged over: ``ranks`` (torch.distributed), or
        #: ``workers`` (a data loader's worker processes, :mod:`.workers`).
        self.over = "ranks"
        #: A sampled run (the duty cycle, ``configure(record_every=K)``): ``every`` (the
        #: rate at the end), ``budget``, ``iteration`` (what delimits one), ``iterations``
        #: and ``recorded`` (how many of them), ``first`` (always recorded), ``strata``
        #: (per rate: ``every``, ``iterations``, ``recorded``; 0 is the exact part) and
        #: ``why`` (the budget's reason); None for a run recorded in full.
        self.sampling: Optional[Dict[str, Any]] = sampling
        #: What ran under ``torch.compile`` (``core.compiler.dynamo.describe``; None: nothing):
        #: ``owners`` (per compiled call's step path, its layers and their calls per call)
        #: ``breaks`` (graph breaks, attributed to conv layers) and ``recompiles`` (the
        #: same of recompiles); see :mod:`.compiled`.
        self.compiled: Optional[Dict[str, Any]] = compiled
        #: What :meth:`select` chose this summary's rows by, if it did (for an empty table's
        #: explanation): ``prefix``, ``max_depth``, ``phase``; ``tops``, the first top-level
        #: paths it chose from (``more``: there are others); ``near``, paths that contain
        #: a prefix that matched none; ``phases``, those of the rows it chose from.
        self.filtered: Optional[Dict[str, Any]] = None

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
        """Same rows, unit, grouping, grand total and per-rank parts."""
        if not isinstance(other, Summary):
            return NotImplemented
        mine = (self.rows, self.unit, self.by, self.total, self._per_rank, self.sampling)
        theirs = (other.rows, other.unit, other.by, other.total, other._per_rank, other.sampling)
        return mine == theirs and self.compiled == other.compiled

    @property
    def world_size(self) -> Optional[int]:
        """How many ranks this summary merges (``None``: the summary of one process)."""
        return None if self._per_rank is None else len(self._per_rank)

    def by_rank(self) -> List["Summary"]:
        """One summary per rank, in rank order (a summary merged over ranks only).

        Each part's rows carry their ``rank``; its fractions are shares of that rank's own
        grand total.
        """
        if self._per_rank is None:
            raise ValueError(
                "this summary is of one process: registry.summary(all_ranks=True) merges the "
                "ranks of a torch.distributed job and keeps one summary per rank"
            )
        return list(self._per_rank)

    def find(self, step: str) -> List[Row]:
        """Every row whose last path component is ``step``."""
        return [row for row in self.rows if row.step == step]

    def children(self, path: Optional[str]) -> List[Row]:
        """The rows directly under ``path`` (``None``: the top-level rows)."""
        return [row for row in self.rows if row.parent == path]

    def select(
        self,
        prefix: Optional[str] = None,
        max_depth: Optional[int] = None,
        phase: Optional[str] = None,
    ) -> "Summary":
        """The rows under (and including) ``prefix``, down to ``max_depth``, of ``phase``.

        ``phase`` is ``"forward"``, ``"backward"`` or ``None`` (both); fractions stay shares
        of this summary's grand total.
        """
        if phase not in (None, "forward", "backward"):
            raise ValueError(f"phase must be 'forward', 'backward' or None, not {phase!r}")
        rows = [
            r
            for r in self.rows
            if (prefix is None or r.name == prefix or r.name.startswith(prefix + "/"))
            and (max_depth is None or r.depth <= max_depth)
            and (phase is None or r.phase == phase)
        ]
        parts = (
            None
            if self._per_rank is None
            else [part.select(prefix, max_depth, phase) for part in self._per_rank]
        )
        chosen = Summary(
            rows,
            unit=self.unit,
            by=self.by,
            total=self.total,
            per_rank=parts,
            sampling=self.sampling,
            compiled=self.compiled,
        )
        chosen.filtered = self.filtered  # (nothing recorded stays so)
        if self.rows:
            chosen.filtered = _filter(self.rows, prefix, max_depth, phase)
        return chosen

    # -- rendering --------------------------------------------------------------------------
    def table(
        self,
        unit: Optional[str] = None,
        title: str = "Timer summary",
        spread: bool = True,
        counters: bool = False,
        peak: Any = None,
        times: Optional["Summary"] = None,
        memory: bool = False,
    ) -> str:
        """The table (the ``text`` renderer; merged over ranks, Slowest and Spread unless
        ``spread=False``); ``counters=True``: the counters' table (``roofline``: the
        machine's ``peak``, ``times`` of a run without counters); ``memory=True``: the
        memory table (``memory``: kept for backward and peak per step)."""
        if memory:
            return render("memory", RenderInput(self))
        if counters:
            return render(
                "roofline", RenderInput(self, peak=peak, times=times, options={"unit": unit})
            )
        options = {"unit": unit, "title": title, "spread": spread}
        return render("text", RenderInput(self, options=options))

    def __str__(self) -> str:
        """The rendered table."""
        return self.table()

    def render(self, name: str = "text", **fields: Any) -> Any:
        """This summary in the format called ``name``: ``text``, ``page``, ``json``, ``csv``,
        ``roofline``, ``memory``, ``workers``... (:data:`~.renderers.RENDERERS`); ``fields``:
        the other fields of a :class:`~.renderers.RenderInput` (``title``, ``meta``,
        ``peak``, ``times``, ``options``...)."""
        return render(name, RenderInput(self, **fields))

    def _repr_html_(self) -> str:
        """Jupyter shows a summary as its page (the icicle and the table) in a frame of its
        own, the text table where a viewer strips scripts (:func:`.page.in_notebook`)."""
        return page.in_notebook(self.to_html(), self.table())

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """IPython's text view of a summary (a terminal, a notebook's text output): the table."""
        printer.text(repr(self) if cycle else self.table())

    def __repr__(self) -> str:
        """``Summary(N rows, total=..., by=...)`` (and ``ranks=N`` when merged)."""
        ranks = "" if self._per_rank is None else f", ranks={len(self._per_rank)}"
        return f"Summary({len(self.rows)} rows, total={self.total:.6g}s, by={self.by!r}{ranks})"

    def diff(
        self,
        other: "Summary",
        min_change: float = diff.MIN_CHANGE,
        min_change_us: float = diff.MIN_CHANGE_US,
    ) -> SummaryDiff:
        """This summary (the baseline) and ``other`` side by side: per step the change in
        mean time per call and a verdict (slower, faster, unchanged, too noisy, added,
        missing); a change under the floor, ``min_change`` of the mean or ``min_change_us``
        µs a call (the larger), is none (see :mod:`.diff`)."""
        return diff.diff(self, other, min_change, min_change_us)

    def to_html(
        self, title: str = "instrumented_convs", *, path: Optional[PathLike] = None, **fields: Any
    ) -> Optional[str]:
        """A self-contained HTML page (offline; open it in a browser): the icicle of the step
        tree, the table and, merged over ranks, each rank's totals (the ``page`` renderer;
        ``fields``: ``meta``, ``note``, ``subtitle``, ``loaders``). Written to ``path``
        (None returned), else returned."""
        return _written(render("page", RenderInput(self, title=title, **fields)), path)

    def to_tensorboard(self, writer: Any, step: Optional[int] = None) -> int:
        """Write a point per row to a TensorBoard ``writer`` (a ``SummaryWriter``) at
        ``step``: the time per call of the calls since this writer's previous point (and
        with the counters on, the FLOP/s and bytes/s they achieved) under the row's path
        (see :mod:`.tensorboard`). Call it once an epoch; returns the scalars written."""
        return tensorboard.write_scalars(self, writer, step)

    def host_device(self) -> Optional[Dict[str, Any]]:
        """Where the device waited for the host, on CUDA (None on the CPU clock): per region,
        per layer (by layer) and for the steps whose host time is most of their device time,
        their host and device time, calls, lags and verdict (:mod:`.hostdevice`)."""
        return hostdevice.host_device(self)

    def advice(self) -> List[Dict[str, Any]]:
        """What to change that these rows alone decide (docs/advice.md): on CUDA, the regions
        the device waited in for the host. The layers' rules read signals a run records with
        ``run --advise`` (``instrumented-convs advise RUN``, ``instrumented_convs.advise()``)."""
        return rules.decide(rules.Record(self))

    # -- serialisation ----------------------------------------------------------------------
    def to_dict(self) -> Dict[str, Any]:
        """A JSON-ready dict: ``{"by", "unit", "total", "rows": [...]}``, each row its fields
        and the values of the columns no field holds (:mod:`.columns`).

        A summary merged over ranks adds ``"per_rank"``: each rank's summary as such a dict;
        a sampled run ``"sampling"`` (:attr:`sampling`), a compiled one ``"compiled"``, one
        with calls timed on a device ``"host_device"`` (:meth:`host_device`; made anew from the
        rows when read back).
        """
        data = {
            "by": self.by,
            "unit": self.unit,
            "total": self.total,
            "rows": [columns.as_dict(r) for r in self.rows],
        }
        if self._per_rank is not None:
            data["per_rank"] = [part.to_dict() for part in self._per_rank]
        if self.sampling is not None:
            data["sampling"] = self.sampling
        if self.compiled is not None:
            data["compiled"] = self.compiled
        verdict = self.host_device()
        if verdict is not None:
            data["host_device"] = verdict
        return data

    def to_json(
        self, path: Optional[PathLike] = None, *, indent: Optional[int] = 2
    ) -> Optional[str]:
        """The summary as JSON (the ``json`` renderer; ``Summary.from_json`` reads it back
        exactly): written to ``path`` (UTF-8; None returned), else returned as text."""
        return _written(render("json", RenderInput(self, options={"indent": indent})), path)

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "Summary":
        """Rebuild a summary from :meth:`to_dict` output."""
        parts = data.get("per_rank")
        return cls(
            [Row(**{k: v for k, v in r.items() if k in _FIELD_SET}) for r in data["rows"]],
            unit=data.get("unit"),
            by=data.get("by", "step"),
            total=data.get("total"),
            per_rank=None if parts is None else [cls.from_dict(p) for p in parts],
            sampling=data.get("sampling"),
            compiled=data.get("compiled"),
        )

    @classmethod
    def from_json(cls, text: str) -> "Summary":
        """Rebuild a summary from :meth:`to_json` output."""
        return cls.from_dict(json.loads(text))

    @classmethod
    def load(cls, path: Any) -> "Summary":
        """The summary of a run saved by ``python -m instrumented_convs run`` (its folder or
        ``run.json``: merged over ranks under torchrun), or of a :meth:`to_json` file."""
        data = saved.read(path, runs_only=False)
        return cls.from_dict(data["summary"] if data.get("format") == saved.FORMAT else data)

    def _all_rows(self) -> List[Row]:
        """The rows, then (merged over ranks) every rank's rows, which carry their ``rank``."""
        return self.rows + [r for part in self._per_rank or () for r in part.rows]

    @classmethod
    def _from_rows(cls, rows: List[Row], by: str, total: Optional[float]) -> "Summary":
        """The summary of exported rows: those without a rank, and a part per rank if both."""
        merged = [r for r in rows if r.rank is None]
        if not merged or len(merged) == len(rows):
            return cls(rows, by=by, total=total)
        ranks = sorted({r.rank for r in rows if r.rank is not None})
        parts = [cls([r for r in rows if r.rank == k], by=by) for k in range(max(ranks) + 1)]
        return cls(merged, by=by, total=total, per_rank=parts)

    def to_csv(self, path: Optional[PathLike] = None) -> Optional[str]:
        """The rows as CSV with a header line (the ``csv`` renderer: times in seconds, every
        field, then the columns no field holds; merged over ranks, the merged rows and then
        each rank's, both of which :meth:`from_csv` rebuilds): written to ``path`` (UTF-8;
        None returned), else returned as text."""
        return _written(render("csv", RenderInput(self)), path)

    @classmethod
    def from_csv(cls, text: str, by: str = "step", total: Optional[float] = None) -> "Summary":
        """Rebuild a summary from :meth:`to_csv` output (pass ``total`` for a part)."""
        rows = []
        for d in csv.DictReader(io.StringIO(text)):
            rows.append(Row(**{k: value_of(k, v) for k, v in d.items() if k in _FIELD_SET}))
        return cls._from_rows(rows, by, total)

    def to_dataframe(self) -> Any:
        """The rows as a pandas DataFrame, one column per :class:`Row` field, then one per
        column no field holds (:mod:`.columns`).

        Merged over ranks: the merged rows (``rank`` missing), then each rank's rows.
        """
        import pandas as pd

        names = FIELDS + [c.key for c in columns.derived()]
        return pd.DataFrame([columns.as_dict(r) for r in self._all_rows()], columns=names)

    @classmethod
    def from_dataframe(
        cls, frame: Any, by: str = "step", total: Optional[float] = None
    ) -> "Summary":
        """Rebuild a summary from :meth:`to_dataframe` output (pass ``total`` for a part)."""
        rows = []
        for record in frame.to_dict(orient="records"):
            # a frame saved before a field existed lacks it: the field's default then
            rows.append(Row(**{k: value_of(k, record[k]) for k in FIELDS if k in record}))
        return cls._from_rows(rows, by, total)
