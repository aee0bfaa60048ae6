"""The folder a run leaves behind, and reading it back.

A run folder holds ``run.json``: the summary (``Summary.to_dict()``) and the raw statistics
it was made from (one registry snapshot per rank, so ``view --by layer`` and ``merge`` can
summarise again), with what is needed to trust it later: the command line, the exit code,
versions, the device and the settings used. It is versioned (``format``/``version``);
readers refuse a newer version with a message. ``summary.txt`` is the printed table.

Under torchrun every rank writes ``rank<N>.json`` (the same fields, its own snapshot),
atomically; rank 0 then waits for the others' files (``merge_timeout`` seconds) and writes
the merged ``run.json``. A rank that never reached the end leaves no file; its rank files
are still there and ``python -m instrumented_convs merge DIR`` merges whatever ranks wrote.
The ranks of one job agree on the default folder without talking to each other (see
:mod:`.folders`: a default folder is never another run's).
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from ... import configure, core
from ...report import (
    RENDERERS,
    RUN_FILE,
    RUN_FORMAT,
    RUN_VERSION,
    EntryStats,
    Run,
    Summary,
    Timeline,
    merge_ranks,
    merge_traces,
    read_run,
    read_trace,
    render,
    summarize,
    with_workers,
    write_folder,
)
from .folders import default_folder, job_rank

__all__ = [
    "FORMAT",
    "VERSION",
    "TRACE_LIMIT",
    "default_folder",
    "environment",
    "job_rank",
    "load",
    "merge_folder",
    "summary_of",
    "run_data",
    "run_meta",
    "write_run",
    "write_timeline",
    "trace_of",
    "page_of",
    "outputs_of",
]

FORMAT, VERSION = RUN_FORMAT, RUN_VERSION
#: The calls a run keeps on its timeline by default (about 190 bytes each in memory).
TRACE_LIMIT = 200_000
TRACE_FILE = RENDERERS["trace"].file  #: the timeline, a Chrome trace (all ranks under torchrun)


def _version(module: str) -> Optional[str]:
    if module in sys.modules:
        return getattr(sys.modules[module], "__version__", None)
    try:
        from importlib.metadata import PackageNotFoundError, version

        return version(module.replace("_", "-"))
    except (ImportError, PackageNotFoundError):
        return None


def environment() -> Dict[str, Any]:
    """Versions and the device, as saved with every run."""
    from ... import __version__

    versions = {"python": platform.python_version(), "instrumented_convs": __version__}
    for module in ("torch", "torch_geometric", "dgl", "torch_sparse", "nvtx"):
        versions[module] = _version(module)
    device: Dict[str, Any] = {
        "platform": platform.platform(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda": None,
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        device["cuda"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return {"versions": versions, "device": device, "host": platform.node()}


def run_meta(
    command: Sequence[str],
    target: str,
    args: Sequence[str],
    started: float,
    ended_by: str,
    hooks: Any,
    error: Optional[str] = None,
    exit_code: Optional[int] = None,
    module: Optional[bool] = None,
    **extra: Any,
) -> Dict[str, Any]:
    """What a run folder says of the run besides its numbers: how it was called and ended
    (``ended_by``: ``returned``, ``raised``...; ``exit_code`` 0 when it returned, else 1
    unless given), the settings, the duty cycle's and compilation's reports, the warm-up and
    the classes picked by ``hooks`` (its :class:`~.hooks.Hooks`), the environment; ``extra``
    as it is."""
    return {
        "command": list(command),
        "target": target,
        "module": module,
        "args": list(args),
        "cwd": os.getcwd(),
        "started": started,
        "ended": time.time(),
        "exit_code": exit_code if exit_code is not None else int(ended_by != "returned"),
        "ended_by": ended_by,
        "error": error,
        "settings": configure()._asdict(),
        "sampling": core.duty_cycle(),
        "compiled": core.compiled(),
        "warmup": {"steps": hooks.warmup, "taken": hooks.steps},
        "only": None if hooks.only is None else sorted(hooks.only),
        "exclude": sorted(hooks.exclude),
        **extra,
        **environment(),
    }


def _snapshot(stats: Sequence[EntryStats]) -> Dict[str, Any]:
    return {"fields": list(EntryStats._fields), "entries": [list(s) for s in stats]}


def _stats(data: Dict[str, Any]) -> List[EntryStats]:
    fields = data["fields"]
    if tuple(fields) != EntryStats._fields:  # another version's fields: by name, defaults
        known = set(EntryStats._fields)
        return [
            EntryStats(**{k: v for k, v in zip(fields, e) if k in known}) for e in data["entries"]
        ]
    return [EntryStats(*e) for e in data["entries"]]


def _write(path: Path, data: Dict[str, Any]) -> None:
    """Write JSON atomically (readers never see half a file)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


