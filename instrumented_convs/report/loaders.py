"""A data loader's pipeline: how an iteration splits between waiting for data, the copy to
the device and the rest, and its verdict (data-bound, compute-bound, balanced).

Plain data in (``run.json``'s ``workers`` section), plain data out: the page draws it and
:mod:`instrumented_convs.report.workers` prints it, so it stays below the summary and
imports nothing of the package.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

__all__ = ["DATA_BOUND", "COMPUTE_BOUND", "IDLE", "pipeline", "verdict"]

COPY = "copy"  #: the training process's region of a batch's copy to its device
DATA = "data"  #: the training process's region of the wait for a batch
DATA_BOUND = 0.20  #: the trainer waits this share of its time or more: data-bound
COMPUTE_BOUND = 0.05  #: under this share: compute-bound
IDLE = 0.5  #: workers busy less than this share of the time keep up with the loop


def _of(section: Dict[str, Any], loader: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The worker processes of ``loader`` (the same rank's, the same label)."""
    return [
        w
        for w in section.get("workers", ())
        if w["loader"] == loader["label"] and w.get("rank") == loader.get("rank")
    ]


def verdict(wait_share: float, busy: List[float], own: Optional[Dict[str, float]] = None) -> str:
    """``data-bound``, ``compute-bound`` or ``balanced``, with the figures that say so.

    Data-bound when the trainer waits :data:`DATA_BOUND` of the time or more (the workers do
    not keep up: more workers, a cheaper sampler, features sliced in the workers), or, with
    the workers mostly idle, the training process's own part of the loading or each batch's
    hand-over is what it waits for; compute-bound under :data:`COMPUTE_BOUND` (the loading
    is hidden behind the compute); balanced between. ``own``: the loader's steps run in the
    training process while it waited (step name -> share of the time: collating, PyG's
    ``filter_per_worker=False``, DGL's feature slicing), named when they are most of the
    wait of a loop that is not compute-bound; failing that, workers busy under :data:`IDLE`
    are said to keep up."""
    kind = (
        "data-bound"
        if wait_share >= DATA_BOUND
        else "compute-bound"
        if wait_share < COMPUTE_BOUND
        else "balanced"
    )
    text = f"{kind}: the trainer waits {wait_share:.0%} of each iteration"
    if busy:
        mean = sum(busy) / len(busy)
        text += f"; {len(busy)} worker{'s' if len(busy) > 1 else ''} busy {mean:.0%}"
    elif kind != "compute-bound":
        text += " (no worker processes: the batches are made in the training process)"
    here = sum((own or {}).values())
    if kind == "compute-bound" or not busy:
        return text
    if here >= wait_share / 2:
        parts = ", ".join(
            f"{k} {v:.0%}" for k, v in sorted((own or {}).items(), key=lambda x: -x[1])
        )
        text += f": most of the wait is the loader's work in this process ({parts})"
    elif sum(busy) / len(busy) < IDLE:
        text += (
            ": the workers keep up; the wait is each batch's hand-over (its transfer from "
            "the worker) or this process's share of the loading"
        )
    return text


def _own(summary: Any, span: int) -> Dict[str, float]:
    """A record without its own work (saved before it was kept per loader): the steps
    directly inside the ``data`` regions, name -> share of ``span`` ns."""
    out: Dict[str, float] = {}
    if summary is None or not span:
        return out
    for r in summary.rows:
        parts = r.name.split("/")
        if len(parts) >= 2 and parts[-2] == DATA:
            out[parts[-1]] = out.get(parts[-1], 0.0) + r.total * 1e9 / span
    return out


def _copied(summary: Any) -> float:
    """A record without its copies: seconds in the training process's ``copy`` regions
    outside the waits for a batch."""
    if summary is None:
        return 0.0
    return sum(
        r.total
        for r in summary.rows
        if r.name.rsplit("/", 1)[-1] == COPY and DATA not in r.name.split("/")[:-1]
    )


def _busy(workers: List[Dict[str, Any]], first: int, span: int) -> List[float]:
    """Each worker's share of ``span`` busy making batches (after ``first``), in worker
    order: the processes of one worker index added together (a loader made every epoch
    starts new ones)."""
    by_index: Dict[int, int] = {}
    for w in workers:
        ns = sum(t1 - t0 for _, _, t0, t1, _ in w["spans"] if t1 >= first)
        by_index[w["worker"]] = by_index.get(w["worker"], 0) + ns
    return [min(1.0, by_index[i] / span) for i in sorted(by_index)]


def pipeline(section: Dict[str, Any], summary: Any = None) -> List[Dict[str, Any]]:
    """Per loader (the loaders made at one place: ``label``, ``loaders`` of them): ``rank``,
    ``workers``, ``processes``, ``consumed`` (batches the training process took), ``made``
    (batches its workers made; None without workers), ``wait``, ``copy`` and ``compute``
    (shares of the loader's passes, each from its first ``__next__`` to the call that
    ended it, the tool's one-time work left out: waiting for a batch, copying it to the
    device (PyG's and DGL's batches' ``.to``, the host's time), the rest: forward, backward,
    the optimizer, the script's own work), ``own`` (the loader's steps that ran in the
    training process while it waited: name -> share; at most ``wait`` together), ``busy``
    (each worker's share, in worker order: the time it was busy making batches),
    ``iteration_ms`` (a pass's time per batch taken) and ``verdict``. ``summary``: the
    training process's, read for a record saved before loaders kept their own work (then
    given to the loader that handed out the most batches)."""
    loaders = [x for x in section.get("loaders", ()) if x.get("span") and x.get("consumed")]
    main = max(loaders, key=lambda x: x["consumed"], default=None)
    out = []
    for loader in loaders:
        span = loader["span"]
        workers = sorted(_of(section, loader), key=lambda w: (w["worker"], w["pid"]))
        wait = min(1.0, loader["wait"] / span)
        if "own" in loader:
            own = {k: min(wait, v / span) for k, v in loader["own"].items()}
            copy = min(1.0 - wait, loader["copy"] / span)
        else:
            own = _own(summary, span) if loader is main else {}
            copy = min(1.0 - wait, _copied(summary) * 1e9 / span) if loader is main else 0.0
        first = loader.get("first") or 0  # batches made before the first timed pass aside
        batches = loader.get("batches") or loader["consumed"]
        busy = _busy(workers, first, span)
        out.append(
            {
                "label": loader["label"],
                "loaders": loader.get("loaders", 1),
                "rank": loader.get("rank"),
                "workers": loader["workers"],
                "processes": len(workers),
                "consumed": loader["consumed"],
                "made": sum(w["batches"] for w in workers) if workers else None,
                "wait": wait,
                "copy": copy,
                "compute": 1.0 - wait - copy,
                "busy": busy,
                "own": own,
                "iteration_ms": span / max(batches, 1) / 1e6,
                "verdict": verdict(wait, busy, own),
            }
        )
    return out
