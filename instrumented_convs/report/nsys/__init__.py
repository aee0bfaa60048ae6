"""An Nsight Systems report read back as a saved run: ``view REPORT.sqlite`` (or
``REPORT.nsys-rep``, exported through the ``nsys`` command) prints the table the profiled
process would have printed, from our steps' NVTX ranges, and with CUDA activity in the
report each step's device time from the work its range launched. docs/nsys.md says how.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ...core.storage.entry import BACKWARD_MARK, EntryStats
from ..saved import FORMAT, VERSION
from ..stats import merge_ranks, summarize
from .device import DeviceTime, device_times, has_cuda
from .ranges import Range, Ranges, ReportError, read_ranges
from .tree import drop_warmup, snapshots

__all__ = [
    "REPORT_SUFFIXES",
    "ReportError",
    "is_report",
    "read_report",
    "read_reports",
    "to_sqlite",
]

#: The files read as Nsight Systems reports.
REPORT_SUFFIXES = (".sqlite", ".nsys-rep", ".qdrep")
#: Seconds an ``nsys export`` may take.
EXPORT_LIMIT = 600
#: The rank of a process that said none (after every rank).
UNSAID = 1 << 30


def is_report(path: "str | os.PathLike[str]") -> bool:
    """Whether ``path`` names an Nsight Systems report (by its suffix)."""
    return str(path).endswith(REPORT_SUFFIXES)


def to_sqlite(path: Path) -> Path:
    """The SQLite export of the report ``path``: itself, the ``.sqlite`` beside it when that
    is newer, or one exported now with ``nsys export`` (beside it, else in a temporary
    folder); a :class:`ReportError` where there is no ``nsys`` to export with."""
    if path.suffix == ".sqlite":
        return path
    beside = path.with_suffix(".sqlite")
    if beside.exists() and beside.stat().st_mtime >= path.stat().st_mtime:
        return beside
    nsys = shutil.which("nsys")
    if nsys is None:
        raise ReportError(
            f"{path}: reading a .nsys-rep needs the nsys command, not found here; export it "
            f"where nsys is (nsys export --type sqlite -o {beside.name} {path.name}) and view "
            "the .sqlite"
        )
    out = beside if os.access(path.parent, os.W_OK) else Path(tempfile.mkdtemp()) / beside.name
    cmd = [
        nsys,
        "export",
        "--type",
        "sqlite",
        "--force-overwrite",
        "true",
        "-o",
        str(out),
        str(path),
    ]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=EXPORT_LIMIT)
    except subprocess.TimeoutExpired:
        raise ReportError(f"{path}: nsys export took over {EXPORT_LIMIT} s") from None
    if done.returncode != 0 or not out.exists():
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise ReportError(f"{path}: nsys export failed ({done.returncode}): {last[0]}")
    return out


def read_report(path: "str | os.PathLike[str]", warmup: int = 0) -> Dict[str, Any]:
    """The report at ``path`` as a saved run (what ``view``, ``diff`` and the renderers
    read): one snapshot per process (several: merged as ranks are), its timeline under
    ``trace_events``; ``warmup``: each process's first iterations dropped."""
    return read_reports([path], warmup)


