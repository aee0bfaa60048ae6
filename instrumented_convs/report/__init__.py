"""The report: summaries of what steps recorded, and every output made of them.

It reads snapshots (the registry's plain data, :class:`~instrumented_convs.core.storage.entry.
EntryStats`) and nothing else of the core. What it holds, by module:

- :mod:`.summary`: :class:`Summary`, what ``registry.summary()`` returns (rows of numbers,
  selection, the diff of two, and JSON, CSV and pandas both ways); :mod:`.row`: :class:`Row`;
  :mod:`.stats`: the arithmetic from snapshots to rows, and merging ranks;
- :mod:`.columns`: the one list of a table's columns (:class:`Column`), its unit;
- :mod:`.renderers`: every output by name (text, page, JSON, CSV, roofline, trace) and the
  files of a run folder; the formats themselves in :mod:`.text`, :mod:`.page`,
  :mod:`.roofline` (the counters' table) and :mod:`.timeline` (:class:`Timeline`, what
  ``registry.timeline()`` returns, and Chrome traces);
- :mod:`.diff`: two summaries side by side; :mod:`.saved`: reading a saved run
  (:func:`read_run`); :mod:`.tensorboard`: a summary as TensorBoard scalars
  (``Summary.to_tensorboard``); :mod:`.workers`: data loaders and their worker processes
  (the split of an iteration, its verdict, the workers' tables), and
  :mod:`.worker_tracks`, their processes on the timeline.

:data:`__all__` is its API: users read summaries, rows and timelines; the commands (``run``,
``view``, ``check``...) and integrations use the rest, never a module inside the report.
"""

from ..core.storage.entry import BACKWARD_MARK, EntryStats
from . import columns
from .columns import UNITS, Column, choose_unit
from .diff import DiffRow, SummaryDiff
from .page import in_notebook
from .renderers import RENDERERS, Renderer, Run, render, write_folder
from .roofline import Peak
from .row import Row
from .saved import FORMAT as RUN_FORMAT
from .saved import RUN_FILE
from .saved import VERSION as RUN_VERSION
from .saved import read as read_run
from .stats import check_by, merge_ranks, summarize
from .summary import Summary
from .text import TableRenderer
from .timeline import Timeline, merge_traces, read_trace, write_trace
from .worker_tracks import with_workers
from .workers import pipeline, workers_summary, workers_text

#: The report's API: what users read (the first ten), and what the commands and
#: integrations use (never a module inside the report).
__all__ = [
    "Row",
    "Column",
    "Summary",
    "SummaryDiff",
    "DiffRow",
    "Timeline",
    "TableRenderer",
    "UNITS",
    "BACKWARD_MARK",
    "choose_unit",
    "columns",
    "read_run",
    "RUN_FILE",
    "RUN_FORMAT",
    "RUN_VERSION",
    "EntryStats",
    "Peak",
    "Run",
    "Renderer",
    "RENDERERS",
    "render",
    "write_folder",
    "summarize",
    "merge_ranks",
    "check_by",
    "merge_traces",
    "read_trace",
    "write_trace",
    "in_notebook",
    "pipeline",
    "workers_summary",
    "workers_text",
    "with_workers",
]
