"""Every output of a run, by name: :data:`RENDERERS`, one :class:`Renderer` per format.

A renderer reads one :class:`RenderInput` (the summary, the timeline, the machine's peaks,
the loaders' records, the page's title) and returns text or bytes; :func:`write_folder` asks
each whether it has a file to write. The summary's own exports go through here, so this
module never imports the summary.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from . import columns, memory, page, roofline, timeline
from .loaders import pipeline
from .row import FIELDS
from .text import TableRenderer
from .whole import write_whole
from .worker_tracks import with_workers

__all__ = ["RenderInput", "Run", "Renderer", "RENDERERS", "register", "render", "write_folder"]


@dataclass
class RenderInput:
    """Everything a renderer may read of one run; each takes what it needs.

    ``summary`` (a :class:`~.summary.Summary`: every format but ``trace`` reads it);
    ``title`` (the page's), ``meta`` (``(label, value)`` pairs shown under it: command,
    versions, device, settings), ``note`` (a line under its chart) and ``subtitle``;
    ``timeline`` (a :class:`~.timeline.Timeline`, or a Chrome trace already made) with its
    ``pid`` and ``name`` in a trace; for the counters' table the machine's ``peak`` and
    ``times`` (a summary of a run without the counters); ``loaders``: the run's data loaders
    and their worker processes (``run.json``'s ``workers``); ``advice``: what to change
    (:mod:`.rules`' items; None: the run was not advised); ``options``: the text table's
    (``title``, ``unit``, ``spread``, ``notes``), the JSON's ``indent``, the loaders'
    ``each``."""

    summary: Any = None
    title: Optional[str] = None
    meta: Sequence[Tuple[str, Any]] = ()
    note: str = ""
    timeline: Any = None
    pid: Optional[int] = None
    name: Optional[str] = None
    peak: Any = None
    times: Any = None
    options: Dict[str, Any] = field(default_factory=dict)
    loaders: Any = None
    subtitle: Optional[str] = None
    advice: Any = None


#: The name :class:`RenderInput` had; kept for code that imports it.
Run = RenderInput


class Renderer:
    """One output format: its ``name``, the ``file`` it has in a run folder (``None``: not
    written there), whether it is ``binary`` (bytes: written, never printed), and
    :meth:`render`."""

    name = ""
    file: Optional[str] = None
    binary = False

    def wants(self, inp: RenderInput) -> bool:
        """Whether ``inp`` has what this renderer reads: a run folder gets its file only
        then. By default, a summary."""
        return inp.summary is not None

    def render(self, inp: RenderInput) -> Union[str, bytes]:
        """``inp`` in this format."""
        raise NotImplementedError

    def write(self, inp: RenderInput, path: Union[str, Path]) -> Path:
        """Write ``inp`` in this format to ``path``, whole or not at all; returns the path."""
        out = self.render(inp)
        if isinstance(out, str) and not out.endswith("\n"):
            out += "\n"
        return write_whole(path, out)


class Text(Renderer):
    """The table (``str(summary)``; options: ``title``, ``unit``, ``spread``, ``notes``)."""

    name, file = "text", "summary.txt"

    def render(self, inp: RenderInput) -> str:
        """The text table (:class:`~.text.TableRenderer`)."""
        s, o = inp.summary, inp.options
        table = TableRenderer(
            unit=o.get("unit") or s.unit,
            title=o.get("title", "Timer summary"),
            spread=o.get("spread", True),
            notes=o.get("notes", ()),
        )
        return table.render(s)


class Page(Renderer):
    """The self-contained HTML page: icicle, table, per-rank totals, the loaders' split."""

    name, file = "page", "page.html"

    def render(self, inp: RenderInput) -> str:
        """The page; ``inp.loaders``: the loaders' records (or their split, already made)."""
        loaders = inp.loaders
        if isinstance(loaders, dict):
            loaders = pipeline(loaders, inp.summary) if loaders else None
        return page.summary_page(
            inp.summary,
            inp.title or "instrumented_convs",
            subtitle=inp.subtitle,
            meta=inp.meta,
            note=inp.note,
            loaders=loaders,
            advice=inp.advice,
        )


class Json(Renderer):
    """The summary as JSON (``Summary.to_dict``; ``Summary.from_json`` reads it back);
    option: ``indent`` (2; None: one line)."""

    name = "json"

    def render(self, inp: RenderInput) -> str:
        """The JSON text."""
        return json.dumps(inp.summary.to_dict(), indent=inp.options.get("indent", 2))


class Csv(Renderer):
    """The rows as CSV (``Summary.from_csv`` reads it back): a header line, every field, then
    the values of the columns no field holds (:mod:`.columns`); times in seconds, repr
    precision. Merged over ranks: the merged rows (empty ``rank``), then each rank's."""

    name = "csv"

    def render(self, inp: RenderInput) -> str:
        """The CSV text."""
        s = inp.summary
        out = io.StringIO()
        names = FIELDS + [c.key for c in columns.derived()]
        writer = csv.DictWriter(out, fieldnames=names, lineterminator="\n")
        writer.writeheader()
        parts = s.by_rank() if s.world_size is not None else []
        for row in [*s.rows, *(r for part in parts for r in part.rows)]:
            d = columns.as_dict(row)
            d = {
                k: ("" if v is None else (repr(v) if isinstance(v, float) else v))
                for k, v in d.items()
            }
            writer.writerow(d)
        return out.getvalue()


class Roofline(Renderer):
    """The counters' table: FLOPs, bytes, intensity and the roofline per step."""

    name = "roofline"

    def wants(self, inp: RenderInput) -> bool:
        """Only where the counters counted anything."""
        return inp.summary is not None and any(r.ops for r in inp.summary.rows)

    def render(self, inp: RenderInput) -> str:
        """The counters' table (against ``inp.peak``, with ``inp.times``' times)."""
        unit = inp.options.get("unit")
        return roofline.render(inp.summary, inp.peak, unit or inp.summary.unit, times=inp.times)


class Memory(Renderer):
    """The memory table: what each step keeps for backward, and its peak."""

    name = "memory"

    def wants(self, inp: RenderInput) -> bool:
        """Only where memory was recorded."""
        return inp.summary is not None and bool(memory.rows_of(inp.summary))

    def render(self, inp: RenderInput) -> str:
        """The memory table."""
        return memory.render(inp.summary)


class Trace(Renderer):
    """The timeline as a Chrome trace, gzipped (Perfetto, ``chrome://tracing``), with the
    loaders' worker processes where they recorded calls."""

    name, file, binary = "trace", "trace.json.gz", True

    def wants(self, inp: RenderInput) -> bool:
        """Only where a timeline was recorded."""
        return inp.timeline is not None

    def trace(self, inp: RenderInput) -> Dict[str, Any]:
        """The trace as a dict: a timeline's (its workers' processes joined), or a trace
        already made (read back, merged) as it is."""
        tl = inp.timeline
        if isinstance(tl, dict):
            return tl
        trace = tl.to_chrome(pid=inp.pid, name=inp.name)
        if isinstance(inp.loaders, dict) and inp.loaders:
            trace = with_workers(trace, inp.loaders, tl.wall_offset_ns)
        return trace

    def render(self, inp: RenderInput) -> bytes:
        """The gzipped JSON of the trace."""
        return gzip.compress(json.dumps(self.trace(inp)).encode())

    def write(self, inp: RenderInput, path: Union[str, Path]) -> Path:
        """Write the trace to ``path`` (``.gz``: gzipped; else plain JSON)."""
        return timeline.write_trace(path, self.trace(inp))


#: Every renderer, by name (:func:`register` adds one; ``del RENDERERS[name]`` takes it out).
RENDERERS: Dict[str, Renderer] = {}


def register(renderer: Renderer) -> Renderer:
    """Put ``renderer`` in :data:`RENDERERS` under its name (replacing one of that name):
    ``render``, ``Summary.render``, ``view --format``, ``run --format`` and every run folder
    then know it. Returns it."""
    RENDERERS[renderer.name] = renderer
    return renderer


for _renderer in (Text(), Page(), Json(), Csv(), Roofline(), Memory(), Trace()):
    register(_renderer)


def render(name: str, inp: RenderInput) -> Union[str, bytes]:
    """``inp`` rendered by the renderer called ``name`` (:data:`RENDERERS`)."""
    if name not in RENDERERS:
        raise ValueError(f"no renderer {name!r}: one of {sorted(RENDERERS)}")
    return RENDERERS[name].render(inp)


def write_folder(
    folder: Union[str, Path], inp: RenderInput, skip: Sequence[str] = ()
) -> List[Path]:
    """Write into ``folder`` the file of every renderer that has one and finds what it reads
    in ``inp`` (:meth:`Renderer.wants`), but those named in ``skip``; returns the paths."""
    out = []
    for r in list(RENDERERS.values()):
        if r.file is not None and r.name not in skip and r.wants(inp):
            out.append(r.write(inp, Path(folder) / r.file))
    return out
