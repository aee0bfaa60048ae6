"""The loaders' worker processes on the timeline (:func:`with_workers`): a process each, and
arrows to the wait that took each batch, so that a trace shows which batch the loop waited
for and who made it.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from typing import Any, Dict, List, Tuple

from .timeline import Timeline, merge_traces

__all__ = ["with_workers"]

_MAIN_TID = 1  # the training process's main thread in its trace (Timeline.to_chrome)


def _who(w: Dict[str, Any]) -> str:
    rank = "" if w.get("rank") is None else f"rank {w['rank']}, "
    return f"{rank}{w['loader']}, worker {w['worker']} (pid {w['pid']})"


def _main_pid(trace: Dict[str, Any]) -> Any:
    for ev in trace.get("traceEvents", ()):
        if ev.get("ph") == "M" and ev.get("name") == "process_name":
            return ev["pid"]
    return None


def with_workers(
    trace: Dict[str, Any], section: Dict[str, Any], wall_offset_ns: int
) -> Dict[str, Any]:
    """``trace`` (the training process's Chrome trace) with its loaders' worker processes
    (``section``: ``run.json``'s ``workers``) and an arrow from each batch to the wait that
    took it. ``wall_offset_ns``: the training process's (:attr:`Timeline.wall_offset_ns`).

    A worker process records its own calls (the region ``batch``, the sampler's steps inside) on
    the CPU clock, which on Linux is one clock for every process of the machine
    (``CLOCK_MONOTONIC``), so its calls share the training process's time base. Each worker is a
    process of the trace of its own, named for its rank, loader and worker number; a flow arrow
    goes from the end of each batch a worker made to the training process's ``data`` wait during
    which the loop took it (the batch of the same task index that the worker finished last
    before that moment, so a persistent worker's passes pair right); it leaves from the middle
    of the batch's slice, which viewers bind it to.
    """
    workers = [w for w in section.get("workers", ()) if w.get("calls")]
    if not workers:
        return trace
    parts = [trace]
    for w in workers:
        tl = Timeline(
            {
                "calls": [tuple(c) for c in w["calls"]],
                "limit": 0,
                "recording": False,
                "truncated": None,
                "main_thread": w["calls"][0][7],
                "wall_offset_ns": wall_offset_ns,
            }
        )
        parts.append(tl.to_chrome(pid=w["pid"], name=_who(w)))
    merged = merge_traces(parts)
    base = merged["otherData"]["base_ns"]
    main = _main_pid(trace)

    def us(t: int) -> float:
        return round((t + wall_offset_ns - base) / 1e3, 3)

    flows: List[Dict[str, Any]] = []
    n = max((e.get("id", 0) for e in merged["traceEvents"] if e.get("cat") == "flow"), default=0)
    for loader in section.get("loaders", ()):
        made: Dict[int, List[Tuple[int, int, Any]]] = defaultdict(list)  # idx -> (t1, t0, pid)
        for w in workers:
            if w["loader"] == loader["label"] and w.get("rank") == loader.get("rank"):
                for idx, _, t0, t1, ok in w["spans"]:
                    if ok:
                        made[idx].append((t1, t0, w["pid"]))
        for batches in made.values():
            batches.sort()
        for t, idx in loader.get("taken", ()):
            batches = made.get(idx, [])
            i = bisect.bisect_right(batches, (t, float("inf"), None)) - 1
            if i < 0:
                continue
            t1, t0, pid = batches[i]
            n += 1
            common = {"name": "batch -> loop", "cat": "flow", "id": n}
            start = us((t0 + t1) // 2)  # inside the batch's slice, so the arrow binds to it
            flows.append(dict(common, ph="s", pid=pid, tid=_MAIN_TID, ts=start))
            flows.append(dict(common, ph="f", bp="e", pid=main, tid=_MAIN_TID, ts=us(t)))
    merged["traceEvents"].extend(flows)
    return merged
