"""``run``, ``view``, ``merge``, ``diff``: profile an unmodified script; read and compare runs."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from ... import configure, registry
from ...report import RENDERERS, Peak, Run, render, workers_text
from .hooks import BACKWARD, DATA, FORWARD, NO_GRAD, OPTIMIZER, Hooks
from .peaks import add_peak_options, run_peak, view_peak
from .runs import (
    TRACE_LIMIT,
    default_folder,
    job_rank,
    load,
    merge_folder,
    outputs_of,
    run_meta,
    summary_of,
    trace_of,
    write_run,
    write_timeline,
)
from .script import run_target

__all__ = ["add_commands", "run_main", "view_main", "merge_main", "diff_main"]

logger = logging.getLogger(__name__)

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
sys.exit) prints the table and saves the run in a folder (-o, or ic-runs/<script>-<time>):
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


def _names(text: Optional[str]) -> Optional[List[str]]:
    return None if text is None else [n.strip() for n in text.split(",") if n.strip()]


def add_commands(sub: Any) -> Dict[str, Callable[[argparse.Namespace], int]]:
    """Add ``run``, ``view`` and ``merge`` to the subparsers ``sub``; returns their mains."""
    raw = argparse.RawDescriptionHelpFormatter
    run = sub.add_parser(
        "run",
        formatter_class=raw,
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
    run.add_argument(
        "--trace-limit",
        type=int,
        default=TRACE_LIMIT,
        metavar="N",
        help="the timeline keeps the first N calls after the warm-up (0: no timeline; "
        "default %(default)s, about 40 MB of memory)",
    )
    run.add_argument(
        "--counters",
        action="store_true",
        help="count each step's FLOPs and bytes; print the roofline table (a debugging mode)",
    )
    add_peak_options(run)
    run.add_argument(
        "--memory",
        action="store_true",
        help="record what each step keeps for backward and its peak; print the memory table "
        "(a debugging mode: docs/memory.md)",
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
    run.add_argument("target", help="the script (or, with -m, the module)")
    run.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")

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
        choices=[n for n in RENDERERS if n != "trace"],
        default="text",
        help="print the run in this format (text, page, json, csv, roofline: see --counters, "
        "memory: see --memory)",
    )
    view.add_argument("--json", action="store_true", help="the summary as JSON (--format json)")
    view.add_argument(
        "--trace", metavar="FILE", help="write the run's timeline to FILE (Chrome trace; .gz)"
    )
    view.add_argument("--html", metavar="FILE", help="write the run's page to FILE")
    view.add_argument("--counters", action="store_true", help="the counters' roofline table")
    view.add_argument(
        "--memory", action="store_true", help="the memory table (a run with run --memory)"
    )
    view.add_argument(
        "--workers",
        action="store_true",
        help="the data loaders: the split of an iteration, its verdict, each worker's table",
    )
    view.add_argument(
        "--times", metavar="RUN", help="with --counters: times from RUN, a run without them"
    )
    add_peak_options(view)

    merge = sub.add_parser(
        "merge",
        help="merge a torchrun run's rank files into its run.json",
        description="Merges the rank<N>.json files of a run folder into run.json and prints it.",
    )
    merge.add_argument("folder")
    merge.add_argument(
        "--wait", type=float, default=0.0, metavar="S", help="wait for missing ranks' files"
    )
    cmp = sub.add_parser(
        "diff",
        help="two saved runs side by side: the change per step and whether it is real",
        description=(
            "Pairs the steps of run A (the baseline) and run B by path: mean time per call in "
            "each,\nthe change and its share, and a verdict from both runs' spread and counts: "
            "slower,\nfaster, unchanged, too noisy, added, missing. Exit code 1 with "
            "--fail-above P when a\nstep is judged slower by more than P%."
        ),
        formatter_class=raw,
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
    return {"run": run_main, "view": view_main, "merge": merge_main, "diff": diff_main}


def run_main(args: argparse.Namespace) -> int:
    """``run``: the script under the hooks, then the table and the run folder."""
    started = time.time()
    if args.backward_every is not None and args.backward_every < 1:
        raise SystemExit("run: --backward-every takes a positive number")
    if args.trace_limit < 0:
        raise SystemExit("run: --trace-limit takes a number >= 0")
    if args.record_every is not None and args.record_every < 1:
        raise SystemExit("run: --record-every takes a positive number")
    if args.budget is not None and not 0 < args.budget < 1:
        raise SystemExit("run: --budget takes a fraction between 0 and 1 (0.01: 1%)")
    if args.iteration is not None and args.record_every is None and args.budget is None:
        raise SystemExit("run: --iteration names what --record-every or --budget draws")
    configure(
        backward=False if args.no_backward else None,
        backward_every=args.backward_every,
        timeline=args.trace_limit,
        counters=True if args.counters else None,
        memory=True if args.memory else None,
    )
    writer = _tensorboard(args.tensorboard) if args.tensorboard else None
    hooks = Hooks(_names(args.only), _names(args.exclude) or (), args.warmup)
    if writer is not None:  # a point an epoch, numbered from 1
        hooks.epoch = lambda: registry.summary().to_tensorboard(writer, step=hooks.epochs)
    hooks.install()
    if args.record_every is not None or args.budget is not None:  # its hooks after run's
        configure(record_every=args.record_every, budget=args.budget, iteration=args.iteration)
    if args.eager_breakdown:
        configure(compiled="eager")
    try:
        outcome = run_target(args.target, list(args.args), module=args.module)
    finally:
        hooks.close()
        hooks.remove()
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
    folder = Path(args.output) if args.output else default_folder(args.target, started)
    rank, world = job_rank()
    if args.trace_limit:
        name = f"rank {rank}" if world is not None else f"{Path(args.target).name} ({os.getpid()})"
        timeline = registry.timeline()
        meta["trace"] = write_timeline(folder, timeline, name, workers=meta.get("workers"))
        if timeline.truncated:
            logger.warning(
                "run: the timeline kept its first %d calls (--trace-limit); later calls are "
                "in the table but not on the timeline",
                args.trace_limit,
            )
    write_run(folder, registry.snapshot(), meta, by=args.by, unit=args.unit)
    if writer is not None:
        writer.add_text("instrumented_convs/run folder", str(folder.resolve()))
        writer.close()
    if world is None:
        summary = summary_of(load(folder), by=args.by, unit=args.unit)
    elif rank == 0:
        merged = merge_folder(folder, wait=args.merge_timeout)
        if merged["ranks_missing"]:
            logger.warning(
                "run: no file from ranks %s: merged without them", merged["ranks_missing"]
            )
        summary = summary_of(merged, by=args.by, unit=args.unit)
    else:
        return outcome.code
    if not args.quiet:
        ended = "" if outcome.how == "returned" else f", exit code {outcome.code}"
        title = f"instrumented_convs run: {args.target}{ended}"
        print(render("text", Run(summary, options={"title": title})))
        workers = load(folder).get("workers") if world is None else merged.get("workers")
        if workers:
            print(workers_text(workers, by=args.by, unit=args.unit, summary=summary))
        if args.counters:
            print(render("roofline", Run(summary, peak=Peak(**meta["peak"]))))
        if args.memory:
            print(render("memory", Run(summary)))
    logger.info("run: saved in %s (exit code %d)", folder, outcome.code)
    return outcome.code


def _tensorboard(folder: str) -> Any:
    """A TensorBoard ``SummaryWriter`` on ``folder`` (``rank<N>`` in it under torchrun)."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as e:
        raise SystemExit(
            f"run: --tensorboard needs TensorBoard ({e}): "
            "pip install 'instrumented_convs[tensorboard]'"
        ) from None
    rank, world = job_rank()
    return SummaryWriter(str(Path(folder) / f"rank{rank}") if world is not None else folder)