def run_data(
    snapshot: Sequence[EntryStats],
    meta: Dict[str, Any],
    by: str = "step",
    unit: Optional[str] = None,
    job: Optional[Tuple[Optional[int], Optional[int]]] = None,
) -> Tuple[Dict[str, Any], Summary]:
    """A run as :func:`write_run` saves it (what :func:`load` reads back), and its summary."""
    rank, world = job or job_rank()
    data = {"format": FORMAT, "version": VERSION, "kind": "run" if world is None else "rank"}
    data.update(meta, rank=rank, world_size=world, by=by, unit=unit)
    data["snapshots"] = [_snapshot(snapshot)]
    summary = summarize(
        snapshot, by=by, unit=unit, sampling=meta.get("sampling"), compiled=meta.get("compiled")
    )
    data["summary"] = summary.to_dict()
    return data, summary


def write_run(
    folder: Path,
    snapshot: Sequence[EntryStats],
    meta: Dict[str, Any],
    by: str = "step",
    unit: Optional[str] = None,
    job: Optional[Tuple[Optional[int], Optional[int]]] = None,
) -> Path:
    """Write this process's run (``run.json``, or ``rank<N>.json`` in a job of several
    ranks). ``job``: ``(rank, world_size)`` where the caller knows them (a Lightning
    strategy), else torchrun's environment tells (:func:`job_rank`)."""
    folder.mkdir(parents=True, exist_ok=True)
    data, summary = run_data(snapshot, meta, by, unit, job)
    rank, world = data["rank"], data["world_size"]
    path = folder / (RUN_FILE if world is None else f"rank{rank}.json")
    _write(path, data)
    if world is None:
        write_folder(folder, outputs_of(data, summary))
    return path


def write_timeline(
    folder: Path,
    timeline: Timeline,
    name: str,
    job: Optional[Tuple[Optional[int], Optional[int]]] = None,
    workers: Optional[Dict[str, Any]] = None,
) -> Dict[str, Any]:
    """Write this process's timeline (``trace.json.gz``, or ``rank<N>.trace.json.gz`` in a
    job of several ranks, one process per rank in the viewer); returns what ``run.json``
    says of it. ``job``: as :func:`write_run`'s; ``workers``: the loaders' section of the
    run, whose worker processes join the trace (a process each, arrows to the loop)."""
    folder.mkdir(parents=True, exist_ok=True)
    rank, world = job or job_rank()
    path = folder / (TRACE_FILE if world is None else f"rank{rank}.{TRACE_FILE}")
    pid = os.getpid() if rank is None else rank
    trace: Any = timeline
    if workers:
        trace = with_workers(
            timeline.to_chrome(pid=pid, name=name), workers, timeline.wall_offset_ns
        )
    RENDERERS["trace"].write(Run(timeline=trace, pid=pid, name=name), path)
    return {
        "file": path.name,
        "calls": len(timeline),
        "limit": timeline.limit,
        "truncated": timeline.truncated,
    }


def trace_of(path: "str | os.PathLike[str]") -> Dict[str, Any]:
    """The Chrome trace of a saved run (its folder, or a file in it)."""
    p = Path(path)
    folder = p if p.is_dir() else p.parent
    if not (folder / TRACE_FILE).exists():
        raise FileNotFoundError(
            f"{folder} has no {TRACE_FILE}: the run recorded no timeline (--trace-limit 0?)"
        )
    return read_trace(folder / TRACE_FILE)


def outputs_of(run: Dict[str, Any], summary: Summary, title: Optional[str] = None) -> Run:
    """What the renderers read of a loaded run (``summary``: how it is summarised): its
    command, ending, time, versions, device and settings under the page's title."""
    target = run.get("target") or "run"
    meta = []
    if run.get("command"):
        meta.append(("command", " ".join(map(str, run["command"]))))
    if "exit_code" in run:
        meta.append(("ended", f"{run.get('ended_by', '?')}, exit code {run['exit_code']}"))
    if run.get("started"):
        meta.append(("started", time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(run["started"]))))
    versions = run.get("versions") or {}
    meta.append(("versions", ", ".join(f"{k} {v}" for k, v in versions.items() if v)))
    device = run.get("device") or {}
    meta.append(("device", f"{device.get('cuda') or device.get('cpu')} on {run.get('host')}"))
    settings = run.get("settings") or {}
    meta.append(("settings", ", ".join(f"{k}={v}" for k, v in settings.items())))
    sampling = run.get("sampling")
    if sampling:
        meta.append(
            (
                "sampled",
                f"{sampling['recorded']} of {sampling['iterations']} iterations recorded "
                + (
                    f"(budget {100 * sampling['budget']:g}%, one in {sampling['every']} at the end)"
                    if sampling.get("budget") is not None
                    else f"(one in {sampling['every']})"
                ),
            )
        )
    if run.get("world_size"):
        missing = run.get("ranks_missing") or []
        meta.append(("ranks", f"{run['world_size']}" + (f", missing {missing}" if missing else "")))
    note = ""
    if settings.get("backward") and settings.get("backward_every", 1) > 1:
        every = settings["backward_every"]
        note = (
            "Cells marked ~ include backward calls whose time is estimated "
            f"(one layer call in {every} is timed step by step)."
        )
    return Run(
        summary, title=title or str(target), meta=meta, note=note, loaders=run.get("workers")
    )


