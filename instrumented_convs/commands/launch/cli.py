"""``run``, ``view``, ``merge``, ``diff``: profile an unmodified script; read and compare runs.

What ``run`` and ``view`` print is a renderer's, named by ``--format``; the older flags
(``--json``, ``--html``, ``--counters``, ``--memory``, ``--workers``, ``--trace``) name one.
"""

from __future__ import annotations

import argparse
import difflib
import gzip
import importlib
import importlib.util
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from ... import configure, registry
from ...layers import InstrumentedLayer
from ...report import RENDERERS, RUN_FILE, RenderInput, Summary, render
from ..errors import PROG, USAGE, UserError
from .hooks import Hooks
from .parsers import (
    add_diff_parser,
    add_merge_parser,
    add_run_parser,
    add_view_parser,
    names,
)
from .peaks import check_peaks, run_peak, view_peak
from .runs import (
    SavedRun,
    default_folder,
    ended_title,
    job_rank,
    load,
    merge_folder,
    run_meta,
    saved_chrome_trace,
    saved_render_input,
    saved_summary,
    write_run,
)
from .script import Outcome, run_target

__all__ = ["add_commands", "run_main", "view_main", "merge_main", "diff_main"]

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
#: The flags of ``run`` that name a format to print at the end, and what they record for it:
#: ``--counters`` is ``--format roofline``, ``--memory`` is ``--format memory``.
RUN_ALIASES = (("counters", "roofline"), ("memory", "memory"))


def add_commands(sub: Any) -> Dict[str, Callable[[argparse.Namespace], int]]:
    """Add ``run``, ``view``, ``merge`` and ``diff`` to the subparsers ``sub``; returns their
    mains."""
    add_run_parser(sub)
    add_view_parser(sub)
    add_merge_parser(sub)
    add_diff_parser(sub)
    return {"run": run_main, "view": view_main, "merge": merge_main, "diff": diff_main}


def run_main(args: argparse.Namespace) -> int:
    """``run``: the script under the hooks, then the table and the run folder."""
    started = time.time()
    _check_run(args)
    writer = _configure_run(args)
    hooks = _install_hooks(args, writer)
    try:
        outcome = run_target(args.target, list(args.args), module=args.module)
    finally:
        hooks.close()
        hooks.remove()
    _warn_after_run(args, hooks)
    meta = _run_record(args, started, outcome, hooks)
    folder = Path(args.output) if args.output else default_folder(args.target, started)
    _save_run(args, folder, meta, writer)
    saved = _finished_run(args, folder)
    if saved is not None and not args.quiet:
        _print_run(args, saved, outcome)
    if saved is not None:
        logger.info("run: saved in %s (exit code %d)", folder, outcome.code)
    return outcome.code


def _check_run(args: argparse.Namespace) -> None:
    """Refuse what ``run`` cannot do, before anything runs or is written; the formats asked
    for turn on what they record."""
    refused = [
        (args.backward_every is not None and args.backward_every < 1)
        and "--backward-every takes a positive number",
        args.trace_limit < 0 and "--trace-limit takes a number >= 0",
        (args.record_every is not None and args.record_every < 1)
        and "--record-every takes a positive number",
        (args.budget is not None and not 0 < args.budget < 1)
        and "--budget takes a fraction between 0 and 1 (0.01: 1%)",
        (args.iteration is not None and args.record_every is None and args.budget is None)
        and "--iteration names what --record-every or --budget draws: give one of them",
    ]
    for message in refused:
        if message:
            raise UserError(message, USAGE)
    check_peaks(args)
    _check_target(args.target, args.module)
    for flag in ("only", "exclude"):
        _check_convs(flag, names(getattr(args, flag)) or [])
    for flag, name in RUN_ALIASES:  # --format roofline counts, as --counters does
        setattr(args, flag, getattr(args, flag) or name in args.format)


def _check_target(target: str, module: bool) -> None:
    """Refuse a script that does not exist (a folder is one with a ``__main__.py``, as for
    python), or a module that cannot be found (only its top-level name is looked up: nothing
    is imported before the hooks are in place)."""
    if module:
        top = target.split(".")[0]
        if not top or importlib.util.find_spec(top) is None:
            raise UserError(f"-m {target}: no module named {top!r} (is it installed?)", USAGE)
    elif not os.path.isfile(target) and not os.path.isfile(os.path.join(target, "__main__.py")):
        what = "a folder without __main__.py" if os.path.isdir(target) else "no such file"
        raise UserError(f"{target}: {what}; give a Python script (or -m module)", USAGE)