def read_reports(paths: Sequence["str | os.PathLike[str]"], warmup: int = 0) -> Dict[str, Any]:
    """Several reports (one per rank, say) as one saved run, their processes merged as ranks
    are, in the order of the ranks they said (see :func:`read_report`)."""
    procs: List[Tuple[Tuple[int, int, int], Dict[str, Any]]] = []
    events: List[Dict[str, Any]] = []
    seen: List[Dict[str, str]] = []
    snaps_all: Dict[int, List[EntryStats]] = {}
    domain, cuda, unended = True, False, 0
    for n, path in enumerate(paths):
        found, device = _read(Path(path))
        ranges = found.ranges
        keep = drop_warmup(ranges, warmup, found.resets)
        snaps = snapshots(ranges, device, keep)
        for pid, snap in snaps.items():
            rank = _rank(found.settings.get(pid, []))
            item = {"pid": pid, "name": found.processes.get(pid), "file": str(path), "snap": snap}
            procs.append(((rank, n, pid), item))
            snaps_all[len(snaps_all)] = snap
        events += chrome_trace(ranges, device, keep, found.processes)["traceEvents"]
        seen += _in_effect(found.settings, ranges, keep)
        domain, cuda = domain and found.domain, cuda or device is not None
        unended += found.unended
    if not procs:
        raise ReportError(
            f"--warmup {warmup} drops every iteration of {', '.join(map(str, paths))}: "
            "give a smaller N"
        )
    procs.sort(key=lambda x: x[0])
    snaps, missing = _by_rank(procs)
    names = ", ".join(str(p) for p in paths)
    data: Dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "kind": "run" if len(snaps) == 1 else "merged",
        "target": names,
        "title": f"Nsight Systems report: {names}",
        "report": {
            "files": [str(p) for p in paths],
            "domain": domain,
            "device_times": cuda,
            "warmup": warmup,
            "processes": [{k: v for k, v in item.items() if k != "snap"} for _, item in procs],
        },
        "settings": {"source": "nsys", "device times": cuda},
        "rank": None,
        "world_size": None if len(snaps) == 1 and not missing else len(snaps),
        "by": "step",
        "unit": None,
        "snapshots": [
            {"fields": list(EntryStats._fields), "entries": [list(e) for e in snap]}
            for snap in snaps
        ],
    }
    if data["world_size"] is not None:
        data["ranks_missing"] = missing
        summary = merge_ranks(snaps, by="step")
    else:
        summary = summarize(snaps[0], by="step")
    data["summary"] = summary.to_dict()
    data["trace_events"] = {"traceEvents": events, "otherData": {"source": "nsys"}}
    data["notes"] = partial_notes(seen, snaps_all) + (
        [f"{unended} range(s) never ended (the process stopped inside them): left out."]
        if unended
        else []
    )
    return data


def _by_rank(
    procs: List[Tuple[Tuple[int, int, int], Dict[str, Any]]],
) -> Tuple[List[Any], List[int]]:
    """The processes' snapshots at the ranks they said (the ranks none said: missing, an
    empty snapshot), or in order where any said none (or two said one)."""
    ranks = [key[0] for key, _ in procs]
    snaps = [item["snap"] for _, item in procs]
    if any(r >= UNSAID for r in ranks) or len(set(ranks)) < len(ranks):
        return snaps, []
    at = dict(zip(ranks, snaps))
    world = max(ranks) + 1
    return [at.get(r, []) for r in range(world)], [r for r in range(world) if r not in at]


def _read(path: Path) -> Tuple[Ranges, Optional[List[Optional[DeviceTime]]]]:
    """The ranges of the report at ``path`` and their device times (None: no CUDA in it)."""
    if not path.exists():
        raise ReportError(f"{path}: no such report")
    db = to_sqlite(path)
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            found = read_ranges(conn)
            device = device_times(conn, found.ranges) if has_cuda(conn) else None
        finally:
            conn.close()
    except sqlite3.DatabaseError as e:
        raise ReportError(f"{db}: not a readable SQLite report ({e})") from None
    if not found.ranges:
        raise ReportError(
            f"{path}: no NVTX range of instrumented_convs in the report (was the process "
            "profiled with -t nvtx, and did it run instrumented layers?)"
        )
    return found, device


def _rank(marks: List[Tuple[int, Dict[str, str]]]) -> int:
    """A process's torchrun rank, as its settings marks say (else after every rank)."""
    said = [m["rank"] for _, m in marks if m.get("rank", "").isdigit()]
    return int(said[-1]) if said else UNSAID


def _in_effect(
    settings: Dict[int, List[Tuple[int, Dict[str, str]]]], ranges: List[Range], keep: List[bool]
) -> List[Dict[str, str]]:
    """The settings marks in effect while each process pushed the ranges kept: the last one
    before its first range, and those made before its last range began."""
    spans: Dict[int, List[int]] = {}
    for r, k in zip(ranges, keep):
        if k:
            s = spans.setdefault(r.pid, [r.start, r.start])
            s[0], s[1] = min(s[0], r.start), max(s[1], r.start)
    out = []
    for pid, (first, last) in spans.items():
        marks = settings.get(pid, [])
        before = [m for t, m in marks if t <= first][-1:]
        out += before + [m for t, m in marks if first < t < last]
    return out