def page_of(run: Dict[str, Any], summary: Summary, title: Optional[str] = None) -> str:
    """The HTML page of a loaded run (``summary``: how it is summarised)."""
    return render("page", outputs_of(run, summary, title))


def load(path: "str | os.PathLike[str]") -> Dict[str, Any]:
    """A saved run as a dict: a run folder, its ``run.json``, or a rank file (``.gz`` too)."""
    return read_run(path)


def summary_of(
    run: Dict[str, Any], by: str = "step", unit: Optional[str] = None, rank: Optional[int] = None
) -> Summary:
    """The summary of a loaded run, summarised again from its statistics: ``by``, ``unit``,
    and ``rank`` (one rank's own part of a merged run)."""
    snapshots = [_stats(s) for s in run["snapshots"]]
    if rank is not None:
        missing = run.get("ranks_missing", [])
        if not 0 <= rank < len(snapshots) or rank in missing:
            have = [r for r in range(len(snapshots)) if r not in missing]
            raise ValueError(f"this run has the ranks {have}, not {rank}")
        return summarize(
            snapshots[rank],
            by=by,
            unit=unit,
            sampling=run.get("sampling"),
            compiled=run.get("compiled"),
        )
    if run.get("kind") != "merged":
        return summarize(
            snapshots[0],
            by=by,
            unit=unit,
            sampling=run.get("sampling"),
            compiled=run.get("compiled"),
        )
    return merge_ranks(
        snapshots, by=by, unit=unit, sampling=run.get("sampling"), compiled=run.get("compiled")
    )


def merge_folder(folder: "str | os.PathLike[str]", wait: float = 0.0) -> Dict[str, Any]:
    """Merge the rank files in ``folder`` into its ``run.json`` (and ``summary.txt``).

    ``wait``: seconds to wait for every rank of the job to write its file; ranks missing
    after that are left out and named in ``ranks_missing``.
    """
    folder = Path(folder)
    deadline = time.monotonic() + wait
    while True:
        files = {int(p.stem[4:]): p for p in folder.glob("rank*.json") if p.stem[4:].isdigit()}
        if not files:
            raise FileNotFoundError(f"{folder} has no rank files (rank<N>.json)")
        runs = {r: load(p) for r, p in files.items()}
        world = max(run["world_size"] or 0 for run in runs.values())
        if len(runs) >= world or time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    world = max(world, max(runs) + 1)
    first = runs[min(runs)]
    merged = {k: v for k, v in first.items() if k not in ("snapshots", "summary", "rank")}
    merged.update(kind="merged", world_size=world)
    merged["ranks_missing"] = [r for r in range(world) if r not in runs]
    merged["per_rank"] = [
        {k: runs[r].get(k) for k in ("rank", "exit_code", "ended_by", "host", "device", "trace")}
        for r in sorted(runs)
    ]
    empty = {"fields": list(EntryStats._fields), "entries": []}  # a missing rank: nothing
    merged["snapshots"] = [runs[r]["snapshots"][0] if r in runs else empty for r in range(world)]
    sections = [runs[r]["workers"] for r in sorted(runs) if runs[r].get("workers")]
    merged.pop("workers", None)
    if sections:  # each rank's loaders and worker processes (each says its rank)
        merged["workers"] = {k: [x for s in sections for x in s.get(k, ())] for k in sections[0]}
    summary = summary_of(merged, by=first.get("by", "step"), unit=first.get("unit"))
    merged["summary"] = summary.to_dict()
    merged.pop("trace", None)  # rank 0's own: the merged run's is the merged timeline
    traces = sorted(folder.glob(f"rank*.{TRACE_FILE}"))
    if traces:  # the ranks' timelines, one process each, on one time base
        merged_trace = merge_traces(read_trace(t) for t in traces)
        RENDERERS["trace"].write(Run(timeline=merged_trace), folder / TRACE_FILE)
        told = [runs[r]["trace"] for r in sorted(runs) if runs[r].get("trace")]
        merged["trace"] = {
            "file": TRACE_FILE,
            "calls": sum(t["calls"] for t in told),
            "limit": max((t["limit"] for t in told), default=None),
            "truncated": any(t["truncated"] for t in told),
        }
    _write(folder / RUN_FILE, merged)
    write_folder(folder, outputs_of(merged, summary))
    return merged
