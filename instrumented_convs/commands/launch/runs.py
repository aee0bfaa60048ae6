"""The folder a run leaves behind, and reading it back: what ``run``, ``view``, ``merge``
and the integrations share.

``run.json`` keeps the raw statistics with the summary, so that a run can be summarised
again (by layer, one rank) and trusted later (command, versions, device, settings); every
other file of the folder is a renderer's. Under torchrun each rank saves its own file and
rank 0 merges them.
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
    Peak,
    RenderInput,
    Summary,
    Timeline,
    advice_of,
    merge_ranks,
    merge_traces,
    read_run,
    read_trace,
    render,
    summarize,
    write_folder,
    write_whole,
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
    "saved_summary",
    "summary_of",
    "run_data",
    "run_meta",
    "run_title",
    "ended_title",
    "capture_notes",
    "write_run",
    "merge_folder",
    "saved_page_html",
    "saved_render_input",
    "SavedRun",
]

FORMAT, VERSION = RUN_FORMAT, RUN_VERSION
#: The calls a run keeps on its timeline by default (its memory: docs/performance.md).
TRACE_LIMIT = 200_000
#: A saved run as :func:`load` reads it (``run.json``'s contents), or as :func:`run_data`
#: and :func:`merge_folder` make it.
SavedRun = Dict[str, Any]
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
    the classes picked by ``hooks`` (its :class:`~.hooks.Hooks`; None: a script of one's
    own, no warm-up, every class), the environment; ``extra`` as it is."""
    warmup = {"steps": hooks.warmup, "taken": hooks.steps} if hooks is not None else None
    only = getattr(hooks, "only", None)
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
        "warmup": warmup,
        "only": None if only is None else sorted(only),
        "exclude": sorted(getattr(hooks, "exclude", ())),
        **extra,
        **environment(),
        **({"signals": core.advice_signals()} if configure().advise else {}),
    }


def run_title(saved: SavedRun) -> Optional[str]:
    """The title of a run's table wherever it is shown (``run``'s end, ``view``, the folder's
    summary.txt): the one ``run`` saved, or for a run saved without one, made the same way
    from its script and ending. None for a run ``run`` did not make (Lightning, a notebook)."""
    if saved.get("title"):
        return str(saved["title"])
    if not saved.get("target") or "lightning" in saved or "cell" in saved:
        return None
    return ended_title(saved["target"], saved.get("ended_by", "returned"), saved.get("exit_code"))


def capture_notes(saved: SavedRun) -> List[str]:
    """What a capture's table says under it (the iterations it holds, of how many asked,
    when), and an on-demand run's (its captures); none for another run."""
    c = saved.get("capture")
    if c:
        of = c.get("of") or "optimizer step"
        what = (
            "from one optimizer step to the next"
            if of == "optimizer step"
            else f"calls of the region {of!r}"
        )
        asked = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(c["asked"]))
        short = "" if c.get("complete") else f" ({c.get('reason') or 'cut short'})"
        span = f"iterations {c['first']}-{c['last']}" if c.get("first") is not None else "none"
        return [
            f"Captured on demand: {span} of the job ({c['recorded']} of the "
            f"{c['iterations']} asked{short}; an iteration {what}), asked {asked}; "
            "Count is exact."
        ]
    demand = saved.get("on_demand")
    if demand is None:
        return []
    caps = demand.get("captures") or []
    if not caps:
        return [
            "On demand: nothing is recorded but what a capture asks for, and no capture was "
            "asked for (capture RUN, while the job runs)."
        ]
    listed = ", ".join(
        f"{Path(c['folder']).name} (iterations {c['first']}-{c['last']})" for c in caps
    )
    first = Path(caps[0]["folder"]).name
    return [
        f"On demand: nothing is recorded but what a capture asks for: {len(caps)} "
        f"capture(s), {listed}; each is a run folder in this one (view RUN/{first})."
    ]


def ended_title(target: str, ended_by: str, exit_code: Optional[int]) -> str:
    """``instrumented_convs run: SCRIPT``, and its exit code where it did not return (an
    autosave's: that the job had not finished)."""
    if ended_by == "running":
        return f"instrumented_convs run: {target}, not finished (autosaved)"
    ended = "" if ended_by == "returned" else f", exit code {exit_code}"
    return f"instrumented_convs run: {target}{ended}"


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
    write_whole(path, json.dumps(data, indent=1))


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
    timeline: Optional[Timeline] = None,
    trace_name: Optional[str] = None,
) -> Path:
    """Write this process's run: ``run.json`` and every renderer's file
    (:func:`~instrumented_convs.report.write_folder`), or in a job of several ranks
    ``rank<N>.json`` and its timeline, ``rank<N>.trace.json.gz`` (rank 0 merges them);
    returns the run's JSON file. ``job``: ``(rank, world_size)`` where the caller knows them
    (a Lightning strategy), else torchrun's environment tells (:func:`job_rank`);
    ``timeline``: this process's, a process named ``trace_name`` in the trace (the loaders'
    worker processes beside it), which the run's ``trace`` describes."""
    folder.mkdir(parents=True, exist_ok=True)
    rank, world = job or job_rank()
    trace_file = TRACE_FILE if world is None else f"rank{rank}.{TRACE_FILE}"
    if timeline is not None:
        meta = dict(meta, trace=_trace_record(timeline, trace_file))
    data, summary = run_data(snapshot, meta, by, unit, (rank, world))
    pid = os.getpid() if rank is None else rank
    inp = saved_render_input(data, summary, timeline=timeline, pid=pid, name=trace_name)
    if world is not None and timeline is not None:  # first: merging reads it once the run is
        RENDERERS["trace"].write(inp, folder / trace_file)
    path = folder / (RUN_FILE if world is None else f"rank{rank}.json")
    _write(path, data)
    if world is None:
        write_folder(folder, inp)
    return path


