"""The report: summaries of what steps recorded, and every output made of them.

It reads snapshots (:class:`EntryStats`, the registry's plain data) and nothing else of the
core, so that it can summarise a run saved elsewhere. :data:`__all__` is its API: users read
summaries, rows and timelines; the commands and integrations use the rest, never a module
inside the report.
"""

from ..core.storage.entry import BACKWARD_MARK, EntryStats
from . import columns
from .advice import advice_of
from .columns import UNITS, Column, choose_unit
from .diff import DiffRow, SummaryDiff
from .nsys import ReportError, is_report, read_report, read_reports
from .page import in_notebook
from .renderers import RENDERERS, Renderer, RenderInput, Run, register, render, write_folder
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
from .whole import write_whole
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
    "RenderInput",
    "Run",
    "Renderer",
    "RENDERERS",
    "register",
    "render",
    "write_folder",
    "summarize",
    "merge_ranks",
    "check_by",
    "merge_traces",
    "read_trace",
    "write_trace",
    "write_whole",
    "read_report",
    "read_reports",
    "is_report",
    "ReportError",
    "in_notebook",
    "pipeline",
    "workers_summary",
    "workers_text",
    "with_workers",
    "advice_of",
]
