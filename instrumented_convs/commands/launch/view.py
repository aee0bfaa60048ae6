"""``view``, ``diff``, ``merge``: the commands that read saved runs (a run folder, its
files, an Nsight Systems report read back) and print or compare them.
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Dict, Iterator, Optional, Sequence, Tuple

from ...report import (
    RENDERERS,
    RUN_FILE,
    RenderInput,
    ReportError,
    Summary,
    is_report,
    read_reports,
    read_trace,
    render,
    write_folder,
)
from ..errors import PROG, USAGE, UserError
from .peaks import view_peak
from .runs import (
    TRACE_FILE,
    SavedRun,
    load,
    merge_folder,
    saved_advice,
    saved_render_input,
    saved_summary,
)

__all__ = ["view_main", "diff_main", "merge_main", "advise_main", "open_run"]

logger = logging.getLogger(__name__)

#: The flags of ``view`` that name a format, in the order they win; one given a FILE writes
#: the format there.
VIEW_ALIASES = (
    ("trace", "trace"),
    ("workers", "workers"),
    ("html", "page"),
    ("counters", "roofline"),
    ("memory", "memory"),
    ("json", "json"),
)


def view_main(args: argparse.Namespace) -> int:
    """``view``: a saved run, summarised again as asked, in the format asked (``--format``,
    or the flag that names one; ``--html`` and ``--trace`` write theirs to a file)."""
    name, to = _view_format(args)
    if is_report(args.run):
        lacks = {
            "roofline": ("counters", f"{PROG} run --counters"),
            "memory": ("memory", f"{PROG} run --memory"),
            "workers": ("data loaders", f"{PROG} run"),
        }
        if name in lacks:
            what, how = lacks[name]
            raise UserError(
                f"{args.run}: an Nsight Systems report holds the steps' ranges, not their "
                f"{what}: run the script with {how} for them",
                USAGE,
            )
        saved = open_run(args.run, warmup=args.warmup, more=args.more)
        if args.save:
            _save_report(saved, Path(args.save))
        if name == "trace":
            written = RENDERERS["trace"].write(RenderInput(timeline=saved["trace_events"]), to)
            print(f"timeline written to {written}")
            return 0
    else:
        for flag in ("warmup", "save", "more"):
            if getattr(args, flag):
                what = "more than one RUN" if flag == "more" else f"--{flag}"
                raise UserError(f"{what}: Nsight Systems reports only, not {args.run}", USAGE)
        if name == "trace":
            return _view_trace(args.run, to)
        saved = open_run(args.run)
    _say_unfinished(saved, args.run, to is None and name in MACHINE_READ)
    with _reading(args.run):
        inp = _view_input(args, saved, name)
        notes = saved.get("notes") or []  # a report's rows that hold only some calls
        inp.note = " ".join([inp.note, *notes]).strip()
        if to is not None:
            RENDERERS[name].write(inp, to)
            print(f"{name} written to {to}")
            return 0
        text = render(name, inp)
    print(text)
    if name == "text" and notes:
        print("\n".join(notes))
    return 0


def unfinished_line(saved: SavedRun, path: str) -> Optional[str]:
    """The line that leads what is shown of an autosaved run (its job had not finished when
    it was saved: killed, or still running); None for another run."""
    auto = saved.get("autosave")
    if saved.get("ended_by") != "running" or not isinstance(auto, dict):
        return None
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(auto.get("saved", 0)))
    return (
        f"{path}: the job had not finished: its autosave of {when} (after "
        f"{auto.get('steps', '?')} optimizer steps, {auto.get('epochs', '?')} epochs), read as "
        "it stood then"
    )


#: The formats a program reads from ``view``'s output: a line about the run goes to stderr.
MACHINE_READ = ("json", "csv")


def _say_unfinished(saved: SavedRun, path: str, to_stderr: bool = False) -> None:
    """An autosaved run (its job had not finished) says so first, and where its folder holds
    a page of an earlier save (made before a script's own signal handler ran), that the page
    and summary.txt lag behind."""
    line = unfinished_line(saved, path)
    if line is None:
        return
    folder = Path(path) if Path(path).is_dir() else Path(path).parent
    page = folder / RENDERERS["page"].file
    if page.exists():
        when = time.strftime("%H:%M:%S", time.localtime(page.stat().st_mtime))
        line += f"; its {page.name} and summary.txt are of an earlier save ({when})"
    print(line, file=sys.stderr if to_stderr else sys.stdout, flush=True)


def _view_format(args: argparse.Namespace) -> Tuple[str, Optional[str]]:
    """The format ``view`` was asked for, and the file to write it to (None: print it)."""
    for flag, name in VIEW_ALIASES:
        value = getattr(args, flag)
        if value:
            return name, value if isinstance(value, str) else None
    return args.format, None


def saved_chrome_trace(path: str) -> Dict[str, Any]:
    """The Chrome trace of a saved run (its folder, or a file in it)."""
    p = Path(path)
    folder = p if p.is_dir() else p.parent
    if not (folder / TRACE_FILE).exists():
        raise FileNotFoundError(
            f"{folder} has no {TRACE_FILE}: the run recorded no timeline (--trace-limit 0?)"
        )
    return read_trace(folder / TRACE_FILE)


def _view_trace(path: str, to: str) -> int:
    """``view --trace FILE``: the saved timeline, copied to ``FILE``."""
    open_run(path)  # a run, or why not
    try:
        trace = saved_chrome_trace(path)
    except FileNotFoundError as exc:
        raise UserError(str(exc)) from exc
    except (json.JSONDecodeError, UnicodeDecodeError, EOFError, gzip.BadGzipFile) as e:
        file = Path(path) / TRACE_FILE if Path(path).is_dir() else Path(path).parent / TRACE_FILE
        raise UserError(f"{file} is cut short or corrupt ({e}): the table is still there: "
                        f"{PROG} view {path}") from e  # fmt: skip
    written = RENDERERS["trace"].write(RenderInput(timeline=trace), to)
    print(f"timeline written to {written}")
    return 0


def _view_input(args: argparse.Namespace, saved: SavedRun, name: str) -> RenderInput:
    """What the renderer ``name`` reads of ``saved``: the summary (its rank, its rows as
    selected), the peak and the times of the counters' table, the loaders (each worker's
    table); a :class:`UserError` where the run has nothing for it."""
    if name == "advice" and saved.get("signals") is None:
        raise UserError(
            f"{args.run} was not advised: its layers' signals were not recorded "
            f"({PROG} run --advise SCRIPT records them; {PROG} advise {args.run} says what "
            "the rest of the record decides)"
        )
    if name == "workers":
        if not saved.get("workers"):
            raise UserError(f"{args.run} recorded no data loader: the script used none")
        summary = saved_summary(saved, by=args.by, unit=args.unit)
        return saved_render_input(saved, summary, options={"each": True})
    summary = _summary(saved, args.by, args.unit, args.rank)
    if args.prefix or args.depth is not None or args.phase:
        summary = summary.select(args.prefix, args.depth, args.phase)
    inp = saved_render_input(saved, summary)
    if name == "roofline":
        inp.peak = view_peak(args, saved)
        inp.times = saved_summary(open_run(args.times), by=args.by) if args.times else None
    return inp


def _save_report(saved: SavedRun, folder: Path) -> None:
    """A report read back, written as a run folder: its run.json and every renderer's file."""
    folder.mkdir(parents=True, exist_ok=True)
    trace = saved.pop("trace_events")
    saved["trace"] = {
        "file": TRACE_FILE,
        "calls": len(trace["traceEvents"]),
        "limit": None,
        "truncated": False,
    }
    (folder / RUN_FILE).write_text(json.dumps(saved, indent=1))
    summary = saved_summary(saved)
    write_folder(folder, saved_render_input(saved, summary, timeline=trace))
    saved["trace_events"] = trace
    print(f"run folder written to {folder}")


