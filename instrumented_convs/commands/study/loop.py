"""The study's training loop: Adam, NLL loss, and a ``region()`` around each phase of an epoch.

Each timed epoch is ``region("epoch")`` with ``forward``, ``loss``, ``backward`` and
``optimizer.step`` inside (the epoch-level table of the study), and the layers' own steps
appear under ``forward``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from instrumented_convs import configure, region

from .data import GraphData

__all__ = ["TrainResult", "accuracy", "train"]


@dataclass
class TrainResult:
    """What :func:`train` measured: accuracies and the epochs timed."""

    train_acc: float
    valid_acc: float
    test_acc: float
    epochs: int
    final_loss: float


def accuracy(model: torch.nn.Module, data: GraphData, graph: Any) -> Tuple[float, float, float]:
    """Train/valid/test accuracy, computed with instrumentation off."""
    with configure(enabled=False):
        model.eval()
        with torch.no_grad():
            pred = model(data.x, graph).argmax(dim=-1)
        model.train()
    return tuple(  # type: ignore[return-value]
        float((pred[idx] == data.y[idx]).float().mean())
        for idx in (data.train_idx, data.valid_idx, data.test_idx)
    )


def train(
    model: torch.nn.Module,
    data: GraphData,
    graph: Any,
    epochs: int = 100,
    lr: float = 0.01,
    warmup: int = 1,
    on_epoch: Optional[Callable[[int, float], None]] = None,
) -> TrainResult:
    """The study's loop: ``warmup`` untimed epochs, then ``epochs`` epochs in regions.

    Each timed epoch is ``region("epoch")`` with ``forward``, ``loss``, ``backward`` and
    ``optimizer.step`` inside, and the layers' steps under ``forward``. Warm-up epochs run
    with instrumentation off, so the first, slower calls (allocations, lazy initialisation)
    do not skew the table. ``on_epoch(epoch, loss)`` is called after each timed epoch.
    """
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    loss = torch.zeros(())

    def one_epoch() -> Tensor:
        opt.zero_grad()
        with region("forward"):
            out = model(data.x, graph)
        with region("loss"):
            loss = F.nll_loss(out[data.train_idx], data.y[data.train_idx])
        with region("backward"):
            loss.backward()
        with region("optimizer.step"):
            opt.step()
        return loss

    with configure(enabled=False):
        for _ in range(warmup):
            one_epoch()
    for epoch in range(epochs):
        with region("epoch", device=data.x.device):
            loss = one_epoch()
        if on_epoch is not None:
            on_epoch(epoch, float(loss.detach()))
    train_acc, valid_acc, test_acc = accuracy(model, data, graph)
    return TrainResult(train_acc, valid_acc, test_acc, epochs, float(loss.detach()))
