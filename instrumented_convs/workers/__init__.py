"""Data loaders and their worker processes, recorded: the training loop's wait for each batch,
the batches each worker makes, and the sampler's steps wherever they run. ``run`` records
them without a change to the script; :func:`instrument_loader` does it in your own code
(docs/minibatch.md). Workers write frames as each batch is made, so a killed worker loses
none of them.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Dict, Optional

from ..core.steps.step import Step
from .recorder import LOADERS, Recorder
from .sites import made_at

__all__ = [
    "instrument_loader",
    "loaders_result",
    "loaders_report",
    "uninstrument_loaders",
    "Recorder",
    "LOADERS",
    "DATA",
]

DATA = "data"  #: the region of the training loop's wait for a batch
_recorder: Optional[Recorder] = None
_lock = threading.Lock()


def instrument_loader(loader: Any) -> Any:
    """Record ``loader`` (a torch ``DataLoader``, PyG's and DGL's included) from its next
    ``iter()``: the wait for each batch as the region ``data`` (the sampler's steps inside
    where they run in this process), and, with ``num_workers > 0``, each worker process's
    batches and steps. Call it before the loop: the workers of an iterator made before
    (``persistent_workers``) are not recorded. Returns ``loader``."""
    global _recorder
    with _lock:
        if _recorder is None:
            _recorder = Recorder(loaders=[], region=Step(DATA, None, "cpu", "region"))
            _recorder.install()
        _recorder.add(loader, made_at(sys._getframe(1)))  # (made before: where it is given)
    return loader


def loaders_result() -> Dict[str, Any]:
    """What the loaders given to :func:`instrument_loader` recorded, as plain data (as
    ``run.json``'s ``workers`` section: ``loaders`` and ``workers``)."""
    if _recorder is None:
        return {"loaders": [], "workers": []}
    return _recorder.result()


def loaders_report(by: str = "step", unit: Optional[str] = None, each: bool = False) -> str:
    """The text of :func:`loaders_result`: per loader how an iteration splits between
    waiting for data and the rest, its verdict, and the workers' table (``each``: each
    worker's own too)."""
    from ..report import workers_text

    return workers_text(loaders_result(), by=by, unit=unit, each=each)


def uninstrument_loaders() -> None:
    """Stop recording the loaders given to :func:`instrument_loader` and forget what their
    workers recorded."""
    global _recorder
    with _lock:
        if _recorder is not None:
            _recorder.close()
            _recorder = None
