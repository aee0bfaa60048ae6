"""Every output of a run behind one interface: a :class:`Renderer` per format, by name.

A renderer reads a :class:`Run` (a summary, and what is known of the run besides: its
timeline, its metadata, the machine's limits for the counters' table) and returns text or
bytes: ``text`` (the table, :mod:`.text`), ``page`` (the HTML page, :mod:`.page`), ``json``
and ``csv`` (the rows, :class:`~.summary.Summary`), ``roofline`` (the counters' table,
:mod:`.roofline`), ``memory`` (the memory table, :mod:`.memory`), ``trace`` (the timeline
as a Chrome trace, :mod:`.timeline`).
:data:`RENDERERS` holds them by name; :func:`render` picks one, and ``Summary.render``,
``run`` and ``view`` pick theirs by name. A renderer with a ``file`` is written into a run
folder when the run has what it reads (:meth:`Renderer.wants`): :func:`write_folder` asks
each in turn. A new output is one class here.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from . import memory, page, roofline, timeline, workers
from .summary import Summary

__all__ = ["Run", "Renderer", "RENDERERS", "render", "write_folder"]


@dataclass
class Run:
    """What a renderer reads: ``summary`` (all but ``trace``); ``title`` (the page's) and
    ``meta`` (``(label, value)`` pairs shown under it: command, versions, device,
    settings); ``note``, a line under the page's chart; ``timeline`` (a
    :class:`~.timeline.Timeline`, or a trace read back) and its ``pid`` and ``name`` in a
    trace; for the counters' table the machine's ``peak`` and ``times`` (a summary of a run
    without the counters); ``options``, the text table's (``title``, ``unit``, ``spread``);
    ``loaders``: the run's data loaders and their worker processes (``run.json``'s
    ``workers``), whose split the page shows."""

    summary: Optional[Summary] = None
    title: Optional[str] = None
    meta: Sequence[Tuple[str, Any]] = ()
    note: str = ""
    timeline: Any = None
    pid: Optional[int] = None
    name: Optional[str] = None
    peak: Any = None
    times: Optional[Summary] = None
    options: Dict[str, Any] = field(default_factory=dict)
    loaders: Optional[Dict[str, Any]] = None


class Renderer:
    """One output format: its ``name``, the ``file`` it has in a run folder (``None``: not
    written there), and :meth:`render`."""

    name = ""
    file: Optional[str] = None

    def wants(self, run: Run) -> bool:
        """Whether ``run`` has what this renderer reads (for a run folder): a summary."""
        return run.summary is not None

    def render(self, run: Run) -> Union[str, bytes]:
        """``run`` in this format."""
        raise NotImplementedError

    def write(self, run: Run, path: Union[str, Path]) -> Path:
        """Write ``run`` in this format to ``path``; returns the path."""
        out = self.render(run)
        p = Path(path)
        if isinstance(out, bytes):
            p.write_bytes(out)
        else:
            p.write_text(out if out.endswith("\n") else out + "\n")
        return p


class Text(Renderer):
    """The table (``str(summary)``; options: ``title``, ``unit``, ``spread``)."""

    name, file = "text", "summary.txt"

    def render(self, run: Run) -> str:
        """The text table."""
        return run.summary.table(**run.options)


class Page(Renderer):
    """The self-contained HTML page: icicle, table, per-rank totals, the loaders' split."""

    name, file = "page", "page.html"

    def render(self, run: Run) -> str:
        """The page."""
        title = run.title or "instrumented_convs"
        loaders = workers.pipeline(run.loaders, run.summary) if run.loaders else None
        return page.summary_page(run.summary, title, meta=run.meta, note=run.note, loaders=loaders)


class Json(Renderer):
    """The summary as JSON (``Summary.to_json``; ``Summary.from_json`` reads it back)."""

    name = "json"

    def render(self, run: Run) -> str:
        """The JSON text."""
        return run.summary.to_json()


class Csv(Renderer):
    """The rows as CSV (``Summary.to_csv``; ``Summary.from_csv`` reads it back)."""

    name = "csv"

    def render(self, run: Run) -> str:
        """The CSV text."""
        return run.summary.to_csv()


class Roofline(Renderer):
    """The counters' table: FLOPs, bytes, intensity and the roofline per step."""

    name = "roofline"

    def wants(self, run: Run) -> bool:
        """Only where the counters counted anything."""
        return run.summary is not None and any(r.ops for r in run.summary.rows)

    def render(self, run: Run) -> str:
        """The counters' table (against ``run.peak``, with ``run.times``' times)."""
        unit = run.options.get("unit")
        return roofline.render(run.summary, run.peak, unit or run.summary.unit, times=run.times)


class Memory(Renderer):
    """The memory table: what each step keeps for backward, and its peak."""

    name = "memory"

    def wants(self, run: Run) -> bool:
        """Only where memory was recorded."""
        return run.summary is not None and bool(memory.rows_of(run.summary))

    def render(self, run: Run) -> str:
        """The memory table."""
        return memory.render(run.summary)


class Trace(Renderer):
    """The timeline as a Chrome trace, gzipped (Perfetto, ``chrome://tracing``)."""

    name, file = "trace", "trace.json.gz"

    def wants(self, run: Run) -> bool:
        """Only where a timeline was recorded."""
        return run.timeline is not None

    def trace(self, run: Run) -> Dict[str, Any]:
        """The trace as a dict (a timeline's, or one read back and passed as is)."""
        tl = run.timeline
        return tl if isinstance(tl, dict) else tl.to_chrome(pid=run.pid, name=run.name)

    def render(self, run: Run) -> bytes:
        """The gzipped JSON of the trace."""
        return gzip.compress(json.dumps(self.trace(run)).encode())

    def write(self, run: Run, path: Union[str, Path]) -> Path:
        """Write the trace to ``path`` (``.gz``: gzipped; else plain JSON)."""
        return timeline.write_trace(path, self.trace(run))


#: Every renderer, by name.
RENDERERS: Dict[str, Renderer] = {
    r.name: r for r in (Text(), Page(), Json(), Csv(), Roofline(), Memory(), Trace())
}


def render(name: str, run: Run) -> Union[str, bytes]:
    """``run`` rendered by the renderer called ``name`` (:data:`RENDERERS`)."""
    if name not in RENDERERS:
        raise ValueError(f"no renderer {name!r}: one of {sorted(RENDERERS)}")
    return RENDERERS[name].render(run)


def write_folder(folder: Union[str, Path], run: Run, skip: Sequence[str] = ()) -> List[Path]:
    """Write every renderer with a ``file`` that ``run`` has what it reads for into
    ``folder`` (but those named in ``skip``); returns the paths written."""
    out = []
    for r in RENDERERS.values():
        if r.file is not None and r.name not in skip and r.wants(run):
            out.append(r.write(run, Path(folder) / r.file))
    return out
