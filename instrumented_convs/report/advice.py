"""The advice as an output: the section "What to change" in text, ``advice.json`` in a run
folder (``{"advice": [...]}``) and the page's; the items are :mod:`.rules`' decisions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

from .renderers import Renderer, RenderInput, register
from .rules import MIN_SHARE, Record, decide, lines

__all__ = ["Advice", "advice_of"]


def advice_of(
    summary: Any,
    signals: Optional[Dict[str, Any]] = None,
    loaders: Optional[Dict[str, Any]] = None,
    iterations: Optional[int] = None,
    min_share: float = MIN_SHARE,
) -> List[Dict[str, Any]]:
    """The advice of a record: ``summary`` by layer, the layers' ``signals``, the run's
    ``loaders`` section and its ``iterations`` where it knows them; items worth ``min_share``
    of the recorded time or more."""
    return decide(Record(summary, signals, loaders, iterations), min_share)


class Advice(Renderer):
    """What to change, the largest time at stake first (``run --advise``, ``view --format
    advice``); written as ``advice.json`` where the run was advised."""

    name, file = "advice", "advice.json"

    def wants(self, inp: RenderInput) -> bool:
        """Only where the run was advised (its signals recorded)."""
        return inp.advice is not None

    def render(self, inp: RenderInput) -> str:
        """The section's text."""
        return "\n".join(lines(inp.advice or []))

    def write(self, inp: RenderInput, path: Union[str, Path]) -> Path:
        """``{"advice": [...]}`` as JSON."""
        p = Path(path)
        p.write_text(json.dumps({"advice": inp.advice or []}, indent=1) + "\n")
        return p


register(Advice())
