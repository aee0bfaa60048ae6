"""Profile a training script nobody changed: ``python -m instrumented_convs run script.py``.

- :mod:`.hooks`: while a script runs, every PyG and DGL conv layer it builds is
  instrumented at its model's first call, and the training loop's phases are regions
  without user code: ``forward`` (the outermost module call with grad enabled),
  ``forward (no grad)`` (evaluation), ``backward``, ``optimizer.step`` and ``data`` (with
  the loaders' worker processes recorded: :mod:`instrumented_convs.workers`).
- :mod:`.script`: runs the script or module as ``python`` would (``sys.argv``,
  ``__main__``, ``sys.path``, exit code, exceptions).
- :mod:`.runs`: the run folder left behind (the summary and the raw statistics as
  versioned JSON, the command line, versions, device, settings), one file per rank under
  torchrun and the merged summary, and reading runs back (``view``, ``merge``).
- :mod:`.folders`: the rank of this process, and the default run folder, never another
  run's (runs that start in the same second, torchrun jobs too, get folders of their own).
- :mod:`.cli`: the ``run``, ``view``, ``merge`` and ``diff`` command lines.

What the integrations (:mod:`instrumented_convs.lightning`) use of it is its API below: the
hooks, and writing, merging and reading run folders.
"""

from .hooks import Hooks
from .runs import (
    TRACE_LIMIT,
    environment,
    load,
    merge_folder,
    outputs_of,
    page_of,
    run_data,
    run_meta,
    summary_of,
    write_run,
    write_timeline,
)

__all__ = [
    "Hooks",
    "TRACE_LIMIT",
    "environment",
    "load",
    "merge_folder",
    "outputs_of",
    "page_of",
    "run_data",
    "run_meta",
    "summary_of",
    "write_run",
    "write_timeline",
]
