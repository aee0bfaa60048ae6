"""The command line of the mini-batch examples: ``examples/minibatch.py`` and ``examples/ddp.py``.

:func:`add_minibatch_arguments` adds their flags, :func:`run_minibatch` generates the graph
(a shape of :data:`~.data.SHAPES`, ogbn-products' by default, shrunk by ``--scale``), builds
the model and loaders (:mod:`.minibatch`) and trains with a progress bar;
:func:`minibatch_main` is the whole of ``examples/minibatch.py``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import List, Optional, Tuple

from instrumented_convs import registry
from instrumented_convs.report import Summary

from .data import SHAPES, GraphData, MissingDependency, scaled_shape, synthetic_graph
from .minibatch import (
    BATCH_SIZE,
    FANOUTS,
    MiniBatchResult,
    MiniBatchSetup,
    describe,
    setup,
    train_minibatch,
)
from .models import MODELS
from .runner import progress_bar

__all__ = [
    "QUICK_SCALE",
    "parse_fanouts",
    "add_minibatch_arguments",
    "load_scaled",
    "run_minibatch",
    "epoch_line",
    "minibatch_main",
]

log = logging.getLogger(__name__)

#: ``--quick``: ogbn-products' shape at this scale (2,449 nodes), 2 epochs of batches of 64.
QUICK_SCALE = 0.001


def parse_fanouts(text: str) -> Tuple[int, ...]:
    """``"15,10,5"`` -> ``(15, 10, 5)`` (an ``argparse`` type; ``-1``: every neighbour)."""
    try:
        fanouts = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"fanouts are comma-separated integers, not {text!r}"
        ) from None
    if not fanouts or any(f == 0 or f < -1 for f in fanouts):
        raise argparse.ArgumentTypeError(f"each fanout is a positive integer or -1, not {text!r}")
    return fanouts


def add_minibatch_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the mini-batch examples' flags to an ``argparse`` parser."""
    parser.add_argument(
        "--platform",
        choices=("pyg", "dgl"),
        default="pyg",
        help="PyG (NeighborLoader, GCNConv) or DGL (DataLoader + NeighborSampler, GraphConv)",
    )
    parser.add_argument(
        "--dataset",
        choices=sorted(SHAPES),
        default="synthetic-products",
        help="the generated graph's shape (default: ogbn-products', 2,449,029 nodes)",
    )
    parser.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="shrink the graph: nodes, edges and split times this (e.g. 0.01; the mean "
        "degree stays)",
    )
    parser.add_argument("--model", choices=tuple(MODELS), default="gcn", help="the 3-layer model")
    parser.add_argument("--epochs", type=int, default=3, help="timed epochs (default: %(default)s)")
    parser.add_argument(
        "--warmup", type=int, default=3, help="untimed batches before the timed epochs"
    )
    parser.add_argument(
        "--batch-size", type=int, default=BATCH_SIZE, help="seed nodes per mini-batch"
    )
    parser.add_argument(
        "--fanouts",
        type=parse_fanouts,
        default=FANOUTS,
        metavar="15,10,5",
        help="neighbours sampled per hop, from the seed nodes outward (one per layer; "
        "default: %(metavar)s)",
    )
    parser.add_argument("--hidden-channels", type=int, default=128, help="hidden layer width")
    parser.add_argument("--lr", type=float, default=0.01, help="Adam learning rate")
    parser.add_argument(
        "--eval-nodes",
        type=int,
        default=20_000,
        help="test nodes to evaluate after training (0: all)",
    )
    parser.add_argument(
        "--num-workers",
        type=int,
        default=0,
        help="loader worker processes (default 0: sample in the training process; with "
        "workers, sample is how long training waits for the next batch)",
    )
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the generated graph, model and sampling"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"a smoke run: scale {QUICK_SCALE}, 2 epochs of batches of 64",
    )
    parser.add_argument(
        "--json",
        metavar="FILE",
        help="also write the summary as JSON (minibatch.py: with the run's settings and results)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def _apply_quick(args: argparse.Namespace) -> None:
    if args.quick:
        args.scale = min(args.scale, QUICK_SCALE)
        args.epochs, args.batch_size = min(args.epochs, 2), min(args.batch_size, 64)
        args.warmup, args.eval_nodes = min(args.warmup, 1), min(args.eval_nodes or 500, 500)


def load_scaled(name: str, scale: float, seed: int = 0) -> GraphData:
    """The generated graph of shape ``name`` scaled by ``scale`` (deterministic given ``seed``)."""
    shape = scaled_shape(name, scale)
    label = name if scale == 1 else f"{name} x{scale:g}"
    log.info(
        "generating %s: %s nodes, %s edges",
        label,
        f"{shape['num_nodes']:,}",
        f"{shape['num_edges']:,}",
    )
    return synthetic_graph(label, seed=seed, **shape)


def run_minibatch(args: argparse.Namespace) -> Tuple[MiniBatchSetup, MiniBatchResult]:
    """Generate the graph, build model and loaders, reset the registry, train with progress."""
    _apply_quick(args)
    if args.platform == "pyg":
        from .sharding import require_pyg_sampler

        require_pyg_sampler()  # before minutes of generating
    data = load_scaled(args.dataset, args.scale, args.seed)
    s = setup(
        args.platform,
        data,
        args.fanouts,
        args.batch_size,
        args.hidden_channels,
        args.device,
        args.model,
        args.seed,
        args.num_workers,
    )
    per_rank = -(-len(data.train_idx) // s.world)
    batches = -(-per_rank // s.batch_size)
    show = not args.no_progress and s.rank == 0
    progress = (
        progress_bar(args.epochs * batches, f"{args.platform} mini-batches", unit="batch")
        if show
        else None
    )

    def on_batch() -> None:
        if progress is not None:
            progress.update(1)

    def on_epoch(epoch: int, loss: float) -> None:
        if progress is not None:
            progress.set_postfix(loss=f"{loss:.4f}")

    registry.reset()
    try:
        result = train_minibatch(
            s,
            epochs=args.epochs,
            lr=args.lr,
            warmup=args.warmup,
            eval_nodes=args.eval_nodes or None,
            on_batch=on_batch,
            on_epoch=on_epoch,
        )
    finally:
        if progress is not None:
            progress.close()
    return s, result


def epoch_line(summary: Summary, result: MiniBatchResult) -> str:
    """Mean epoch time and time per batch, from the summary's ``epoch`` row."""
    if "epoch" not in summary:
        return "No timed epoch."
    e = summary["epoch"]
    per_batch = e.total / max(1, e.count * result.batches)
    return (
        f"Epoch time: {e.mean:.3f} s (mean of {e.count} epochs, std {e.std:.3f} s), "
        f"{per_batch * 1e3:.2f} ms per batch"
    )


def _write_json(path: str, s: MiniBatchSetup, result: MiniBatchResult, summary: Summary) -> None:
    payload = {
        "platform": s.platform,
        "dataset": s.data.name,
        "fanouts": list(s.fanouts),
        "batch_size": s.batch_size,
        "epochs": result.epochs,
        "batches": result.batches,
        "final_loss": result.final_loss,
        "test_acc": result.test_acc,
        "test_nodes": result.test_nodes,
        "summary": summary.to_dict(),
    }
    with open(path, "w") as fh:
        json.dump(payload, fh, indent=2)


def minibatch_main(description: str, argv: Optional[List[str]] = None) -> int:
    """The whole command line of ``examples/minibatch.py``: parse, train, print the tables."""
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_minibatch_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        s, result = run_minibatch(args)
    except MissingDependency as exc:
        print(exc, file=sys.stderr)
        return 2
    summary = registry.summary()
    print(describe(s, result))
    print(epoch_line(summary, result))
    print()
    print(summary.table(title="Mini-batch training"))
    if args.json:
        _write_json(args.json, s, result, summary)
    return 0