def open_run(path: str, warmup: int = 0, more: Sequence[str] = ()) -> SavedRun:
    """The saved run at ``path`` (a run folder or its file, or an Nsight Systems report read
    back, with the reports ``more`` merged as ranks, each process's first ``warmup``
    iterations dropped), or a :class:`UserError` that says what ``path`` is instead and what
    to give."""
    p = Path(path)
    if is_report(path):
        others = [m for m in more if not is_report(m)]
        if others:
            raise UserError(
                f"{others[0]}: not an Nsight Systems report (.sqlite, .nsys-rep)", USAGE
            )
        try:
            return read_reports([p, *map(Path, more)], warmup=warmup)
        except ReportError as e:
            raise UserError(str(e)) from None
    if not p.exists():
        raise UserError(f"{path}: no such file or folder; give a run folder (ic-runs/...)", USAGE)
    if p.is_dir() and not (p / RUN_FILE).exists():
        ranks = len(list(p.glob("rank*.json")))
        raise UserError(
            f"{path} has no {RUN_FILE} but {ranks} rank file(s) (a torchrun run that did not "
            f"finish?): merge them with {PROG} merge {path}"
            if ranks
            else f"{path} has no {RUN_FILE}: not a run folder; give a folder that run saved"
        )
    try:
        return load(p)
    except (json.JSONDecodeError, UnicodeDecodeError, EOFError, gzip.BadGzipFile) as e:
        raise UserError(_unreadable(p, e)) from e
    except ValueError as e:  # not a run; a run of a newer version
        raise UserError(str(e)) from e


