"""Jupyter: saved runs shown as their page (:func:`load`), and the ``%%instrumented`` magic
(:class:`InstrumentedMagics`), which profiles a cell as ``run`` profiles a script. Only this
module imports IPython.
"""

from __future__ import annotations

import argparse
import os
import shlex
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

try:
    from IPython.core.magic import Magics, cell_magic, magics_class
except ImportError as e:  # pragma: no cover - exercised by tests/test_layering.py
    raise ImportError(
        f"instrumented_convs.notebook needs IPython ({e}): "
        "pip install 'instrumented_convs[notebook]'"
    ) from None

from . import configure, registry
from .commands.launch import (
    TRACE_LIMIT,
    Hooks,
    run_data,
    run_meta,
    saved_page_html,
    saved_summary,
    write_run,
)
from .commands.launch import (
    load as load_run,
)
from .report import in_notebook

__all__ = ["NotebookRun", "load", "InstrumentedMagics", "load_ipython_extension"]


class NotebookRun:
    """A run in a notebook: shown as its page (``_repr_html_``), its table in text views.

    ``summary``: its :class:`~instrumented_convs.report.Summary`; ``run``: the run as saved
    (``run.json``'s contents: command, versions, settings, raw statistics); ``folder``:
    where it is saved (None: kept in memory only)."""

    def __init__(self, run: Dict[str, Any], folder: Optional[Path] = None) -> None:
        """``run``: a run as ``load`` reads it; ``folder``: where it lies."""
        self.run = run
        self.folder = folder
        self.summary = saved_summary(run, by=run.get("by") or "step", unit=run.get("unit"))

    @property
    def title(self) -> str:
        """What the run was: the cell, the script or the Lightning call."""
        return str(self.run.get("target") or "run")

    def _repr_html_(self) -> str:
        """The page (icicle, table, command, versions, settings) in a frame of its own (an
        iframe's ``srcdoc``: the page's script and styles and the notebook's cannot touch each
        other), with the text table where a viewer strips scripts or frames."""
        page = saved_page_html(self.run, self.summary)
        return in_notebook(page, self.summary.table(title=self.title))

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """The table, for IPython's text views."""
        printer.text(repr(self) if cycle else self.summary.table(title=self.title))

    def __repr__(self) -> str:
        """``NotebookRun('title', folder=...)``."""
        return f"NotebookRun({self.title!r}, folder={str(self.folder) if self.folder else None!r})"


def load(path: "str | os.PathLike[str]") -> NotebookRun:
    """A saved run (its folder, ``run.json`` or a rank file) to show in a notebook."""
    p = Path(path)
    return NotebookRun(load_run(p), p if p.is_dir() else p.parent)


def _whole(least: int) -> Any:
    """An argparse type: a whole number >= ``least``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = least - 1
        if value < least:
            raise argparse.ArgumentTypeError(f"takes a whole number >= {least}, not {text!r}")
        return value

    return parse


def _fraction(text: str) -> float:
    """An argparse type: a fraction in (0, 1)."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"takes a fraction in (0, 1) (0.01: 1%), not {text!r}")
    return value


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="%%instrumented", add_help=False)
    p.add_argument("-o", "--output", metavar="DIR", help="save the run in DIR (a run folder)")
    p.add_argument("--var", default="ic_run", help="the variable that keeps the run (ic_run)")
    p.add_argument("--quiet", action="store_true", help="show nothing at the end")
    p.add_argument("--only", help="conv classes to instrument (comma-separated)")
    p.add_argument("--exclude", help="conv classes to leave stock (comma-separated)")
    p.add_argument("--warmup", type=_whole(0), default=0, help="optimizer steps whose records drop")
    p.add_argument("--by", choices=("step", "layer", "relation"), default="step")
    p.add_argument("--no-backward", action="store_true", help="do not time the backward")
    p.add_argument("--backward-every", type=_whole(1), help="time one layer call's backward in N")
    p.add_argument("--counters", action="store_true", help="count each step's FLOPs and bytes")
    p.add_argument(
        "--memory", action="store_true", help="record what each step keeps for backward, peaks"
    )
    p.add_argument("--record-every", type=_whole(1), help="the duty cycle: one iteration in K")
    p.add_argument("--budget", type=_fraction, help="the duty cycle under this added share")
    p.add_argument("--iteration", help="the region that is an iteration of the duty cycle")
    return p


