"""The command lines of ``run``, ``view``, ``merge`` and ``diff``: one argparse builder per
command, apart from what the commands do (:mod:`.cli`), so that each reads on its own.
"""

from __future__ import annotations

import argparse
from typing import Any, List, Optional

from ...report import RENDERERS
from .hooks import BACKWARD, DATA, FORWARD, NO_GRAD, OPTIMIZER
from .peaks import add_peak_options
from .runs import TRACE_LIMIT

__all__ = [
    "PROG",
    "RUN_HELP",
    "add_run_parser",
    "add_view_parser",
    "add_merge_parser",
    "add_diff_parser",
    "names",
    "printable",
]

PROG = "python -m instrumented_convs"
RUN_HELP = f"""\
Runs a training script unmodified, as `python script.py args` would (or `-m module`), with
every PyG and DGL conv layer it builds instrumented (however it was built: torch_geometric.nn,
dgl.nn, PyG's own models), and the loop's phases timed without user code: {FORWARD!r} (the
outermost module call with grad enabled), {NO_GRAD!r} (evaluation), {BACKWARD!r},
{OPTIMIZER!r} and {DATA!r} (a data loader's next batch: the sampler's steps inside, where
they run in this process). A loader's worker processes (num_workers > 0; fork or spawn) are
recorded too: each batch a worker makes, with its sampler's steps, sent back and saved with
the run; under the table, per loader, how an iteration splits between waiting for data and
the rest, with a verdict (data-bound, compute-bound), and the workers' table (`view RUN
--workers`: each worker's own). At exit (normal, exception, Ctrl-C,
sys.exit) prints the table (and the formats --format names) and saves the run in a folder
(-o, or ic-runs/<script>-<time>):
run.json (summary, raw statistics, command, versions, device, settings), summary.txt,
page.html (the run as a page: icicle, table, per-rank totals; works offline), and
trace.json.gz, the timeline of every call (up to --trace-limit calls), a Chrome trace for
ui.perfetto.dev or chrome://tracing.

To leave it on for a long run, --record-every K records one training iteration in K (from one
optimizer step to the next, drawn at random; the first few always) and runs the stock code in
the others; --budget 0.01 chooses K to keep the added time under 1%. The table is scaled to
the whole run (rows marked ~, with their standard error).

A torch.compile'd model or function is a step of its own, "compiled NAME", timed from the
eager code around it, forward and backward; the conv layers inside are listed under the table
as run compiled, with their calls, and graph breaks are attributed to the layer that caused
them. --eager-breakdown runs the recorded iterations eagerly to give their steps.

Under torchrun (torchrun --nproc-per-node 2 -m instrumented_convs run train.py) every rank
saves rank<N>.json and rank 0 writes the merged run.json; `{PROG} merge DIR` merges whatever
ranks saved when one did not reach the end. Example:

  {PROG} run --warmup 5 train.py --epochs 50
  {PROG} run --record-every 10 train.py --epochs 5000
  {PROG} view ic-runs/train-20261125-101500 --by layer
"""


def names(text: Optional[str]) -> Optional[List[str]]:
    """``A,B`` as ``["A", "B"]`` (None: None)."""
    return None if text is None else [n.strip() for n in text.split(",") if n.strip()]


def printable() -> List[str]:
    """The formats that print as text (every renderer but the binary ones: the trace)."""
    return [n for n, r in RENDERERS.items() if not r.binary]


def _formats(text: str) -> List[str]:
    """``--format A,B``: the names, each a renderer that prints."""
    asked = names(text) or []
    for name in asked:
        if name not in printable():
            raise argparse.ArgumentTypeError(
                f"no format {name!r} to print: one of {', '.join(printable())}"
            )
    return asked


def add_run_parser(sub: Any) -> None:
    """``run``: its options, then the script and the script's own arguments."""
    run = sub.add_parser(
        "run",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        help="profile a training script without changing it; saves the run",
        description=RUN_HELP,
        usage=f"{PROG} run [options] (script.py | -m module) [args ...]",
    )
    run.add_argument("-m", dest="module", action="store_true", help="run a module, as python -m")
    run.add_argument("-o", "--output", metavar="DIR", help="the run folder (default: a new one)")
    run.add_argument("--only", metavar="A,B", help="instrument these conv classes only")
    run.add_argument("--exclude", metavar="A,B", help="leave these conv classes stock")
    run.add_argument(
        "--warmup", type=int, default=0, metavar="N", help="drop the first N optimizer steps"
    )
    run.add_argument("--by", choices=("step", "layer"), default="step", help="table rows")
    run.add_argument("--unit", choices=("s", "ms", "us", "ns"), help="the table's time unit")
    run.add_argument("--no-backward", action="store_true", help="do not time backward steps")
    run.add_argument("--backward-every", type=int, metavar="N", help="time one layer backward in N")
    _add_cycle_options(run)
    _add_output_options(run)
    run.add_argument("target", help="the script (or, with -m, the module)")
    run.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")


def _add_cycle_options(run: argparse.ArgumentParser) -> None:
    """``run``'s duty cycle (``--record-every``, ``--budget``, ``--iteration``) and
    ``--eager-breakdown``."""
    cycle = run.add_mutually_exclusive_group()
    cycle.add_argument(
        "--record-every",
        type=int,
        metavar="K",
        help="record one training iteration in K, drawn at random (the first few always), "
        "and run the stock code in the others; the table is scaled to the whole run",
    )
    cycle.add_argument(
        "--budget",
        type=float,
        metavar="B",
        help="choose K as the run goes to keep the added time under B (0.01: 1%%)",
    )
    run.add_argument(
        "--iteration",
        metavar="NAME",
        help="with --record-every/--budget: an iteration is a call of the script's "
        "region(NAME), not an optimizer step",
    )
    run.add_argument(
        "--eager-breakdown",
        action="store_true",
        help="torch.compile'd models: run the recorded iterations eagerly to record their "
        "steps, the others compiled (with --record-every K; else one in 10); the table "
        "says an eager iteration's time and a compiled one's (torch 2.6+)",
    )