def _unreadable(path: Path, error: Exception) -> str:
    """What a run file that does not parse is: cut short (a run that did not finish saving,
    a copy cut off) or not a run's JSON at all."""
    file = path / RUN_FILE if path.is_dir() else path
    with open(file, "rb") as f:
        start = f.read(64).lstrip()
    where = (
        f" at line {error.lineno}, column {error.colno}"
        if isinstance(error, json.JSONDecodeError)
        else ""
    )
    if start.startswith(b"{") or start.startswith(b"\x1f\x8b"):
        return (
            f"{file} is cut short or corrupt (it stops being JSON{where}): the run may be "
            "incomplete; run the script again, or view another run"
        )
    return f"{file} is not JSON{where}: not a run; give a run folder or its run.json"


@contextmanager
def _reading(path: str) -> Iterator[None]:
    """A run that parses but is not as ``run`` saves it (edited by hand, written by another
    program): one line naming its file, not a traceback."""
    try:
        yield
    except (KeyError, TypeError, IndexError, AttributeError, ValueError) as e:
        p = Path(path)
        file = p / RUN_FILE if p.is_dir() else p
        raise UserError(
            f"{file} is not a run as instrumented_convs saves it ({type(e).__name__}: {e}): "
            "was it edited? run the script again, or view another run"
        ) from e


def _summary(saved: SavedRun, by: str, unit: Optional[str], rank: Optional[int]) -> Summary:
    """The saved run's summary, ``--rank``'s alone where given (a rank it has)."""
    if rank is None:
        return saved_summary(saved, by=by, unit=unit)
    try:
        return saved_summary(saved, by=by, unit=unit, rank=rank)
    except ValueError as e:  # a rank it does not have
        raise UserError(f"--rank {rank}: {e}", USAGE) from e


def diff_main(args: argparse.Namespace) -> int:
    """``diff``: two saved runs side by side; exit code 1 past ``--fail-above``."""
    runs = [open_run(path) for path in (args.a, args.b)]
    parts = []
    for saved, path in zip(runs, (args.a, args.b)):
        _say_unfinished(saved, path)
        with _reading(path):
            parts.append(_summary(saved, args.by, args.unit, args.rank))
    a, b = parts
    result = a.diff(b, min_change=args.min_change / 100)
    print(result.table(title=f"{args.a} -> {args.b}"))
    if args.html:
        Path(args.html).write_text(result.to_html(labels=(args.a, args.b)))
        print(f"page written to {args.html}")
    if args.fail_above is not None:
        worse = result.worse_than(args.fail_above / 100)
        if worse:
            for d in worse:
                logger.warning("diff: %s is %.1f%% slower", d.name, 100 * (d.relative or 0))
            return 1
    return 0


def merge_main(args: argparse.Namespace) -> int:
    """``merge``: a run folder's rank files into its run.json."""
    folder = Path(args.folder)
    if not folder.is_dir():
        what = "not a folder" if folder.exists() else "no such folder"
        raise UserError(f"{folder}: {what}; give the run folder holding rank<N>.json", USAGE)
    if not any(folder.glob("rank*.json")):
        hint = (
            f"; it is a run already: {PROG} view {folder}"
            if (folder / RUN_FILE).exists()
            else ": merge reads the folder of a run under torchrun"
        )
        raise UserError(f"{folder} has no rank files (rank<N>.json){hint}")
    try:
        merged = merge_folder(folder, wait=args.wait)
    except (json.JSONDecodeError, UnicodeDecodeError, EOFError, gzip.BadGzipFile) as e:
        raise UserError(f"{_cut_rank_file(folder)} is cut short or corrupt ({e}): move it "
                        "out of the folder to merge the others") from e  # fmt: skip
    if merged["ranks_missing"]:
        logger.warning("merge: no file from ranks %s: merged without them", merged["ranks_missing"])
    print(saved_summary(merged, by=merged.get("by") or "step", unit=merged.get("unit")))
    return 0


def _cut_rank_file(folder: Path) -> Path:
    """The first rank file of ``folder`` that does not read (the folder where all do)."""
    for path in sorted(folder.glob("rank*.json")):
        try:
            load(path)
        except (json.JSONDecodeError, UnicodeDecodeError, EOFError, gzip.BadGzipFile, ValueError):
            return path
    return folder


def advise_main(args: argparse.Namespace) -> int:
    """``advise``: what to change in a saved run, read from its record (``--json``: the items
    as JSON). A run saved without ``--advise`` gets what its rows and loaders decide, and a
    line saying that the layers' rules had nothing to read."""
    saved = open_run(args.run)
    items = saved_advice(saved)
    if args.json:
        print(json.dumps({"advice": items}, indent=1))
        return 0
    print(render("advice", RenderInput(advice=items)))
    if saved.get("signals") is None:
        print(f"  (the layers' rules need their signals: {PROG} run --advise SCRIPT records them)")
    return 0
