"""``run``, ``view``, ``merge``, ``diff``: profile an unmodified script (here); read and
compare runs (:mod:`.view`).

What ``run`` and ``view`` print is a renderer's, named by ``--format``; the older flags
(``--json``, ``--html``, ``--counters``, ``--memory``, ``--workers``, ``--trace``) name one.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from ... import configure, registry
from ...report import (
    RENDERERS,
    render,
)
from ..errors import PROG, UserError
from . import ondemand
from .autosave import DEFAULT_SECONDS, Autosave, autosave_record
from .capture import capture_main
from .hooks import Hooks
from .parsers import (
    add_advise_parser,
    add_capture_parser,
    add_diff_parser,
    add_merge_parser,
    add_run_parser,
    add_view_parser,
    names,
)
from .peaks import run_peak
from .ranks import merged_run
from .refusals import RUN_ALIASES, check_run
from .runs import (
    SavedRun,
    default_folder,
    ended_title,
    job_rank,
    load,
    run_meta,
    saved_render_input,
    saved_summary,
    write_run,
)
from .script import Outcome, run_target
from .stopping import Stopping, Terminated
from .view import advise_main, diff_main, merge_main, view_main

__all__ = [
    "add_commands",
    "typed_command",
    "run_main",
    "capture_main",
    "view_main",
    "merge_main",
    "diff_main",
]

logger = logging.getLogger(__name__)

#: The console script (setup.cfg), as the run folder writes a command typed through it.
CONSOLE = "instrumented-convs"


def add_commands(sub: Any) -> Dict[str, Callable[[argparse.Namespace], int]]:
    """Add ``run``, ``capture``, ``view``, ``merge``, ``diff`` and ``advise`` to the
    subparsers ``sub``; returns their mains."""
    add_run_parser(sub)
    add_capture_parser(sub)
    add_view_parser(sub)
    add_merge_parser(sub)
    add_diff_parser(sub)
    add_advise_parser(sub)
    return {
        "run": run_main,
        "capture": capture_main,
        "view": view_main,
        "merge": merge_main,
        "diff": diff_main,
        "advise": advise_main,
    }


def run_main(args: argparse.Namespace) -> int:
    """``run``: the script under the hooks, then the table and the run folder."""
    started = time.time()
    check_run(args)
    writer = _configure_run(args)
    hooks = _install_hooks(args, writer)
    folders: List[Path] = []

    def folder_of() -> Path:  # made at the first save (on demand: before the script)
        if not folders:
            folders.append(
                Path(args.output) if args.output else default_folder(args.target, started)
            )
        return folders[0]

    if args.record == "on-demand":  # the folder first: the job listens there
        _listen(args, folder_of(), started, hooks)

    autosave = _autosave(args, started, hooks, folder_of)

    def save_now(sig: int) -> None:  # before a script's own handler of ``sig`` runs
        if args.record != "on-demand":
            ended = Outcome(
                128 + sig,
                "signalled",
                f"{signal.Signals(sig).name}: the script's handler ran after this save",
            )
            meta = _run_meta(args, started, ended, hooks)
            with autosave.lock:  # (never beside an autosave's write)
                _save_run(args, folder_of(), meta, writer, close=False)

    stopping = Stopping(save_now)
    stopping.install()
    outcome: Optional[Outcome] = None
    try:
        with stopping.script():
            autosave.start()
            outcome = run_target(args.target, list(args.args), module=args.module)
    except Terminated:  # at the script's end, after its code: still the job's end
        outcome = Outcome(128 + signal.SIGTERM, "terminated", "SIGTERM")
    except KeyboardInterrupt:
        outcome = Outcome(130, "interrupted", "KeyboardInterrupt")
    finally:
        autosave.stop()  # (the run's own save is the last word)
        stopping.saving("the run's captures")
        server = None
        if args.record == "on-demand":  # a capture under way is written with what it recorded
            server = ondemand.stop(_ending(outcome))
            configure(record="all")
        hooks.close()
        hooks.remove()
    assert outcome is not None  # (run_target returns whatever the script does)
    try:
        stopping.saving(f"the run in {folder_of()}")
        _warn_after_run(args, hooks)
        meta = _run_record(args, started, outcome, hooks)
        if server is not None:
            meta["on_demand"] = {"captures": server.captures}
        if autosave.seconds:
            meta["autosave"] = {
                "every": autosave.seconds,
                "saves": autosave.saves,
                "longest_s": round(autosave.longest_s, 4),
            }
        _save_run(args, folder_of(), meta, writer)
        saved = _finished_run(args, folder_of(), outcome)
    finally:
        stopping.uninstall()
    if saved is not None and not args.quiet:
        _print_run(args, saved, outcome)
    if saved is not None:
        logger.info("run: saved in %s (exit code %d)", folder_of(), outcome.code)
    stopping.die()
    return outcome.code


def _autosave(
    args: argparse.Namespace, started: float, hooks: Hooks, folder_of: Callable[[], Path]
) -> Autosave:
    """``--autosave``: the run's record as it stands, made for the autosave's thread (none on
    demand, where each capture is written as it ends, nor where only ranges are pushed)."""
    seconds = DEFAULT_SECONDS if args.autosave is None else args.autosave
    if args.record in ("on-demand", "ranges"):
        seconds = 0.0
    if seconds:
        folder_of()  # (the folder claimed here, on the script's thread)

    def make(number: int) -> Tuple[Path, str]:
        meta = _run_meta(args, started, Outcome(0, "running"), hooks)
        meta["exit_code"] = None
        meta["autosave"] = {
            "saved": time.time(),
            "every": seconds,
            "number": number,
            "steps": hooks.steps,
            "epochs": hooks.epochs,
        }
        return autosave_record(folder_of(), registry.snapshot(), meta, by=args.by, unit=args.unit)

    return Autosave(seconds, make)


def typed_command(target: str, args: List[str]) -> List[str]:
    """The command as it was typed, for the run folder: ``instrumented-convs run ...`` through
    the console script that PATH finds, ``python -m instrumented_convs run ...`` where
    ``python`` is the one PATH finds (else its path); a call of run's entry from another
    program: the target and its arguments."""
    if sys.argv[1:2] != ["run"]:
        return [target, *args]
    first = os.path.abspath(sys.argv[0])
    if os.path.basename(first) == CONSOLE:
        found = shutil.which(CONSOLE)
        return [CONSOLE if found and os.path.abspath(found) == first else first, *sys.argv[1:]]
    python = sys.executable
    found = shutil.which(os.path.basename(python))
    if found and os.path.abspath(found) == python:
        python = os.path.basename(python)
    return [python, "-m", "instrumented_convs", *sys.argv[1:]]


def _ending(outcome: Optional[Outcome]) -> str:
    """Why a capture under way when the script ended is cut short."""
    how = outcome.how if outcome is not None else None
    return {
        "interrupted": "the job was interrupted (Ctrl-C)",
        "terminated": "the job was ended (SIGTERM)",
        "exception": "the script raised an exception",
        "exit": "the script exited",
    }.get(how or "", "the job ended")


def _listen(args: argparse.Namespace, folder: Path, started: float, hooks: Hooks) -> None:
    """Listen for captures in ``folder``, then record on demand (its cycle's hooks after
    run's, as the duty cycle's)."""
    command = typed_command(args.target, args.args)

    def describe(capture: Dict[str, Any]) -> Dict[str, Any]:
        return run_meta(
            command,
            args.target,
            args.args,
            started,
            "captured",
            hooks,
            module=args.module,
        )

    try:
        ondemand.listen(
            folder,
            describe,
            timeline=bool(args.trace_limit),
            counters=args.counters,
            memory=args.memory,
            merge_timeout=args.merge_timeout,
        )
    except OSError as e:
        raise UserError(f"--on-demand: cannot listen for captures in {folder}: {e}") from None
    configure(record="on-demand", iteration=args.iteration)


def _configure_run(args: argparse.Namespace) -> Any:
    """The settings the script runs under (on demand, its counters and memory come on in
    captures only, and the mode after the hooks); the TensorBoard writer, where asked for."""
    demand = args.record == "on-demand"
    if demand and configure().record == "on-demand":  # (the environment's: its hooks after run's)
        configure(record="all")
    configure(
        backward=False if args.no_backward else None,
        backward_every=args.backward_every,
        timeline=0 if args.record == "ranges" else args.trace_limit,
        counters=True if args.counters and not demand else None,
        memory=True if args.memory and not demand else None,
        record=None if demand else args.record,
        advise=True if args.advise else None,
    )
    if args.advise and args.record != "on-demand":  # the changes are timed after the script
        from ...layers import keep_layers

        keep_layers()
    return _tensorboard(args.tensorboard) if args.tensorboard else None


def _install_hooks(args: argparse.Namespace, writer: Any) -> Hooks:
    """The hooks, installed (a TensorBoard point an epoch), then the duty cycle's and the
    eager breakdown's settings, whose hooks come after run's."""
    hooks = Hooks(
        names(args.only),
        names(args.exclude) or (),
        args.warmup,
        on_demand=args.record == "on-demand",
    )
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
    if args.record == "ranges":
        logger.warning(
            "run: --record ranges: the steps pushed NVTX ranges and recorded nothing here; "
            "the table is in the Nsight Systems report: %s view REPORT.nsys-rep",
            PROG,
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
    if args.advise and args.record != "on-demand":
        if outcome.how == "terminated":
            logger.warning("run: --advise: the changes were not timed (the job was ended)")
        else:
            _time_changes(args, started)
    return _run_meta(args, started, outcome, hooks, final=True)


def _run_meta(
    args: argparse.Namespace, started: float, outcome: Outcome, hooks: Hooks, final: bool = False
) -> Dict[str, Any]:
    """The run's record (:func:`_run_record`); ``final``: at its end (the loaders' recorder
    closed), else as it stands (a save before a script's own signal handler)."""
    meta = run_meta(
        typed_command(args.target, args.args),
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
    if hooks.recorder is not None and final:
        loaders = hooks.recorder.result()
        hooks.recorder.close()
        if (loaders["loaders"] or loaders["workers"]) and args.record != "on-demand":
            meta["workers"] = loaders
    if args.memory and args.record != "on-demand" and final:
        configure(memory=False)
    if args.counters and final:
        configure(counters=False)
        meta["peak"] = run_peak(args)._asdict()  # the device's limits (probed, cached; given)
    return meta


def _time_changes(args: argparse.Namespace, started: float) -> None:
    """``--advise``: the changes that replace work timed on the layers' own last inputs, in
    ``--advise-seconds`` (default a tenth of the run, 60 s at most), on rank 0 of a job."""
    seconds = args.advise_seconds
    if seconds is None:
        seconds = min(60.0, 0.1 * (time.time() - started))
    if seconds <= 0 or job_rank()[0] not in (None, 0):  # (rank 0 measures for the job)
        return
    from ...layers import time_changes

    for line in time_changes(seconds, compile=args.advise_compile):
        logger.warning("run --advise: not timed: %s", line)


def _save_run(
    args: argparse.Namespace, folder: Path, meta: Dict[str, Any], writer: Any, close: bool = True
) -> None:
    """Write this process's run (its timeline with it) and (``close``) close the TensorBoard
    writer."""
    rank, world = job_rank()
    timeline, name = None, None
    if args.trace_limit and "on_demand" not in meta:  # (on demand: each capture has its own)
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
        [] if "on_demand" in meta else registry.snapshot(),  # (on demand: in its captures)
        meta,
        by=args.by,
        unit=args.unit,
        timeline=timeline,
        trace_name=name,
    )
    if writer is not None and close:
        writer.add_text("instrumented_convs/run folder", str(folder.resolve()))
        writer.close()


def _finished_run(args: argparse.Namespace, folder: Path, outcome: Outcome) -> Optional[SavedRun]:
    """The run as saved: this process's, or under torchrun the ranks merged by rank 0 (None
    on the other ranks, which print nothing)."""
    rank, world = job_rank()
    if world is None:
        return load(folder)
    return merged_run(folder, rank, args.merge_timeout, outcome.how == "terminated")


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