#: Where the conv classes ``--only``/``--exclude`` may name are: each framework's module,
#: and ours of its layers.
_FRAMEWORKS = (("torch_geometric", "instrumented_convs.pyg"), ("dgl", "instrumented_convs.dgl"))


def _check_convs(flag: str, asked: List[str]) -> None:
    """Refuse a name in ``--only``/``--exclude`` that is no conv class of PyG or DGL (as
    installed here), with the closest names; a class the script then builds none of is
    said after the run."""
    left: Set[str] = set(asked)
    known: Set[str] = set()
    for framework, ours in _FRAMEWORKS:
        if not left or importlib.util.find_spec(framework) is None:
            continue
        try:
            module = importlib.import_module(ours)
        except ImportError:  # a broken install: instrument() says so when the script runs
            continue
        for name in module.__all__:
            cls = getattr(module, name)
            if isinstance(cls, type) and issubclass(cls, InstrumentedLayer):
                known.add(cls._ic_stock.__name__)
        left -= known
    for name in sorted(left):
        close = difflib.get_close_matches(name, sorted(known), n=3)
        hint = f"did you mean {', '.join(close)}?" if close else "class names, as GCNConv,SAGEConv"
        raise UserError(f"--{flag} {name}: no PyG or DGL conv class of that name ({hint})", USAGE)


def _configure_run(args: argparse.Namespace) -> Any:
    """The settings the script runs under; the TensorBoard writer, where asked for."""
    configure(
        backward=False if args.no_backward else None,
        backward_every=args.backward_every,
        timeline=args.trace_limit,
        counters=True if args.counters else None,
        memory=True if args.memory else None,
    )
    return _tensorboard(args.tensorboard) if args.tensorboard else None


def _install_hooks(args: argparse.Namespace, writer: Any) -> Hooks:
    """The hooks, installed (a TensorBoard point an epoch), then the duty cycle's and the
    eager breakdown's settings, whose hooks come after run's."""
    hooks = Hooks(names(args.only), names(args.exclude) or (), args.warmup)
    if writer is not None:  # a point an epoch, numbered from 1
        hooks.epoch = lambda: registry.summary().to_tensorboard(writer, step=hooks.epochs)
    hooks.install()
    if args.record_every is not None or args.budget is not None:
        configure(record_every=args.record_every, budget=args.budget, iteration=args.iteration)
    if args.eager_breakdown:
        configure(compiled="eager")
    return hooks


def _warn_after_run(args: argparse.Namespace, hooks: Hooks) -> None:
    """Say what ``--only``/``--exclude`` matched nothing, and a warm-up longer than the run."""
    for flag, missing in hooks.unmatched().items():
        logger.warning(
            "run: --%s %s matched no conv layer the script built (built: %s)",
            flag,
            ",".join(missing),
            ", ".join(sorted(hooks.built)) or "none",
        )
    if args.warmup and hooks.steps < args.warmup:
        logger.warning(
            "run: only %d optimizer steps were taken, fewer than --warmup %d: the table has them",
            hooks.steps,
            args.warmup,
        )


def _run_record(
    args: argparse.Namespace, started: float, outcome: Outcome, hooks: Hooks
) -> Dict[str, Any]:
    """What the run folder says of the run besides its numbers: how it was called and
    ended, its data loaders, the machine's peak (``--counters``); the debugging modes off."""
    meta = run_meta(
        [sys.executable, "-m", "instrumented_convs", "run", *sys.argv[2:]]
        if sys.argv[1:2] == ["run"]
        else [args.target, *args.args],
        args.target,
        args.args,
        started,
        outcome.how,
        hooks,
        error=outcome.error,
        exit_code=outcome.code,
        module=args.module,
        title=ended_title(args.target, outcome.how, outcome.code),
    )
    if hooks.recorder is not None:
        loaders = hooks.recorder.result()
        hooks.recorder.close()
        if loaders["loaders"] or loaders["workers"]:
            meta["workers"] = loaders
    if args.memory:
        configure(memory=False)
    if args.counters:
        configure(counters=False)
        meta["peak"] = run_peak(args)._asdict()  # the device's limits (probed, cached; given)
    return meta


