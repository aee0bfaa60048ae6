"""The study's command lines: ``python -m instrumented_convs demo|compare|bench`` and the
examples', which run the published study's model and loop with the instrumented layers in
place of its copied, timer-laden source (:func:`add_commands`, :func:`study_main`).
"""

from __future__ import annotations

import argparse
import logging
import sys
import textwrap
from types import SimpleNamespace
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from instrumented_convs.commands.errors import (
    PROG,
    HelpFormatter,
    Parser,
    call,
    described,
    error_note,
)

from .data import DatasetNotFound, MissingDependency
from .models import MODELS, require_torch_sparse
from .runner import report, run_study, write_json

__all__ = ["main", "add_study_arguments", "study_main"]

#: The study ran 100 epochs; demo and compare default to a few, enough for a first look.
DEMO_EPOCHS = 3
COMPARE_DATASETS = ("synthetic-arxiv", "ogbn-arxiv", "synthetic-cora", "cora")
DEMO_HELP = described(
    "Start here: the study's 3-layer GCN on a generated graph of ogbn-arxiv's shape, timed with\n"
    "PyG GCNConv and DGL GraphConv; each framework's tables, then both side by side.",
    f"{PROG} demo",
    f"{PROG} demo --quick",
    f"{PROG} demo --device cuda --epochs 10",
)
#: ``demo --help``'s text after the flags.
DEMO_MORE = (
    "The model: in -> 128 -> 128 -> classes, ReLU, log_softmax, Adam; the graph: 169,343 nodes,\n"
    f"128 features, 40 classes; {DEMO_EPOCHS} timed epochs per framework. It prints each "
    "framework's\naccuracy, epoch-phase table and per-step table, then one table of both "
    "frameworks' time per\nepoch aligned by role (normalisation, dense transform, sparse "
    "aggregation, ...).\nNeeds torch-geometric and dgl; torch-sparse only for --with-sparse.\n\n"
    + error_note()
)
COMPARE_HELP = described(
    "The study (as examples/arxiv.py runs it) with PyG and DGL on the same data: each\n"
    "framework's accuracy and tables, then both frameworks' time per epoch aligned by role.",
    f"{PROG} compare --epochs 100",
    f"{PROG} compare --model sage --brief --plot breakdown.png",
    f"{PROG} compare --dataset cora --root data --with-sparse",
)
#: ``bench --help``'s first lines (its examples name the defaults).
BENCH_HELP = described(
    "What instrumentation costs a training epoch here: stock layers against instrumented\n"
    "ones, the same 3-layer GCN and weights, side by side.",
    f"{PROG} bench",
    f"{PROG} bench --quick",
    f"{PROG} bench --shapes synthetic-arxiv synthetic-cora --device cuda",
)
#: ``bench --help``'s text after the flags: the variants and how they are timed.
BENCH_DEFAULTS = (
    "For each graph shape and input kind (PyG edge_index, PyG SparseTensor, DGL graph), five\n"
    "variants of the model:\n"
    "  stock        torch_geometric.nn.GCNConv / dgl.nn.GraphConv\n"
    "  enabled      instrumented_convs' layers, recording forward and backward, NVTX on\n"
    "  no backward  the same with backward timing off: the difference is backward's cost\n"
    "  disabled     instrumented_convs' layers inside configure(enabled=False)\n"
    "  stock again  a second stock copy: its ratio to stock is the noise floor (A/A)\n"
    "After warm-up, one training epoch of each is timed in turn, A B C D E E D C B A ..., so "
    "the\nmachine's drifts hit all alike; the table gives each variant's median epoch time, its\n"
    "interquartile range and the median of its per-round ratios to stock. On CUDA the epoch is\n"
    "timed with CUDA events around it. Default: Cora's shape (quick everywhere); add --shapes\n"
    "synthetic-arxiv synthetic-cora for the study's size too (minutes on a CPU).\n\n" + error_note()
)


