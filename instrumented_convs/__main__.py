"""``python -m instrumented_convs compare``: the seeds' study for PyG and DGL, side by side.

Runs the arxiv study (examples/arxiv.py) with the instrumented PyG GCNConv and DGL
GraphConv on the same data, prints each framework's accuracy and tables, then one table of
both frameworks' time per epoch aligned by role (normalisation, dense transform, sparse
aggregation, bias, ...), and with ``--plot FILE.png`` a stacked bar chart of it.
"""
from __future__ import annotations

import argparse
import logging
import sys
from types import SimpleNamespace
from typing import List, Optional

from .compare import breakdown, plot, side_by_side
from .study import DatasetNotFound, add_study_arguments, report, run_study

#: The study ran 100 epochs; the demo's default is short enough for a first look.
DEMO_EPOCHS = 3


def _compare(args: argparse.Namespace) -> int:
    runs = []
    platforms = [("pyg", False), ("dgl", False)]
    if args.with_sparse:
        platforms.insert(1, ("pyg", True))
    if args.epochs != 100 and not args.quick:
        print(f"Running {args.epochs} timed epochs per framework (the seeds' study ran 100; "
              f"pass --epochs 100 for the full run).")
    for platform, sparse in platforms:
        ns = SimpleNamespace(**vars(args))
        ns.platform, ns.sparse = platform, sparse
        try:
            run = run_study(ns)
        except DatasetNotFound as exc:
            print(exc, file=sys.stderr)
            return 2
        if not args.brief:
            print(report(run))
            print()
        label = "PyG (SparseTensor)" if sparse else {"pyg": "PyG (edge_index)", "dgl": "DGL"}[platform]
        runs.append(breakdown(run.summary, platform, label))
    print(side_by_side(runs))
    for b in runs:
        print(f"{b.label}: {b.epoch_ms:.2f} ms per epoch")
    if args.plot:
        plot(runs, args.plot)
        print(f"plot written to {args.plot}")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    """The command line: ``python -m instrumented_convs compare [flags]``."""
    parser = argparse.ArgumentParser(prog="python -m instrumented_convs", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    cmp = sub.add_parser("compare", help="run the arxiv study for PyG and DGL and compare them",
                         description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_study_arguments(cmp, ("synthetic-arxiv", "ogbn-arxiv", "synthetic-cora", "cora"), "synthetic-arxiv",
                        epochs=DEMO_EPOCHS)
    cmp.add_argument("--plot", metavar="FILE.png", help="write a stacked bar chart of the breakdown")
    cmp.add_argument("--with-sparse", action="store_true", help="also run PyG with SparseTensor input")
    cmp.add_argument("--brief", action="store_true", help="print only the side-by-side table")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.command == "compare":
        return _compare(args)
    return 2  # pragma: no cover - argparse rejects unknown commands


if __name__ == "__main__":
    sys.exit(main())
