"""Run a script or a module as ``python script.py args`` / ``python -m module args`` would
(:func:`run_target`), so that a script behaves under ``run`` as it does without it, and its
outcome comes back as an :class:`Outcome` for the report to be written first.
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
import traceback
from typing import List, NamedTuple, Optional

from .stopping import Terminated

__all__ = ["Outcome", "run_target"]


class Outcome(NamedTuple):
    """How the script ended: the exit code ``python`` would give and why."""

    code: int  #: the exit code
    #: ``returned``, ``exit`` (SystemExit), ``exception``, ``interrupted`` (SIGINT),
    #: ``terminated`` (SIGTERM), ``signalled`` (saved before a script's own handler ran)
    how: str
    error: Optional[str] = None  #: the exception's one-line description, if any


def _exit_code(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # what the interpreter does with sys.exit("message")
    return 1


def _print_exception(e: BaseException) -> None:
    """Print ``e`` as the interpreter would: its traceback starts in the script's code."""
    tb = e.__traceback__
    while tb is not None and tb.tb_frame.f_globals.get("__name__") in (__name__, "runpy"):
        tb = tb.tb_next
    last = tb  # and ends where the signal came (not in run's handler that raised it)
    while last is not None and last.tb_next is not None:
        if last.tb_next.tb_frame.f_globals.get("__name__") == Terminated.__module__:
            last.tb_next = None
        else:
            last = last.tb_next
    traceback.print_exception(type(e), e, tb)


def _put_back_child_handler(saved: object) -> None:
    """Put back the SIGCHLD handler the script found. torch's data loader sets its own, which
    raises in whatever runs when a worker process dies: once the script is over that would
    be this report's code (a killed worker's run lost while it was being saved)."""
    for _ in range(100):  # each try may meet the handler firing for one more death
        try:
            signal.signal(signal.SIGCHLD, saved)  # type: ignore[arg-type]
            return
        except RuntimeError:
            continue
        except ValueError:  # not the main thread: no handler of its own to put back
            return


def run_target(target: str, args: List[str], module: bool = False) -> Outcome:
    """Run the script at path ``target`` (or the module ``target``) with ``args``.

    Exceptions are printed as the interpreter prints them and turned into an exit code;
    ``sys.argv``, ``sys.path`` and the SIGCHLD handler are put back afterwards.

    ``sys.argv`` is the script's own, ``__name__`` is ``"__main__"`` (and
    ``sys.modules["__main__"]`` the script's module while it runs), ``sys.path[0]`` is the
    script's folder (the current folder for ``-m``), and the outcome is the exit code
    ``python`` would give: 0, the code of a ``SystemExit``, 1 after printing the traceback of
    an exception, 130 on Ctrl-C.
    """
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    child = getattr(signal, "SIGCHLD", None)
    saved_child = signal.getsignal(child) if child is not None else None
    caught: Optional[BaseException] = None
    try:
        if module:
            sys.argv = [target, *args]  # runpy sets argv[0] to the module's file
            sys.path[0:1] = [os.getcwd()]
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            path = os.path.abspath(target)
            if not os.path.exists(path):
                print(f"python: can't open file {target!r}: no such file", file=sys.stderr)
                return Outcome(2, "exception", f"no such file: {target}")
            sys.argv = [target, *args]
            sys.path[0:1] = [os.path.dirname(path)]
            runpy.run_path(path, run_name="__main__")
    except BaseException as e:  # noqa: BLE001 - reported like the interpreter below
        caught = e
    finally:
        sys.argv = saved_argv
        sys.path[:] = saved_path
    # No call between the script's end and here (a signal's Python handler runs only at one),
    # and this is the first: a signal pending now finds the handler put back, not torch's.
    try:
        if saved_child is not None:
            signal.signal(child, saved_child)  # type: ignore[arg-type]
    except (RuntimeError, ValueError):  # torch's handler fired before it; not the main thread
        pass
    for _ in range(100):
        try:
            if child is not None and signal.getsignal(child) is not saved_child:
                _put_back_child_handler(saved_child)
            break
        except RuntimeError:  # torch's handler, fired on entering the call above
            continue
    return _outcome(caught)


def _outcome(caught: Optional[BaseException]) -> Outcome:
    """The exit code and reason of a script that ended by raising ``caught`` (or returned)."""
    if caught is None:
        return Outcome(0, "returned")
    if isinstance(caught, SystemExit):
        return Outcome(_exit_code(caught), "exit")
    if isinstance(caught, Terminated):  # as SIGTERM's default action: nothing printed
        return Outcome(128 + signal.SIGTERM, "terminated", "SIGTERM")
    _print_exception(caught)
    if isinstance(caught, KeyboardInterrupt):
        return Outcome(130, "interrupted", "KeyboardInterrupt")
    return Outcome(1, "exception", f"{type(caught).__name__}: {caught}")