def _save_run(args: argparse.Namespace, folder: Path, meta: Dict[str, Any], writer: Any) -> None:
    """Write this process's run (its timeline with it) and close the TensorBoard writer."""
    rank, world = job_rank()
    timeline, name = None, None
    if args.trace_limit:
        name = f"rank {rank}" if world is not None else f"{Path(args.target).name} ({os.getpid()})"
        timeline = registry.timeline()
        if timeline.truncated:
            logger.warning(
                "run: the timeline kept its first %d calls (--trace-limit); later calls are "
                "in the table but not on the timeline",
                args.trace_limit,
            )
    write_run(
        folder,
        registry.snapshot(),
        meta,
        by=args.by,
        unit=args.unit,
        timeline=timeline,
        trace_name=name,
    )
    if writer is not None:
        writer.add_text("instrumented_convs/run folder", str(folder.resolve()))
        writer.close()


def _finished_run(args: argparse.Namespace, folder: Path) -> Optional[SavedRun]:
    """The run as saved: this process's, or under torchrun the ranks merged by rank 0 (None
    on the other ranks, which print nothing)."""
    rank, world = job_rank()
    if world is None:
        return load(folder)
    if rank != 0:
        return None
    merged = merge_folder(folder, wait=args.merge_timeout)
    if merged["ranks_missing"]:
        logger.warning("run: no file from ranks %s: merged without them", merged["ranks_missing"])
    return merged


def _print_run(args: argparse.Namespace, saved: SavedRun, outcome: Outcome) -> None:
    """The table titled with the script and its ending, the loaders' split where the run
    had loaders, then each format asked for (``--format``, ``--counters``, ``--memory``)."""
    summary = saved_summary(saved, by=args.by, unit=args.unit)
    inp = saved_render_input(saved, summary)
    names = ["text"] + (["workers"] if RENDERERS["workers"].wants(inp) else [])
    asked = list(args.format) + [name for flag, name in RUN_ALIASES if getattr(args, flag)]
    for name in names + [n for n in dict.fromkeys(asked) if n not in names]:
        print(render(name, inp))


def _tensorboard(folder: str) -> Any:
    """A TensorBoard ``SummaryWriter`` on ``folder`` (``rank<N>`` in it under torchrun)."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as e:
        raise UserError(
            f"--tensorboard needs TensorBoard ({e}): pip install 'instrumented_convs[tensorboard]'"
        ) from None
    rank, world = job_rank()
    return SummaryWriter(str(Path(folder) / f"rank{rank}") if world is not None else folder)


def view_main(args: argparse.Namespace) -> int:
    """``view``: a saved run, summarised again as asked, in the format asked (``--format``,
    or the flag that names one; ``--html`` and ``--trace`` write theirs to a file)."""
    name, to = _view_format(args)
    if name == "trace":
        return _view_trace(args.run, to)
    saved = open_run(args.run)
    inp = _view_input(args, saved, name)
    if to is not None:
        RENDERERS[name].write(inp, to)
        print(f"{name} written to {to}")
        return 0
    print(render(name, inp))
    return 0


def _view_format(args: argparse.Namespace) -> Tuple[str, Optional[str]]:
    """The format ``view`` was asked for, and the file to write it to (None: print it)."""
    for flag, name in VIEW_ALIASES:
        value = getattr(args, flag)
        if value:
            return name, value if isinstance(value, str) else None
    return args.format, None


def _view_trace(path: str, to: str) -> int:
    """``view --trace FILE``: the saved timeline, copied to ``FILE``."""
    open_run(path)  # a run, or why not
    try:
        trace = saved_chrome_trace(path)
    except FileNotFoundError as exc:
        raise UserError(str(exc)) from exc
    written = RENDERERS["trace"].write(RenderInput(timeline=trace), to)
    print(f"timeline written to {written}")
    return 0


def _view_input(args: argparse.Namespace, saved: SavedRun, name: str) -> RenderInput:
    """What the renderer ``name`` reads of ``saved``: the summary (its rank, its rows as
    selected), the peak and the times of the counters' table, the loaders (each worker's
    table); a :class:`UserError` where the run has nothing for it."""
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


def open_run(path: str) -> SavedRun:
    """The saved run at ``path`` (a run folder or its file), or a :class:`UserError` that
    says what ``path`` is instead and what to give."""
    p = Path(path)
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
    a, b = (_summary(open_run(path), args.by, args.unit, args.rank) for path in (args.a, args.b))
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
        raise UserError(f"{folder}: a rank file is cut short or corrupt ({e})") from e
    if merged["ranks_missing"]:
        logger.warning("merge: no file from ranks %s: merged without them", merged["ranks_missing"])
    print(saved_summary(merged, by=merged.get("by") or "step", unit=merged.get("unit")))
    return 0
