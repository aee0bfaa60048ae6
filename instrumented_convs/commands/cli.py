"""``python -m instrumented_convs COMMAND``: the package's command lines, one parser.

- the study's (:mod:`instrumented_convs.commands.study.cli`): ``demo`` (start here), ``compare``,
  ``bench``;
- profiling a script nobody changed and reading its runs back
  (:mod:`instrumented_convs.commands.launch.cli`): ``run``, ``view``, ``merge``, ``diff``,
  ``advise``;
- checking the library's claims on this machine (:mod:`instrumented_convs.commands.check`):
  ``check``.
"""

from __future__ import annotations

import argparse
import logging
from typing import Callable, Dict, Optional, Sequence, Tuple

from . import check
from .errors import HelpFormatter, Parser, call, error_note
from .launch import cli as launch_cli
from .study import cli as study_cli

__all__ = ["main", "build_parser"]

DESCRIPTION = (
    "instrumented_convs: where the time goes inside graph convolution layers.\n\n"
    "examples:\n"
    f"  {study_cli.PROG} demo                 the study's 3-layer GCN, PyG and DGL: start here\n"
    f"  {study_cli.PROG} run train.py [args]  profile your own training script, unchanged\n"
    f"  {study_cli.PROG} check --device cuda  on a GPU, first: check the tool's claims here\n\n"
    f"{study_cli.PROG} COMMAND --help: a command's flags and examples."
)


def build_parser() -> Tuple[argparse.ArgumentParser, Dict[str, Callable[..., int]]]:
    """The command line's parser, and what runs each command."""
    parser = Parser(
        prog=study_cli.PROG,
        formatter_class=HelpFormatter,
        description=DESCRIPTION,
        epilog=error_note(),
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands = study_cli.add_commands(sub)
    commands.update(launch_cli.add_commands(sub))
    commands.update(check.add_command(sub))
    return parser, commands


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Parse ``argv`` (default: ``sys.argv[1:]``) and run the command it names; an expected
    failure prints a line and returns its exit code (:mod:`.errors`)."""
    parser, commands = build_parser()
    args = parser.parse_args(argv)
    if args.command == "run":  # the script configures logging its own way: ours apart
        ours = logging.getLogger("instrumented_convs")
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        ours.addHandler(handler)
        ours.setLevel(logging.INFO)
        ours.propagate = False
    else:
        logging.basicConfig(level=logging.INFO, format="%(message)s")
    return call(args.command, commands[args.command], args)
