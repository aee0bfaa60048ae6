"""For people who instrument their own layers: :func:`step`, :func:`mark_outputs`, the one gate
:func:`recording` and :func:`current_path` (an example: docs/guide.rst). A user of the
drop-in layers needs none of this. :class:`InstrumentedLayer`, the base of every
instrumented layer, is here for tools (``run``) to tell ours from others, and
:func:`time_changes` and :func:`keep_layers` for ``run --advise`` to time the advice's changes
after the script; not in ``__all__``.
"""

from __future__ import annotations

from ..core.steps.step import Step, current_path, mark_outputs, recording, step
from . import compiling, precision  # noqa: F401  (the changes they time, registered)
from .contract import InstrumentedLayer  # noqa: F401  (for tools: see the docstring)
from .trials import keep_layers  # noqa: F401  (for tools: see the docstring)
from .trials import measure as time_changes  # noqa: F401  (for tools: see the docstring)

__all__ = ["step", "Step", "mark_outputs", "recording", "current_path"]
