"""The command lines of ``run``, ``view``, ``merge`` and ``diff``: one argparse builder per
command, apart from what the commands do (:mod:`.cli`), so that each reads on its own.
"""

from __future__ import annotations

import argparse
from typing import Any, List, Optional

from ...report import RENDERERS
from ..errors import PROG, HelpFormatter, described, error_note
from .hooks import BACKWARD, DATA, FORWARD, NO_GRAD, OPTIMIZER
from .peaks import add_peak_options
from .runs import TRACE_LIMIT

__all__ = [
    "PROG",
    "RUN_DESCRIPTION",
    "RUN_HELP",
    "add_run_parser",
    "add_capture_parser",
    "add_view_parser",
    "add_merge_parser",
    "add_diff_parser",
    "names",
    "printable",
]

#: ``run --help``'s first lines: what it does, then examples.
RUN_DESCRIPTION = described(
    "Runs a training script unmodified, as python would, with every PyG and DGL conv layer it\n"
    "builds instrumented and its loop's phases timed; prints the table and saves the run.",
    f"{PROG} run train.py --epochs 50",
    f"{PROG} run --warmup 5 --record-every 10 train.py --epochs 5000",
    f"{PROG} run --on-demand -o runs/long train.py   # then: {PROG} capture runs/long",
    f"{PROG} view ic-runs/train-20261125-101500 --by layer",
)
#: ``run --help``'s text after the flags: what it records and saves, at length.
RUN_HELP = f"""\
What it times: every conv layer the script builds (torch_geometric.nn, dgl.nn, PyG's own
models), and the loop's phases without user code: {FORWARD!r} (the outermost module call
with grad enabled), {NO_GRAD!r} (evaluation), {BACKWARD!r}, {OPTIMIZER!r} and
{DATA!r} (a loader's next batch; its worker processes too: view RUN --workers).

What it saves, at exit (normal, exception, Ctrl-C, sys.exit), in -o DIR or
ic-runs/<script>-<time>: run.json (summary, statistics, command, versions, device, settings),
summary.txt, page.html (works offline) and trace.json.gz (a Chrome trace for ui.perfetto.dev).

--record-every K records one iteration in K and runs the stock code in the others (--budget
0.01: K chosen to add under 1%); the table is scaled to the whole run (rows marked ~).
--on-demand records nothing until `capture RUN` (or `capture PID`) asks for the next N
iterations: each capture is a run folder of its own in the run's, capture-1, capture-2... A
torch.compile'd model is a step of its own, "compiled NAME"; --eager-breakdown gives its steps.
Under torchrun each rank saves rank<N>.json and rank 0 merges them (where a rank did not
finish: merge DIR). The exit code is the script's.

{error_note()}"""


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
        formatter_class=HelpFormatter,
        help="profile a training script without changing it; saves the run",
        description=RUN_DESCRIPTION,
        epilog=RUN_HELP,
        usage=f"{PROG} run [options] (script.py | -m module) [args ...]",
    )
    run.add_argument("-m", dest="module", action="store_true", help="run a module, as python -m")
    run.add_argument(
        "-o", "--output", metavar="DIR", help="the run folder (default: ic-runs/<script>-<time>)"
    )
    run.add_argument(
        "--only", metavar="A,B", help="instrument these conv classes only (GCNConv,SAGEConv)"
    )
    run.add_argument("--exclude", metavar="A,B", help="leave these conv classes stock")
    run.add_argument(
        "--warmup", type=int, default=0, metavar="N", help="drop the first N optimizer steps"
    )
    _add_table_options(run)
    run.add_argument("--no-backward", action="store_true", help="do not time backward steps")
    run.add_argument("--backward-every", type=int, metavar="N", help="time one layer backward in N")
    run.add_argument(
        "--record",
        choices=("all", "ranges", "on-demand"),
        help="ranges: under nsys profile, push every call's NVTX range and record nothing "
        "else; view the report for the table (docs/nsys.md); on-demand: as --on-demand. "
        "Default: all, or what INSTRUMENTED_CONVS_RECORD says",
    )
    run.add_argument(
        "--on-demand",
        action="store_true",
        help="record nothing until `capture RUN` asks for the next N iterations, then write "
        "them as a folder in the run's (the stock code runs between captures)",
    )
    _add_cycle_options(run)
    _add_output_options(run)
    run.add_argument("target", help="the script (or, with -m, the module)")
    run.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")