def _trace_record(timeline: Timeline, file: str) -> Dict[str, Any]:
    """What a run says of its timeline: its file, its calls, the limit, whether it was cut."""
    return {
        "file": file,
        "calls": len(timeline),
        "limit": timeline.limit,
        "truncated": timeline.truncated,
    }


def saved_render_input(
    saved: SavedRun, summary: Summary, title: Optional[str] = None, **fields: Any
) -> RenderInput:
    """What the renderers read of a saved run (``summary``: how it is summarised): its
    command, ending, time, versions, device and settings under the page's title, its data
    loaders' records and the machine's peaks where it has them; ``fields``: the other fields
    of the :class:`~instrumented_convs.report.RenderInput` (``timeline``...); the table's
    title is :func:`run_title`'s unless ``options`` gives one."""
    target = saved.get("target") or "run"
    meta = []
    if saved.get("command"):
        meta.append(("command", " ".join(map(str, saved["command"]))))
    told = capture_notes(saved)
    if saved.get("capture"):
        meta.append(("captured", told[0]))
    elif "exit_code" in saved:
        meta.append(("ended", f"{saved.get('ended_by', '?')}, exit code {saved['exit_code']}"))
    if saved.get("started"):
        meta.append(
            ("started", time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(saved["started"])))
        )
    versions = saved.get("versions") or {}
    meta.append(("versions", ", ".join(f"{k} {v}" for k, v in versions.items() if v)))
    device = saved.get("device") or {}
    meta.append(("device", f"{device.get('cuda') or device.get('cpu')} on {saved.get('host')}"))
    settings = saved.get("settings") or {}
    meta.append(("settings", ", ".join(f"{k}={v}" for k, v in settings.items())))
    sampling = saved.get("sampling")
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
    if saved.get("world_size"):
        missing = saved.get("ranks_missing") or []
        meta.append(
            ("ranks", f"{saved['world_size']}" + (f", missing {missing}" if missing else ""))
        )
    note = ""
    if settings.get("backward") and settings.get("backward_every", 1) > 1:
        every = settings["backward_every"]
        note = (
            "Cells marked ~ include backward calls whose time is estimated "
            f"(one layer call in {every} is timed step by step)."
        )
    fields.setdefault("peak", Peak(**saved["peak"]) if saved.get("peak") else None)
    options = dict(fields.pop("options", None) or {})
    if run_title(saved) is not None:
        options.setdefault("title", run_title(saved))
    if told:
        options.setdefault("notes", told)
        note = " ".join([note, *told]).strip()
    if saved.get("signals") is not None and "advice" not in fields:
        fields["advice"] = saved_advice(saved)
    return RenderInput(
        summary,
        title=title or str(target),
        meta=meta,
        note=note,
        loaders=saved.get("workers"),
        options=options,
        **fields,
    )


def saved_advice(saved: SavedRun, min_share: float = 0.05) -> List[Dict[str, Any]]:
    """What to change in a saved run (docs/advice.md): its rows by layer, its layers' signals
    (none in a run saved without ``--advise``), its loaders, and its iterations where it
    knows them (the optimizer steps recorded after the warm-up). A run merged over ranks: each
    rank's advice from its own record, an item said once with the ``ranks`` it holds on (its
    share the largest of theirs)."""
    warmup = saved.get("warmup") or {}
    recorded = (warmup.get("taken") or 0) - (warmup.get("steps") or 0)
    iterations = recorded if recorded > 0 else None
    if saved.get("kind") != "merged":
        summary = saved_summary(saved, by="layer")
        return advice_of(summary, saved.get("signals"), saved.get("workers"), iterations, min_share)
    found: Dict[Any, Dict[str, Any]] = {}
    for part in saved.get("per_rank") or ():
        r = part["rank"]
        loaders = {
            k: [x for x in v if x.get("rank") == r] for k, v in (saved.get("workers") or {}).items()
        }
        summary = saved_summary(saved, by="layer", rank=r)
        for item in advice_of(summary, part.get("signals"), loaders, iterations, min_share):
            key = (item["rule"], item["change"], tuple(x["path"] for x in item["layers"]))
            held = found.get(key)
            if held is None or item["at_stake_share"] > held["at_stake_share"]:
                item["ranks"] = (held or {}).get("ranks", [])
                found[key] = held = item
            held["ranks"] = sorted({*held["ranks"], r})
    return sorted(found.values(), key=lambda i: -i["at_stake_share"])


