"""``python -m instrumented_convs check``: the library checks its claims on this machine.

Five sections (:data:`SECTIONS`: equivalence, accuracy, CUDA, cost, environment), each a
table of lines, PASS, FAIL or SKIPPED, so that a user can trust the tool on a machine before
reading its numbers (:func:`run`; docs/check.md).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, Callable, Dict, List, Optional

import torch

from ..errors import PROG, USAGE, HelpFormatter, UserError, described, error_note
from . import accuracy, cost, cuda, environment, equivalence
from ._report import FAIL, PASS, SKIPPED, Line, Report, Section

__all__ = ["run", "add_command", "Report", "Section", "Line", "PASS", "FAIL", "SKIPPED"]

#: The sections in order: (key, function(device, quick, progress) -> Section).
SECTIONS: Dict[str, Callable[..., Section]] = {
    "equivalence": equivalence.section,
    "accuracy": accuracy.section,
    "sync": cuda.section,
    "cost": cost.section,
    "environment": environment.section,
}


class _Progress:
    """One line on a terminal's stderr, rewritten: what runs now, how long it has been."""

    def __init__(self, on: bool) -> None:
        self.on, self.t0, self.width = on, time.perf_counter(), 0

    def __call__(self, what: str) -> None:
        if not self.on:
            return
        text = f"[{time.perf_counter() - self.t0:6.1f} s] {what}"[:100]
        sys.stderr.write("\r" + text.ljust(self.width))
        sys.stderr.flush()
        self.width = len(text)

    def done(self) -> None:
        if self.on and self.width:
            sys.stderr.write("\r" + " " * self.width + "\r")
            sys.stderr.flush()


def run(
    device: str = "cpu",
    quick: bool = False,
    sections: Optional[List[str]] = None,
    progress: Optional[Callable[[str], Any]] = None,
) -> Report:
    """Run the check (every section, or those named) on ``device``; the :class:`Report`.
    It builds layers and trains small models in this process: the registry is emptied
    (``registry.reset()``) as it goes, and the switches it changes are put back.

    Five sections, each a table of lines, PASS, FAIL or SKIPPED (with the reason):

    1. :mod:`~.equivalence`: our layers give the stock layers' outputs, gradients and
    ``state_dict`` on this device; 2. :mod:`~.accuracy`: each step's time by our clock agrees
    with the profiler's measure of the same range (the label on the CPU, the kernels CUPTI saw
    on CUDA); 3. :mod:`~.cuda`: on CUDA, the tool adds no synchronisation and its event timing
    holds; 4. :mod:`~.cost`: what the instrumentation costs here, against what the docs promise;
    5. :mod:`~.environment`: versions, device, the guard's verdicts, NVTX, ``torch.compile``.

    The exit status is 0 only when no line failed; ``--json FILE`` writes every line with its
    figures, for a bug report. On a GPU, run it first (docs/check.md says what each line means
    and what to send when one fails).
    """
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device() if torch.cuda.is_available() else 0)
    report = Report(str(dev), quick)
    for key in sections or list(SECTIONS):
        try:
            s = SECTIONS[key](dev, quick, progress)
        except Exception as exc:  # a section that cannot even start fails as one line
            s = Section(key, "")
            s.add(key, FAIL, f"raised {type(exc).__name__}: {exc}")
        report.sections.append(s)
    return report


def _main(args: argparse.Namespace) -> int:
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(
            f"--device {args.device}, but torch sees no CUDA device (a torch built with CUDA?)",
            USAGE,
        )
    bar = _Progress(sys.stderr.isatty() and not args.no_progress)
    try:
        report = run(args.device, args.quick, args.sections, bar)
    finally:
        bar.done()
    print(report.render())
    if args.json:
        with open(args.json, "w") as f:
            f.write(report.to_json())
        print(f"\nwritten: {args.json}")
    return 1 if report.failed else 0


def add_command(sub: Any) -> Dict[str, Callable[[argparse.Namespace], int]]:
    """Add ``check`` to the package's command line (``instrumented_convs.commands.cli``)."""
    p = sub.add_parser(
        "check",
        formatter_class=HelpFormatter,
        usage=f"{PROG} check [options]",
        help="check this library's claims on this machine (run it first on a GPU)",
        description=described(
            "Checks the library's claims on this machine, in five sections (equivalence,\n"
            "accuracy, CUDA, cost, environment), each a table of lines PASS, FAIL or SKIPPED.",
            f"{PROG} check",
            f"{PROG} check --device cuda --json check.json   (for a bug report)",
            f"{PROG} check --quick --sections equivalence accuracy",
        ),
        epilog="Exit code 0 when no line failed, 1 when one did; docs/check.md says what each "
        "line means\nand what to send when one fails.\n\n" + error_note(),
    )
    p.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    p.add_argument("--quick", action="store_true", help="smaller graphs, fewer rounds")
    p.add_argument("--json", metavar="FILE", help="write every line and its figures here")
    p.add_argument(
        "--sections",
        nargs="+",
        choices=list(SECTIONS),
        metavar="SECTION",
        help=f"only these sections, of: {', '.join(SECTIONS)} (default: all)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress line on stderr")
    return {"check": _main}