def _add_table_options(parser: argparse.ArgumentParser) -> None:
    """``--by`` and ``--unit``: the table's rows and its time unit."""
    parser.add_argument(
        "--by",
        choices=("step", "layer", "relation"),
        default="step",
        help="a row per step path, per step and layer, or per step and relation of a "
        "heterogeneous model (its layers added together)",
    )
    parser.add_argument(
        "--unit",
        choices=("s", "ms", "us", "ns"),
        help="the table's time unit (default: chosen from the times)",
    )


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
        help="with --record-every/--budget/--on-demand: an iteration is a call of the "
        "script's region(NAME), not an optimizer step",
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
        "--advise",
        action="store_true",
        help="note what the advice reads (each layer's graph across calls); print what to "
        "change after the table, and write advice.json (docs/advice.md; --format advice)",
    )
    run.add_argument(
        "--advise-seconds",
        type=float,
        default=None,
        metavar="S",
        help="with --advise: time the changes that replace work on the layers' own last "
        "inputs at the end, in S seconds at most (default: a tenth of the run, 60 at most; "
        "0: none)",
    )
    run.add_argument(
        "--advise-compile",
        action="store_true",
        help="with --advise: time each layer compiled by torch.compile too (compiling takes "
        "seconds a layer: give --advise-seconds)",
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
        "--autosave",
        type=float,
        default=None,
        metavar="S",
        help="rewrite the run's run.json every S seconds while the job runs, so that a job "
        "killed outright loses at most S seconds of it (default 60; 0: only at the end)",
    )
    run.add_argument(
        "--merge-timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="torchrun: how long rank 0 waits for the other ranks' files (default %(default)s; "
        "after SIGTERM 10 at most, so that the job's save fits a 30-second grace period)",
    )


def add_capture_parser(sub: Any) -> None:
    """``capture``: the job, how many iterations, how long to wait."""
    cap = sub.add_parser(
        "capture",
        formatter_class=HelpFormatter,
        help="record the next iterations of a job started on demand, while it runs",
        usage=f"{PROG} capture TARGET [--iterations N] [--timeout S]",
        description=described(
            "Asks a running job started on demand (run --on-demand, configure(record=\n"
            "'on-demand')) to record its next N iterations, waits until it has written them\n"
            "as a run folder inside its own, and prints that folder's path. The job goes on,\n"
            "recording nothing again; under torchrun every rank records the same iterations\n"
            "and rank 0 writes the merged folder.",
            f"{PROG} capture ic-runs/train-20261201-101500",
            f"{PROG} capture 12345 --iterations 50    # a pid: a rank's, or torchrun's",
            f"{PROG} diff $({PROG} capture RUN) $({PROG} capture RUN)",
        ),
        epilog="Exit code 0 once every iteration asked is written; 1 when the job could not\n"
        "take the capture (one is under way: it says so), or ended first (its folder holds\n"
        "what was recorded); 130 on Ctrl-C, which cancels the capture.\n\n" + error_note(),
    )
    cap.add_argument(
        "target",
        metavar="TARGET",
        help="the job's run folder (where it listens), or a pid of it",
    )
    cap.add_argument(
        "--iterations",
        type=int,
        default=20,
        metavar="N",
        help="how many iterations to record (an optimizer step to the next, or calls of the "
        "job's --iteration region)",
    )
    cap.add_argument(
        "--timeout",
        type=float,
        metavar="S",
        help="give up waiting after S seconds (the job goes on and writes the capture)",
    )


def add_advise_parser(sub: Any) -> None:
    """``advise``: what to change in a saved run."""
    advise = sub.add_parser(
        "advise",
        formatter_class=HelpFormatter,
        help="print what to change in a saved run (docs/advice.md)",
        usage=f"{PROG} advise RUN [--json]",
        description=described(
            "Prints what to change in a saved run, the largest time at stake first, read "
            "from its record (the layers' rules from a run made with run --advise).",
            f"{PROG} advise ic-runs/train-20261125-101500",
            f"{PROG} advise ic-runs/train-20261125-101500 --json",
        ),
        epilog=error_note(),
    )
    advise.add_argument("run", metavar="RUN", help="a run folder, or its run.json")
    advise.add_argument("--json", action="store_true", help='the items as JSON ({"advice": [...]})')


