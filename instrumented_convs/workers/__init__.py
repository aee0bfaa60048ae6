"""Data loaders and their worker processes, recorded: the training loop's wait for each batch,
the batches each worker makes, and the sampler's steps wherever they run.

Mini-batch training splits each iteration between waiting for the next batch and the
compute; with ``num_workers > 0`` the batches are made in torch ``DataLoader`` worker
processes (PyG's ``NeighborLoader``, ``LinkNeighborLoader`` and ``DataLoader`` and DGL's
``DataLoader`` are ones), fork or spawn, persistent or not. ``run`` records them without a
change to the script; in your own code::

    from instrumented_convs import registry
    from instrumented_convs.workers import instrument_loader, loaders_report

    loader = instrument_loader(NeighborLoader(data, ..., num_workers=4))
    for epoch in range(3):
        for batch in loader:
            ...                              # your training step
    print(registry.summary())                # "data" (the wait), your steps, the layers'
    print(loaders_report())                  # the split, its verdict, the workers' table

What each worker process records (the region ``batch`` from taking a task to handing its
batch over, the sampler's steps inside: :mod:`.samplers`) reaches the training process in
frames written as each batch is made (:mod:`.frames`, :mod:`.process`), so a worker that is
killed loses none of the batches it made. :class:`Recorder` is the machinery (``run`` holds
one); :func:`instrument_loader` keeps one for the loaders you give it.
"""

from __future__ import annotations

import threading
from typing import Any, Dict, Optional

from ..core.steps.step import Step
from .recorder import LOADERS, Recorder

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
        _recorder.add(loader)
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
