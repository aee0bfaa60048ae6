"""What ``run`` refuses before anything runs or is written: flags that contradict each other
or the mode, a script or module that is not there, a conv class ``--only``/``--exclude``
name that PyG and DGL do not have (with the closest names). One line each, exit code 2.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import importlib.util
import os
from typing import List, Set

from ... import configure
from ...layers import InstrumentedLayer
from ..errors import USAGE, UserError
from .parsers import names
from .peaks import check_peaks

__all__ = ["RUN_ALIASES", "check_run"]

#: The flags of ``run`` that name a format to print at the end, and what they record for it:
#: ``--counters`` is ``--format roofline``, ``--memory`` is ``--format memory``.
RUN_ALIASES = (("counters", "roofline"), ("memory", "memory"), ("advise", "advice"))


def check_run(args: argparse.Namespace) -> None:
    """Refuse what ``run`` cannot do, before anything runs or is written; the formats asked
    for turn on what they record."""
    if args.on_demand and args.record not in (None, "on-demand"):
        raise UserError(
            f"--on-demand is --record on-demand: not with --record {args.record}", USAGE
        )
    if args.on_demand:
        args.record = "on-demand"
    if args.record is None:  # what the environment set (INSTRUMENTED_CONVS_RECORD)
        args.record = configure().record
    demand = args.record == "on-demand"
    refused = [
        (args.backward_every is not None and args.backward_every < 1)
        and "--backward-every takes a positive number",
        args.trace_limit < 0 and "--trace-limit takes a number >= 0",
        (args.autosave is not None and args.autosave < 0)
        and "--autosave takes seconds >= 0 (0: only at the end)",
        (args.autosave and demand)
        and "--autosave: on demand, each capture is written as it ends: drop --autosave",
        (args.autosave and args.record == "ranges")
        and "--autosave: --record ranges records nothing to save: drop --autosave",
        (args.record_every is not None and args.record_every < 1)
        and "--record-every takes a positive number",
        (args.budget is not None and not 0 < args.budget < 1)
        and "--budget takes a fraction between 0 and 1 (0.01: 1%)",
        (args.iteration is not None and args.record_every is None and args.budget is None)
        and not demand
        and "--iteration names what --record-every, --budget or --on-demand records: give one",
        (demand and (args.record_every is not None or args.budget is not None))
        and "--on-demand records every iteration a capture covers: drop --record-every/--budget",
        (demand and args.warmup)
        and "--on-demand records captures only (nothing to warm up): drop --warmup",
        (demand and args.tensorboard)
        and "--tensorboard writes a point an epoch; on demand only captures record: drop it",
        (args.record == "ranges" and (args.counters or args.memory))
        and "--record ranges records no counters or memory: drop --counters/--memory",
        (args.record == "ranges" and (args.record_every is not None or args.budget is not None))
        and "--record ranges pushes a range for every call: drop --record-every/--budget",
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
