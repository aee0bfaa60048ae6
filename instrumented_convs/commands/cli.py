"""``python -m instrumented_convs COMMAND``: the package's command lines, one parser.

- the study's (:mod:`instrumented_convs.commands.study.cli`): ``demo`` (start here), ``compare``,
  ``bench``;
- profiling a script nobody changed and reading its runs back
  (:mod:`instrumented_convs.commands.launch.cli`): ``run``, ``view``, ``merge``;
- checking the library's claims on this machine (:mod:`instrumented_convs.commands.check`):
  ``check``.
"""

from __future__ import annotations

import argparse
import logging
from typing import Optional, Sequence

from . import check
from .launch import cli as launch_cli
from .study import cli as study_cli

__all__ = ["main"]

DESCRIPTION = (
    "instrumented_convs: where the time goes inside graph convolution layers.\n\n"
    f"Start with: {study_cli.PROG} demo (the study's 3-layer GCN, PyG and DGL). Profile your own\n"
    f"training script, unchanged: {study_cli.PROG} run train.py [args]. On a GPU, first:\n"
    f"{study_cli.PROG} check --device cuda."
)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Parse ``argv`` (default: ``sys.argv[1:]``) and run the command it names."""
    parser = argparse.ArgumentParser(
        prog=study_cli.PROG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=DESCRIPTION,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands = study_cli.add_commands(sub)
    commands.update(launch_cli.add_commands(sub))
    commands.update(check.add_command(sub))
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
    return commands[args.command](args)
