"""One run of the study from its command line: the arguments, the run, its report.

:func:`study_main` is the whole command line of ``examples/arxiv.py`` and
``examples/cora.py``; ``python -m instrumented_convs demo|compare`` (:mod:`.cli`) runs
:func:`run_study` once per framework.
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

import torch

from instrumented_convs import registry
from instrumented_convs.report import Summary

from .data import DatasetNotFound, GraphData, MissingDependency, load_graph
from .loop import TrainResult, train
from .models import MODELS, build_model, require_torch_sparse

__all__ = [
    "add_study_arguments",
    "StudyRun",
    "progress_bar",
    "run_study",
    "report",
    "write_json",
    "study_main",
]


def add_study_arguments(
    parser: argparse.ArgumentParser, datasets: Tuple[str, ...], default_dataset: str, epochs: int
) -> None:
    """Add the study's flags to an ``argparse`` parser."""
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
        "generated graph of the same shape (the default)",
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


@dataclass
class StudyRun:
    """One run of the study: its data, result and summary."""

    platform: str
    data: GraphData
    result: TrainResult
    summary: Summary
    sparse: bool
    model: str = "gcn"


def progress_bar(total: int, desc: str, unit: str = "epoch") -> Any:
    """A tqdm bar, or ``None`` where tqdm is not installed (it is an optional dependency)."""
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=desc, unit=unit, leave=False)


def run_study(args: Any) -> StudyRun:
    """Load the data, build the model, train it with progress, return what was measured."""
    dataset, epochs = args.dataset, args.epochs
    if args.quick:
        dataset, epochs = "synthetic-quick", min(epochs, 3)
    if args.sparse and args.platform == "pyg":
        require_torch_sparse()  # fail before generating the data
    data = load_graph(dataset, root=args.root, platform=args.platform, seed=args.seed).to(
        args.device
    )
    torch.manual_seed(args.seed)
    name = getattr(args, "model", "gcn")
    model, graph = build_model(args.platform, data, args.hidden_channels, args.sparse, model=name)
    if args.platform == "dgl":
        graph = graph.to(args.device)
    progress = None if args.no_progress else progress_bar(epochs, f"{args.platform} {dataset}")

    def on_epoch(epoch: int, loss: float) -> None:
        if progress is not None:
            progress.update(1)
            progress.set_postfix(loss=f"{loss:.4f}")

    registry.reset()
    try:
        result = train(
            model, data, graph, epochs=epochs, lr=args.lr, warmup=args.warmup, on_epoch=on_epoch
        )
    finally:
        if progress is not None:
            progress.close()
    return StudyRun(args.platform, data, result, registry.summary(), args.sparse, name)


def report(run: StudyRun) -> str:
    """The text a study prints: data, accuracy, the epoch-level and the per-step tables."""
    r, s = run.result, run.summary
    epoch = s["epoch"] if "epoch" in s else None
    lines = [
        run.data.describe(),
        f"{run.platform}{' (SparseTensor)' if run.sparse else ''}"
        f"{'' if run.model == 'gcn' else ', ' + MODELS[run.model]}: {r.epochs} timed epochs, "
        f"final loss {r.final_loss:.4f}",
        f"Accuracy: train {r.train_acc:.4f}  valid {r.valid_acc:.4f}  test {r.test_acc:.4f}  "
        f"(chance {1 / run.data.num_classes:.4f})",
    ]
    if epoch is not None:
        lines.append(
            f"Epoch time: {epoch.mean * 1e3:.2f} ms (mean of {epoch.count} epochs, std "
            f"{epoch.std * 1e3:.2f} ms)"
        )
    lines += [
        "",
        s.select("epoch", max_depth=1).table(title="Epoch phases"),
        "",
        s.select("epoch/forward").table(title="Steps inside forward"),
    ]
    back = s.select("epoch/backward")
    if any(row.phase == "backward" for row in back):
        covered = sum(
            row.total for row in back.children("epoch/backward") if row.phase == "backward"
        )
        lines += [
            "",
            back.table(title="Steps inside backward"),
            f"The layers' backward steps cover {covered / back['epoch/backward'].total:.1%} of "
            f"backward.",
        ]
    return "\n".join(lines)


def write_json(run: StudyRun, path: str) -> None:
    """Write the run's accuracies and summary to ``path``."""
    import json

    payload = {
        "platform": run.platform,
        "sparse": run.sparse,
        "dataset": run.data.name,
        "model": run.model,
        "accuracy": {
            "train": run.result.train_acc,
            "valid": run.result.valid_acc,
            "test": run.result.test_acc,
        },
        "epochs": run.result.epochs,
        "summary": run.summary.to_dict(),
    }
    with open(path, "w") as fh:
        json.dump(payload, fh, indent=2)


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