def view_main(args: argparse.Namespace) -> int:
    """``view``: a saved run's table, summarised again as asked."""
    if args.trace:
        try:
            trace = trace_of(args.run)
        except FileNotFoundError as exc:
            logger.error("view: %s", exc)
            return 1
        written = RENDERERS["trace"].write(Run(timeline=trace), args.trace)
        print(f"timeline written to {written}")
        return 0
    run = load(args.run)
    if args.workers:
        if not run.get("workers"):
            logger.error("view: %s recorded no data loader", args.run)
            return 1
        mine = summary_of(run, by=args.by, unit=args.unit)
        print(workers_text(run["workers"], by=args.by, unit=args.unit, each=True, summary=mine))
        return 0
    summary = summary_of(run, by=args.by, unit=args.unit, rank=args.rank)
    if args.prefix or args.depth is not None or args.phase:
        summary = summary.select(args.prefix, args.depth, args.phase)
    outputs = outputs_of(run, summary)
    if args.html:
        RENDERERS["page"].write(outputs, args.html)
        print(f"page written to {args.html}")
        return 0
    name = (
        "roofline"
        if args.counters
        else "memory"
        if args.memory
        else "json"
        if args.json
        else args.format
    )
    if name == "roofline":
        outputs.peak = view_peak(args, run)
        outputs.times = summary_of(load(args.times), by=args.by) if args.times else None
    print(render(name, outputs))
    return 0


def diff_main(args: argparse.Namespace) -> int:
    """``diff``: two saved runs side by side; exit code 1 past ``--fail-above``."""
    a, b = (
        summary_of(load(path), by=args.by, unit=args.unit, rank=args.rank)
        for path in (args.a, args.b)
    )
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
    merged = merge_folder(args.folder, wait=args.wait)
    if merged["ranks_missing"]:
        logger.warning("merge: no file from ranks %s: merged without them", merged["ranks_missing"])
    print(summary_of(merged, by=merged.get("by") or "step", unit=merged.get("unit")))
    return 0
