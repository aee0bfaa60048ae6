"""The data loaders' worker processes as tables, and the ``workers`` renderer that prints
them with each loader's split and verdict (:mod:`.loaders`).

Each worker's table is a summary of its own registry; the workers of one loader are merged
as ranks are. It summarises snapshots, so it sits above the summary and registers its
renderer in :data:`~.renderers.RENDERERS` itself.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from ..core.storage.entry import EntryStats
from .loaders import COMPUTE_BOUND, DATA_BOUND, IDLE, pipeline, verdict
from .renderers import Renderer, RenderInput, register
from .stats import merge_ranks, summarize
from .summary import Summary

__all__ = [
    "DATA_BOUND",
    "COMPUTE_BOUND",
    "IDLE",
    "pipeline",
    "verdict",
    "workers_summary",
    "worker_summaries",
    "workers_text",
    "Workers",
]


def _stats(snapshot: Dict[str, Any]) -> List[EntryStats]:
    fields = snapshot["fields"]
    known = set(EntryStats._fields)
    if tuple(fields) == EntryStats._fields:
        return [EntryStats(*e) for e in snapshot["entries"]]
    return [
        EntryStats(**{k: v for k, v in zip(fields, e) if k in known}) for e in snapshot["entries"]
    ]


def worker_summaries(
    section: Dict[str, Any], by: str = "step", unit: Optional[str] = None
) -> List[Summary]:
    """Each worker process's own summary, in the section's order."""
    return [summarize(_stats(w["snapshot"]), by=by, unit=unit) for w in section["workers"]]


def workers_summary(
    section: Dict[str, Any],
    by: str = "step",
    unit: Optional[str] = None,
    loader: Optional[str] = None,
    rank: Any = False,
) -> Optional[Summary]:
    """The workers' summaries merged, the spread over workers (None without workers);
    ``loader`` (a label) and ``rank``: those of one loader of one rank only."""
    snaps = [
        _stats(w["snapshot"])
        for w in section.get("workers", ())
        if (loader is None or w["loader"] == loader) and (rank is False or w.get("rank") == rank)
    ]
    return merge_ranks(snaps, by=by, unit=unit, over="workers") if snaps else None


def _who(w: Dict[str, Any]) -> str:
    rank = "" if w.get("rank") is None else f"rank {w['rank']}, "
    return f"{rank}{w['loader']}, worker {w['worker']} (pid {w['pid']})"


def workers_text(
    section: Dict[str, Any],
    by: str = "step",
    unit: Optional[str] = None,
    each: bool = False,
    summary: Any = None,
) -> str:
    """Per loader: the pipeline, its verdict and its workers' table (merged over them;
    ``each``: each worker's own too); ``summary``: the training process's (its copies)."""
    lines: List[str] = []
    shown = {(p["label"], p["rank"]): p for p in pipeline(section, summary)}
    keys = list(shown)
    for w in section.get("workers", ()):  # loaders whose workers made batches no loop took
        if (w["loader"], w.get("rank")) not in keys:
            keys.append((w["loader"], w.get("rank")))
    for label, rank in keys:
        where = "" if rank is None else f" (rank {rank})"
        p = shown.get((label, rank))
        if p is not None:
            if lines:
                lines.append("")
            made = ""
            if p["made"] is not None:
                n = len(p["busy"]) or p["processes"]
                made = f", {p['made']} made by {n} worker{'s' if n > 1 else ''}"
                if p["processes"] > n:
                    made += f" ({p['processes']} processes)"
            many = p.get("loaders", 1)
            made_there = f" ({many} loaders made there)" if many > 1 else ""
            copy = f", the copy to the device {p['copy']:.0%}" if p["copy"] >= 0.005 else ""
            here = ", ".join(f"{k} {v:.0%}" for k, v in p["own"].items() if v >= 0.005)
            copy = (f" (the loader's work in this process: {here})" if here else "") + copy
            ms = p["iteration_ms"]
            each_ms = f"{ms:,.0f}" if ms >= 100 else f"{ms:.3g}"
            lines.append(
                f"Loader {label}{made_there}{where}: {p['consumed']} batches taken{made}; "
                f"{each_ms} ms an "
                f"iteration: waiting for data {p['wait']:.0%}{copy}, the rest (compute) "
                f"{p['compute']:.0%}"
            )
            lines.append(f"  {p['verdict']}")
            if p["busy"]:
                lines.append("  busy: " + ", ".join(f"{b:.0%}" for b in p["busy"]))
        merged = workers_summary(section, by=by, unit=unit, loader=label, rank=rank)
        if merged is not None and merged.rows:
            lines += ["", merged.table(title=f"Loader {label}{where}: its workers")]
    if each:
        for w, s in zip(section["workers"], worker_summaries(section, by=by, unit=unit)):
            head = f"{_who(w)}: {w['batches']} batches, {w['failed']} failed, {w['passes']} passes"
            lines += ["", s.table(title=head, spread=False)]
    return "\n".join(lines)


class Workers(Renderer):
    """The data loaders: per loader the split of an iteration, its verdict and its workers'
    table (``options["each"]``: each worker's own table too), under the summary's grouping
    and unit. Printed by ``run`` under the table and by ``view --workers``."""

    name = "workers"

    def wants(self, inp: RenderInput) -> bool:
        """Only where the run recorded a data loader."""
        return bool(inp.loaders)

    def render(self, inp: RenderInput) -> str:
        """The loaders' text."""
        s = inp.summary
        by, unit = (s.by, s.unit) if s is not None else ("step", None)
        each = inp.options.get("each", False)
        return workers_text(inp.loaders, by=by, unit=unit, each=each, summary=s)


register(Workers())