def _add_output_options(run: argparse.ArgumentParser) -> None:
    """What ``run`` records besides the times, and what it prints and writes."""
    run.add_argument(
        "--trace-limit",
        type=int,
        default=TRACE_LIMIT,
        metavar="N",
        help="the timeline keeps the first N calls after the warm-up (0: no timeline; "
        "default %(default)s; its memory: docs/performance.md)",
    )
    run.add_argument(
        "--counters",
        action="store_true",
        help="count each step's FLOPs and bytes; print the roofline table (a debugging mode; "
        "--format roofline)",
    )
    add_peak_options(run)
    run.add_argument(
        "--memory",
        action="store_true",
        help="record what each step keeps for backward and its peak; print the memory table "
        "(a debugging mode: docs/memory.md; --format memory)",
    )
    run.add_argument(
        "--format",
        action="extend",
        type=_formats,
        default=[],
        metavar="NAME[,NAME]",
        help="also print the run in these formats at the end, after the table: "
        f"{', '.join(printable())} (roofline counts as --counters does, memory records as "
        "--memory does)",
    )
    run.add_argument(
        "--tensorboard",
        metavar="DIR",
        help="also write each step's time per call to TensorBoard event files in DIR, a point "
        "an epoch (a pass over a data loader; an optimizer step where the script has none)",
    )
    run.add_argument("--quiet", action="store_true", help="save the run, print no table")
    run.add_argument(
        "--merge-timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="torchrun: how long rank 0 waits for the other ranks' files (default %(default)s)",
    )


def add_view_parser(sub: Any) -> None:
    """``view``: which rows of a saved run, and in which format."""
    view = sub.add_parser(
        "view", help="print the table of a saved run", description="Prints a saved run's table."
    )
    view.add_argument("run", help="a run folder, or its run.json / rank<N>.json")
    view.add_argument("--by", choices=("step", "layer"), default="step")
    view.add_argument("--unit", choices=("s", "ms", "us", "ns"))
    view.add_argument("--rank", type=int, help="one rank's own table (a run under torchrun)")
    view.add_argument("--prefix", help="only the rows under this step path")
    view.add_argument("--depth", type=int, help="only rows down to this depth (0: top level)")
    view.add_argument("--phase", choices=("forward", "backward"))
    view.add_argument(
        "--format",
        choices=printable(),
        default="text",
        help="print the run in this format (text, page, json, csv, roofline: see --counters, "
        "memory: see --memory, workers: see --workers)",
    )
    view.add_argument("--json", action="store_true", help="the summary as JSON (--format json)")
    view.add_argument(
        "--trace", metavar="FILE", help="write the run's timeline to FILE (Chrome trace; .gz)"
    )
    view.add_argument(
        "--html", metavar="FILE", help="write the run's page to FILE (--format page, to FILE)"
    )
    view.add_argument(
        "--counters", action="store_true", help="the counters' roofline table (--format roofline)"
    )
    view.add_argument(
        "--memory",
        action="store_true",
        help="the memory table (a run with run --memory; --format memory)",
    )
    view.add_argument(
        "--workers",
        action="store_true",
        help="the data loaders: the split of an iteration, its verdict, each worker's table "
        "(--format workers)",
    )
    view.add_argument(
        "--times", metavar="RUN", help="with --counters: times from RUN, a run without them"
    )
    add_peak_options(view)


def add_merge_parser(sub: Any) -> None:
    """``merge``: a folder's rank files, and how long to wait for them."""
    merge = sub.add_parser(
        "merge",
        help="merge a torchrun run's rank files into its run.json",
        description="Merges the rank<N>.json files of a run folder into run.json and prints it.",
    )
    merge.add_argument("folder")
    merge.add_argument(
        "--wait", type=float, default=0.0, metavar="S", help="wait for missing ranks' files"
    )


def add_diff_parser(sub: Any) -> None:
    """``diff``: two runs, what counts as a change, and when to fail."""
    cmp = sub.add_parser(
        "diff",
        help="two saved runs side by side: the change per step and whether it is real",
        description=(
            "Pairs the steps of run A (the baseline) and run B by path: mean time per call in "
            "each,\nthe change and its share, and a verdict from both runs' spread and counts: "
            "slower,\nfaster, unchanged, too noisy, added, missing. Exit code 1 with "
            "--fail-above P when a\nstep is judged slower by more than P%."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cmp.add_argument("a", help="the baseline run (folder or file)")
    cmp.add_argument("b", help="the run compared with it")
    cmp.add_argument("--by", choices=("step", "layer"), default="step")
    cmp.add_argument("--unit", choices=("s", "ms", "us", "ns"))
    cmp.add_argument("--rank", type=int, help="compare one rank's own rows")
    cmp.add_argument(
        "--min-change", type=float, default=5.0, metavar="P", help="a change that counts, %%"
    )
    cmp.add_argument(
        "--fail-above", type=float, metavar="P", help="exit 1 if a step is slower by over P%%"
    )
    cmp.add_argument("--html", metavar="FILE", help="write both runs side by side to FILE")