def partial_notes(
    seen: List[Dict[str, str]], snaps: Optional[Dict[int, List[EntryStats]]] = None
) -> List[str]:
    """What the settings marks ``seen`` say of rows holding only some calls: a backward
    timed one call in N pushed ranges for those only (named where ``snaps`` show a step's
    backward with fewer calls than its forward); the duty cycle's unrecorded iterations
    and recording turned off pushed none."""
    notes = []
    every = sorted(
        {m["backward_every"] for m in seen if m.get("backward") == "True"} - {"1"},
        key=lambda v: int(v) if v.isdigit() else 0,
    )
    short = _fewer_backward(snaps or {})
    if every and short:
        notes.append(
            f"Partial: {', '.join(short)}: only the calls whose backward pushed ranges "
            f"(backward_every={', '.join(every)}: the first calls of each layer, then one in "
            "N; forward calls without grad have no backward either); profile with run "
            "--record ranges for every call."
        )
    cycles = sorted({m["record_every"] for m in seen if m.get("record_every") not in (None, "1")})
    if cycles:
        notes.append(
            f"Partial: only the iterations the duty cycle recorded pushed ranges (record_every="
            f"{', '.join(cycles)}); the counts are theirs, not the run's."
        )
    if any(m.get("enabled") == "False" for m in seen):
        notes.append(
            "Partial: recording was off for part of the run (configure(enabled=False)): "
            "those calls pushed no range."
        )
    return notes


def _fewer_backward(snaps: Dict[int, List[EntryStats]]) -> List[str]:
    """The backward steps (``name [backward] (layer)``) with fewer calls than their forward,
    summed over each process's paths."""
    calls: Dict[Tuple[str, Optional[str], str], int] = {}
    for snap in snaps.values():
        for e in snap:
            key = (e.name, e.scope, e.phase)
            calls[key] = calls.get(key, 0) + e.count
    out = []
    for (name, scope, phase), n in calls.items():
        forward = calls.get((name, scope, "forward"), 0)
        if phase == "backward" and n < forward:
            out.append(
                f"{name}{BACKWARD_MARK}" + (f" ({scope})" if scope else "") + f" {n} of {forward}"
            )
    return out


def chrome_trace(
    ranges: List[Range],
    device: Optional[List[Optional[DeviceTime]]],
    keep: List[bool],
    processes: Dict[int, str],
) -> Dict[str, Any]:
    """The report's ranges as a Chrome trace (one process each, one track per thread, and
    each process's device spans on a GPU track)."""
    kept = [i for i, k in enumerate(keep) if k]
    base = min((ranges[i].start for i in kept), default=0)
    events: List[Dict[str, Any]] = []
    tids: Dict[int, int] = {}
    gpu_tid = 10**6
    for i in kept:
        r = ranges[i]
        tid = tids.setdefault(r.gtid, r.gtid & 0xFFFFFF)
        phase = "backward" if r.backward else "forward"
        ev = {
            "ph": "X",
            "name": r.name + (BACKWARD_MARK if r.backward else ""),
            "cat": phase,
            "pid": r.pid,
            "tid": tid,
            "ts": (r.start - base) / 1e3,
            "dur": (r.end - r.start) / 1e3,
            "args": {"scope": r.scope, "phase": phase},
        }
        events.append(ev)
        d = device[i] if device is not None else None
        if d is not None:
            events.append(
                dict(
                    ev,
                    tid=gpu_tid,
                    cat=phase + ",gpu",
                    ts=(d.first - base) / 1e3,
                    dur=d.span / 1e3,
                    args=dict(ev["args"], busy_us=d.busy / 1e3, host_us=ev["dur"]),
                )
            )
    for pid in {ranges[i].pid for i in kept}:
        name = processes.get(pid) or f"process {pid}"
        events.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": name}})
        if device is not None:
            events.append(
                {
                    "ph": "M",
                    "name": "thread_name",
                    "pid": pid,
                    "tid": gpu_tid,
                    "args": {"name": "GPU (the work each range launched)"},
                }
            )
    return {"traceEvents": events, "otherData": {"source": "nsys"}}