def saved_page_html(saved: SavedRun, summary: Summary, title: Optional[str] = None) -> str:
    """The HTML page of a saved run (``summary``: how it is summarised)."""
    return render("page", saved_render_input(saved, summary, title))


def load(path: "str | os.PathLike[str]") -> SavedRun:
    """A saved run as a dict: a run folder, its ``run.json``, or a rank file (``.gz`` too)."""
    return read_run(path)


def saved_summary(
    saved: SavedRun, by: str = "step", unit: Optional[str] = None, rank: Optional[int] = None
) -> Summary:
    """The summary of a saved run, summarised again from its statistics: ``by``, ``unit``,
    and ``rank`` (one rank's own part of a merged saved)."""
    snapshots = [_stats(s) for s in saved["snapshots"]]
    if rank is not None:
        missing = saved.get("ranks_missing", [])
        if not 0 <= rank < len(snapshots) or rank in missing:
            have = [r for r in range(len(snapshots)) if r not in missing]
            raise ValueError(f"this run has the ranks {have}, not {rank}")
        return summarize(
            snapshots[rank],
            by=by,
            unit=unit,
            sampling=saved.get("sampling"),
            compiled=saved.get("compiled"),
        )
    if saved.get("kind") != "merged":
        return summarize(
            snapshots[0],
            by=by,
            unit=unit,
            sampling=saved.get("sampling"),
            compiled=saved.get("compiled"),
        )
    return merge_ranks(
        snapshots, by=by, unit=unit, sampling=saved.get("sampling"), compiled=saved.get("compiled")
    )


#: The name :func:`saved_summary` had (documented); kept for code that calls it.
summary_of = saved_summary


def merge_folder(folder: "str | os.PathLike[str]", wait: float = 0.0) -> SavedRun:
    """Merge the rank files in ``folder`` into its ``run.json`` (and every renderer's file:
    the ranks' timelines as one trace, one process each).

    ``wait``: seconds to wait for every rank of the job to write its last file (a rank's
    autosave, ``ended_by`` ``running``, is waited past); ranks missing after that are left
    out and named in ``ranks_missing``, those merged from an autosave in ``ranks_unfinished``.
    """
    folder = Path(folder)
    deadline = time.monotonic() + wait
    while True:
        files = {int(p.stem[4:]): p for p in folder.glob("rank*.json") if p.stem[4:].isdigit()}
        if not files:
            raise FileNotFoundError(f"{folder} has no rank files (rank<N>.json)")
        runs = {r: load(p) for r, p in files.items()}
        world = max(run["world_size"] or 0 for run in runs.values())
        final = [r for r, run in runs.items() if run.get("ended_by") != "running"]
        if len(final) >= world or time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    world = max(world, max(runs) + 1)
    first = runs[min(runs)]
    merged = {k: v for k, v in first.items() if k not in ("snapshots", "summary", "rank")}
    merged.update(kind="merged", world_size=world)
    merged["ranks_missing"] = [r for r in range(world) if r not in runs]
    merged["ranks_unfinished"] = sorted(set(runs) - set(final))
    merged["per_rank"] = [
        {
            k: runs[r].get(k)
            for k in ("rank", "exit_code", "ended_by", "host", "device", "trace", "signals")
        }
        for r in sorted(runs)
    ]
    empty = {"fields": list(EntryStats._fields), "entries": []}  # a missing rank: nothing
    merged["snapshots"] = [runs[r]["snapshots"][0] if r in runs else empty for r in range(world)]
    sections = [runs[r]["workers"] for r in sorted(runs) if runs[r].get("workers")]
    merged.pop("workers", None)
    if sections:  # each rank's loaders and worker processes (each says its rank)
        merged["workers"] = {k: [x for s in sections for x in s.get(k, ())] for k in sections[0]}
    summary = saved_summary(merged, by=first.get("by", "step"), unit=first.get("unit"))
    merged["summary"] = summary.to_dict()
    merged.pop("trace", None)  # rank 0's own: the merged run's is the merged timeline
    traces = sorted(folder.glob(f"rank*.{TRACE_FILE}"))
    merged_trace = None
    if traces:  # the ranks' timelines, one process each, on one time base
        merged_trace = merge_traces(read_trace(t) for t in traces)
        told = [runs[r]["trace"] for r in sorted(runs) if runs[r].get("trace")]
        merged["trace"] = {
            "file": TRACE_FILE,
            "calls": sum(t["calls"] for t in told),
            "limit": max((t["limit"] for t in told), default=None),
            "truncated": any(t["truncated"] for t in told),
        }
    _write(folder / RUN_FILE, merged)
    write_folder(folder, saved_render_input(merged, summary, timeline=merged_trace))
    return merged
