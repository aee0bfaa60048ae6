"""Profile a training script nobody changed: ``python -m instrumented_convs run script.py``.

The hooks (:mod:`.hooks`) instrument what the script builds and time its loop, :mod:`.script`
runs it as ``python`` would, :mod:`.runs` saves and reads run folders, :mod:`.cli` and :mod:`.view`
hold the command lines, :mod:`.ondemand` is a job's listener for ``capture`` (:mod:`.capture`).
Below is what the integrations (:mod:`instrumented_convs.lightning`, the notebook) use of it.
"""

from .hooks import Hooks
from .ondemand import listen as listen_on_demand
from .ondemand import stop as stop_on_demand
from .runs import (
    TRACE_LIMIT,
    SavedRun,
    environment,
    load,
    merge_folder,
    run_data,
    run_meta,
    saved_page_html,
    saved_render_input,
    saved_summary,
    summary_of,
    write_run,
)

__all__ = [
    "Hooks",
    "TRACE_LIMIT",
    "SavedRun",
    "environment",
    "load",
    "merge_folder",
    "listen_on_demand",
    "stop_on_demand",
    "run_data",
    "run_meta",
    "saved_page_html",
    "saved_render_input",
    "saved_summary",
    "summary_of",
    "write_run",
]