# -- one run of the study ----------------------------------------------------------------------
def add_study_arguments(
    parser: argparse.ArgumentParser,
    datasets: Tuple[str, ...],
    default_dataset: str,
    epochs: int,
    sparse: bool = True,
) -> None:
    """Add the study's flags to an ``argparse`` parser (``--sparse`` too, with ``sparse``)."""
    parser.add_argument(
        "--platform",
        choices=("pyg", "dgl"),
        default="pyg",
        help="framework of the instrumented layers: PyTorch Geometric GCNConv or DGL GraphConv",
    )
    parser.add_argument(
        "--dataset",
        choices=datasets,
        default=default_dataset,
        help="the real dataset (needs its files under --root; no download here) or a "
        "generated graph of the same shape",
    )
    parser.add_argument(
        "--model",
        choices=tuple(MODELS),
        default="gcn",
        help="the 3-layer model: GCN (GCNConv / GraphConv) or GraphSAGE (SAGEConv, mean)",
    )
    parser.add_argument("--root", default="data", help="folder holding the real datasets' files")
    parser.add_argument("--hidden-channels", type=int, default=128, help="hidden layer width")
    parser.add_argument(
        "--epochs", type=int, default=epochs, help="timed training epochs (default: %(default)s)"
    )
    parser.add_argument(
        "--warmup", type=int, default=1, help="untimed epochs before the timed ones"
    )
    parser.add_argument("--lr", type=float, default=0.01, help="Adam learning rate")
    if sparse:
        parser.add_argument(
            "--sparse",
            action="store_true",
            help="PyG only: feed a torch_sparse.SparseTensor adj_t instead of edge_index "
            "(the study's T.ToSparseTensor() setup; fused message_and_aggregate; "
            "needs torch-sparse)",
        )
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the generated graph and of the model"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a tiny generated graph (1,000 nodes) and 3 epochs: a smoke run",
    )
    parser.add_argument(
        "--json", metavar="FILE", help="also write the summary and accuracies as JSON"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def study_main(
    description: str,
    datasets: Tuple[str, ...],
    default_dataset: str,
    argv: Optional[List[str]] = None,
    epochs: int = 100,
) -> int:
    """The whole command line of a study example: parse, run, print, optionally write JSON."""
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_study_arguments(parser, datasets, default_dataset, epochs=epochs)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        run = run_study(args)
    except (DatasetNotFound, MissingDependency) as exc:
        print(exc, file=sys.stderr)
        return 2
    print(report(run))
    if args.json:
        write_json(run, args.json)
    return 0


# -- python -m instrumented_convs ------------------------------------------------------------


def _compare(args: argparse.Namespace) -> int:
    """Run the study per framework, print each report (unless ``--brief``), then side by side."""
    from .compare import breakdown, side_by_side

    platforms = (
        [("pyg", False), ("pyg", True), ("dgl", False)]
        if args.with_sparse
        else [("pyg", False), ("dgl", False)]
    )
    try:
        if args.with_sparse:
            require_torch_sparse()  # say so before spending minutes on the other runs
        if args.epochs != 100 and not args.quick and not getattr(args, "demo", False):
            print(
                f"Running {args.epochs} timed epochs per framework (the published study ran 100; "
                "pass --epochs 100 for the full run)."
            )
        runs = []
        for platform, sparse in platforms:
            ns = SimpleNamespace(**vars(args))
            ns.platform, ns.sparse = platform, sparse
            run = run_study(ns)
            if not args.brief:
                print(report(run))
                print()
            label = (
                "PyG (SparseTensor)"
                if sparse
                else {"pyg": "PyG (edge_index)", "dgl": "DGL"}[platform]
            )
            runs.append(breakdown(run.summary, platform, label, model=args.model))
        print(side_by_side(runs))
        for b in runs:
            print(f"{b.label}: {b.epoch_ms:.2f} ms per epoch")
        if args.plot:
            from .plot import plot

            plot(runs, args.plot)
            print(f"plot written to {args.plot}")
    except (DatasetNotFound, MissingDependency) as exc:
        print(exc, file=sys.stderr)
        return 2
    return 0


def _demo(args: argparse.Namespace) -> int:
    """``compare`` with the study's defaults, an introduction and what to run next."""
    defaults = argparse.ArgumentParser()
    add_study_arguments(defaults, COMPARE_DATASETS, "synthetic-arxiv", epochs=DEMO_EPOCHS)
    ns = defaults.parse_args([])
    for key, value in vars(args).items():
        setattr(ns, key, value)
    ns.brief, ns.demo = False, True
    if ns.with_sparse:
        try:
            require_torch_sparse()
        except MissingDependency as exc:
            print(exc, file=sys.stderr)
            return 2
    shape = (
        "a 1,000-node generated graph (--quick)"
        if ns.quick
        else "a generated graph of ogbn-arxiv's shape"
    )
    epochs = min(ns.epochs, 3) if ns.quick else ns.epochs
    layers = "PyG GCNConv (edge_index" + (
        " and SparseTensor input)" if ns.with_sparse else " input)"
    )
    print(
        _wrap(
            f"The study's 3-layer GCN (in -> 128 -> 128 -> classes) on {shape}, {epochs} timed "
            f"epochs "
            f"(the published study ran 100) with the instrumented {layers} and DGL GraphConv."
        )
        + "\n"
    )
    rc = _compare(ns)
    if rc == 0:
        print(
            "\nNext:\n"
            f"  {PROG} compare --help   every flag: epochs, dataset, width, device, --plot\n"
            f"  {PROG} bench            what the instrumentation costs on this machine"
        )
    return rc


def _bench(args: argparse.Namespace) -> int:
    """Time stock vs instrumented epochs and say how to read the ratios."""
    from .bench import run_bench

    run_bench(args)
    print(
        _wrap(
            "Ratios are medians of per-round ratios to stock. enabled/stock is what recording "
            "costs, "
            "disabled/stock what the instrumented layers cost when switched off; again/stock "
            "compares "
            "two identical stock models, so it is the noise floor: a ratio no further from 1 than "
            "again/stock is not a measurable cost."
        )
    )
    return 0


def _wrap(text: str) -> str:
    return textwrap.fill(text, width=100)


DESCRIPTION = (
    "instrumented_convs: where the time goes inside graph convolution layers.\n\n"
    "The study is a published profiling of a 3-layer GCN on ogbn-arxiv and Cora with PyG and "
    "DGL,\nwhich timed the layers' internal steps by copying the layers' source and inserting "
    "timers;\nthese commands run it with the instrumented layers instead. Start with: "
    + PROG
    + " demo"
)


def add_commands(sub: Any) -> Dict[str, Callable[[argparse.Namespace], int]]:
    """Add ``demo``, ``compare`` and ``bench`` to the subparsers ``sub``; returns what runs
    each (the package's command line, ``instrumented_convs.commands.cli``, adds its others).

    - ``demo``: the first thing to run. The 3-layer GCN on a generated graph of ogbn-arxiv's
      shape for PyG and DGL, a few epochs each; prints each framework's tables and both side by
      side. Needs PyG and DGL, not torch-sparse.
    - ``compare``: the same with every flag of the study (dataset, epochs, width, device,
      plot...).
    - ``bench``: what the instrumentation costs on this machine (stock vs instrumented layers).

    :func:`study_main` is the whole command line of ``examples/arxiv.py`` and
    ``examples/cora.py``; :func:`run_study` is one run of the study from such a command line
    (the arguments, the run, its report), once per framework in ``demo`` and ``compare``.
    """
    from .bench import add_bench_arguments

    demo = sub.add_parser(
        "demo",
        formatter_class=HelpFormatter,
        usage=f"{PROG} demo [options]",
        help="start here: the 3-layer GCN study for PyG and DGL, tables and side by side",
        description=DEMO_HELP,
        epilog=DEMO_MORE,
    )
    demo.add_argument(
        "--epochs",
        type=int,
        default=DEMO_EPOCHS,
        help="timed epochs per framework (default: %(default)s)",
    )
    demo.add_argument("--device", default="cpu", help="cpu or cuda")
    demo.add_argument(
        "--with-sparse",
        action="store_true",
        help="also run PyG with SparseTensor input (needs torch-sparse)",
    )
    demo.add_argument(
        "--plot",
        metavar="FILE.png",
        help="write a stacked bar chart of the breakdown (needs matplotlib)",
    )
    demo.add_argument(
        "--quick", action="store_true", help="a tiny generated graph and 3 epochs: a smoke run"
    )
    demo.add_argument("--no-progress", action="store_true", help="no progress bars")
    cmp = sub.add_parser(
        "compare",
        formatter_class=HelpFormatter,
        usage=f"{PROG} compare [options]",
        help="the study for PyG and DGL side by side, with every flag "
        "(dataset, epochs, device, plot)",
        description=COMPARE_HELP,
        epilog=error_note(),
    )
    add_study_arguments(cmp, COMPARE_DATASETS, "synthetic-arxiv", DEMO_EPOCHS, sparse=False)
    cmp.add_argument(
        "--plot",
        metavar="FILE.png",
        help="write a stacked bar chart of the breakdown (needs matplotlib)",
    )
    cmp.add_argument(
        "--with-sparse",
        action="store_true",
        help="also run PyG with SparseTensor input (needs torch-sparse)",
    )
    cmp.add_argument(  # its older name, kept for the scripts that use it
        "--sparse", dest="with_sparse", action="store_true", help=argparse.SUPPRESS
    )
    cmp.add_argument("--brief", action="store_true", help="print only the side-by-side table")
    bench = sub.add_parser(
        "bench",
        formatter_class=HelpFormatter,
        usage=f"{PROG} bench [options]",
        help="what the instrumentation costs on this machine: stock vs instrumented epochs",
        description=BENCH_HELP,
        epilog=BENCH_DEFAULTS,
    )
    add_bench_arguments(bench, default_shapes=("synthetic-cora",))
    return {"demo": _demo, "compare": _compare, "bench": _bench}


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The study's commands alone (``demo``, ``compare``, ``bench``): parse and dispatch."""
    parser = Parser(prog=PROG, formatter_class=HelpFormatter, description=DESCRIPTION)
    commands = add_commands(parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    return call(args.command, commands[args.command], args)
