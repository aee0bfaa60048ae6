"""One run of the study: the data loaded, the model built and trained with a progress bar,
what it measured (:class:`StudyRun`), the text it prints and the JSON it writes. The demo's
run also says what to change (``configure(advise=True)``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import torch

from instrumented_convs import advise, configure, registry
from instrumented_convs.report import RenderInput, Summary, render

from .data import GraphData, load_graph
from .loop import TrainResult, train
from .models import MODELS, build_model, require_torch_sparse

__all__ = ["StudyRun", "progress_bar", "run_study", "report", "write_json"]


@dataclass
class StudyRun:
    """One run of the study: its data, result and summary."""

    platform: str
    data: GraphData
    result: TrainResult
    summary: Summary
    sparse: bool
    model: str = "gcn"
    advice: Optional[List[Dict[str, Any]]] = None  #: what to change (the demo's)


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
    advising = bool(getattr(args, "demo", False))  # the demo shows what to change too
    saved = configure(advise=True) if advising else None
    try:
        result = train(
            model, data, graph, epochs=epochs, lr=args.lr, warmup=args.warmup, on_epoch=on_epoch
        )
        advice = advise() if advising else None
    finally:
        if saved is not None:
            saved.restore()
        if progress is not None:
            progress.close()
    return StudyRun(args.platform, data, result, registry.summary(), args.sparse, name, advice)


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
    if run.advice is not None:
        lines += ["", render("advice", RenderInput(advice=run.advice))]
    return "\n".join(lines)


def write_json(run: StudyRun, path: str) -> None:
    """Write the run's accuracies and summary to ``path``."""
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