def add_view_parser(sub: Any) -> None:
    """``view``: which rows of a saved run, and in which format."""
    view = sub.add_parser(
        "view",
        formatter_class=HelpFormatter,
        help="print the table of a saved run",
        usage=f"{PROG} view RUN [options]",
        description=described(
            "Prints a saved run's table (or another format), summarised again as asked.",
            f"{PROG} view ic-runs/train-20261125-101500",
            f"{PROG} view ic-runs/train-20261125-101500 --by layer --unit ms",
            f"{PROG} view ic-runs/train-20261125-101500 --prefix forward/conv1 --format csv",
            f"{PROG} view report.nsys-rep --warmup 1   # an Nsight Systems report (docs/nsys.md)",
        ),
        epilog=error_note(),
    )
    view.add_argument(
        "run",
        metavar="RUN",
        help="a run folder, its run.json / rank<N>.json, or an Nsight Systems report "
        "(.sqlite, or .nsys-rep where nsys is installed)",
    )
    view.add_argument(
        "more",
        nargs="*",
        metavar="REPORT",
        help="more Nsight Systems reports (one per rank, say): merged with RUN as ranks are",
    )
    _add_table_options(view)
    view.add_argument("--rank", type=int, help="one rank's own table (a run under torchrun)")
    view.add_argument("--prefix", help="only the rows under this step path (forward/conv1)")
    view.add_argument("--depth", type=int, help="only rows down to this depth (0: top level)")
    view.add_argument(
        "--phase", choices=("forward", "backward"), help="only the rows of this phase"
    )
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
    view.add_argument(
        "--warmup",
        type=int,
        default=0,
        metavar="N",
        help="a report: drop each process's first N iterations (its outermost steps)",
    )
    view.add_argument(
        "--save",
        metavar="FOLDER",
        help="a report: write it as a run folder (run.json, page.html, trace.json.gz) for diff",
    )
    add_peak_options(view)


def add_merge_parser(sub: Any) -> None:
    """``merge``: a folder's rank files, and how long to wait for them."""
    merge = sub.add_parser(
        "merge",
        formatter_class=HelpFormatter,
        help="merge a torchrun run's rank files into its run.json",
        usage=f"{PROG} merge FOLDER [--wait S]",
        description=described(
            "Merges the rank<N>.json files of a torchrun run's folder into its run.json, and\n"
            "prints the table: for a run where a rank did not reach the end.",
            f"{PROG} merge ic-runs/train-20261125-101500",
            f"{PROG} merge ic-runs/train-20261125-101500 --wait 30",
        ),
        epilog=error_note(),
    )
    merge.add_argument("folder", metavar="FOLDER", help="the run folder holding rank<N>.json")
    merge.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="S",
        help="wait up to S seconds for the missing ranks' files",
    )


def add_diff_parser(sub: Any) -> None:
    """``diff``: two runs, what counts as a change, and when to fail."""
    cmp = sub.add_parser(
        "diff",
        formatter_class=HelpFormatter,
        help="two saved runs side by side: the change per step and whether it is real",
        usage=f"{PROG} diff A B [options]",
        description=described(
            "Pairs the steps of run A (the baseline) and run B by path: time per call in each,\n"
            "the change, and a verdict from both runs' spread and counts.",
            f"{PROG} diff ic-runs/before ic-runs/after",
            f"{PROG} diff ic-runs/before ic-runs/after --by layer --html diff.html",
            f"{PROG} diff ic-runs/before ic-runs/after --fail-above 10   (CI: exit code 1)",
        ),
        epilog="Verdicts: slower, faster, unchanged, too noisy, added, missing. Exit code 1 "
        "with --fail-above P\nwhen a step is judged slower by more than P%.\n\n" + error_note(),
    )
    cmp.add_argument("a", metavar="A", help="the baseline run (folder or file)")
    cmp.add_argument("b", metavar="B", help="the run compared with it")
    _add_table_options(cmp)
    cmp.add_argument("--rank", type=int, help="compare one rank's own rows")
    cmp.add_argument(
        "--min-change",
        type=float,
        default=5.0,
        metavar="P",
        help="the smallest change in percent that counts as slower or faster",
    )
    cmp.add_argument(
        "--fail-above", type=float, metavar="P", help="exit 1 if a step is slower by over P%%"
    )
    cmp.add_argument("--html", metavar="FILE", help="write both runs side by side to FILE")