def _names(text: Optional[str]) -> Optional[List[str]]:
    return None if text is None else [n for n in text.split(",") if n]


@magics_class
class InstrumentedMagics(Magics):
    """``%%instrumented``: the cell, profiled as ``run`` profiles a script.

    ``%load_ext instrumented_convs`` gives the cell magic: the cell runs as under ``run``
    (its models' stock conv layers instrumented at their first call, the loop's regions
    ``forward``, ``backward``, ``optimizer.step``, ``data``), the table is shown at the end,
    the run is kept in a variable (``ic_run``; ``--var NAME``) and saved where ``-o DIR``
    says; the layers it instrumented are stock again after the cell. ``%%instrumented?``
    lists its options (those of ``run``: ``--record-every``, ``--budget``, ``--counters``,
    ``--memory``...).
    """

    @cell_magic
    def instrumented(self, line: str, cell: str) -> None:
        """Run the cell with its conv layers' steps and its loop's regions recorded; show
        the table; keep the run in ``--var`` (``ic_run``), save it with ``-o DIR``.

        Options: ``-o DIR``, ``--var NAME``, ``--quiet``, ``--only A,B``, ``--exclude A,B``,
        ``--warmup N``, ``--by layer``, ``--no-backward``, ``--backward-every N``,
        ``--counters``, ``--memory``, ``--record-every K``, ``--budget B``,
        ``--iteration NAME``."""
        parser = _parser()
        try:
            args = parser.parse_args(shlex.split(line))
            if args.record_every is not None and args.budget is not None:
                parser.error("--record-every and --budget both set the duty cycle: give one")
            if args.iteration is not None and args.record_every is None and args.budget is None:
                parser.error("--iteration names what --record-every or --budget draws")
        except SystemExit:  # argparse said why on stderr
            return None
        folder = Path(args.output) if args.output else None
        hooks = Hooks(_names(args.only), _names(args.exclude) or (), args.warmup)
        registry.reset()
        previous = configure(
            backward=False if args.no_backward else None,
            backward_every=args.backward_every,
            timeline=TRACE_LIMIT if folder else 0,
            counters=True if args.counters else None,
            memory=True if args.memory else None,
        )
        started = time.time()
        try:
            hooks.install()
            if args.record_every is not None or args.budget is not None:
                configure(
                    record_every=args.record_every, budget=args.budget, iteration=args.iteration
                )
            result = self.shell.run_cell(cell)
        finally:
            hooks.close()
            hooks.remove()
        try:
            error = getattr(result, "error_in_exec", None) or getattr(
                result, "error_before_exec", None
            )
            meta = run_meta(
                ["%%instrumented", *shlex.split(line)],
                "%%instrumented cell",
                shlex.split(line),
                started,
                "raised" if error else "returned",
                hooks,
                error=repr(error) if error else None,
                cell=cell,
            )
            if folder is not None:
                write_run(
                    folder,
                    registry.snapshot(),
                    meta,
                    by=args.by,
                    job=(None, None),
                    timeline=registry.timeline(),
                    trace_name=f"%%instrumented ({os.getpid()})",
                )
                run = load_run(folder)
            else:
                run, _ = run_data(registry.snapshot(), meta, by=args.by, job=(None, None))
        finally:
            previous.restore()
            hooks.put_back()
        kept = NotebookRun(run, folder)
        self.shell.user_ns[args.var] = kept
        if not args.quiet:
            from IPython.display import display

            display(kept)
        return None


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext instrumented_convs``: register ``%%instrumented``."""
    ipython.register_magics(InstrumentedMagics)
