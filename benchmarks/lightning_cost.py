"""What ``Trainer(profiler=ConvProfiler(...))`` adds to a Lightning training epoch.

A LightningModule of three stock GCNConv layers trained on small generated graphs (one graph a
batch, 256 nodes, 1,024 edges, one thread: launch-bound, where every microsecond of Python
shows), full training steps (forward, loss, backward, optimizer step) through Lightning's loop.
Each variant trains its own copy with a fresh Trainer for ``--epochs`` epochs; the time of each
epoch after the first is read by a callback (``on_train_epoch_start``/``_end``, so the Trainer's
set-up and the run folder's writing are left out) and its median taken. Variants interleaved,
the order reversed every other round:

- ``no profiler``: Lightning alone;
- ``SimpleProfiler``: Lightning's cheapest (a clock around each of its actions), for
  comparison: what any profiler costs through Lightning's own calls;
- ``ConvProfiler``: ours as it comes (the timeline on, backward timed one call in 16);
- ``ConvProfiler, record_every=10`` and ``=100``: with the duty cycle;
- ``PyTorchProfiler``: Lightning's ``torch.profiler`` one (CPU activities), for comparison;
- ``no profiler again``: the A/A noise floor.

Reported: per variant the median over rounds of its epoch time over ``no profiler``'s in the
same round, and the added time per training batch (microseconds). Needs lightning (the
integrations' folder: ``scripts/env.sh integrations``).

    python benchmarks/lightning_cost.py                  # 15 rounds of 6 epochs
    python benchmarks/lightning_cost.py --quick          # a smoke run
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
import warnings
from typing import Any, Callable, Dict, List

import lightning as L
import torch
import torch.nn.functional as F
from torch_geometric.data import Data
from torch_geometric.loader import DataLoader
from torch_geometric.nn import GCNConv

from instrumented_convs.lightning import ConvProfiler

BATCHES = 8  # graphs, one a batch: training batches an epoch


class GCN(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.convs = torch.nn.ModuleList([GCNConv(32, 32), GCNConv(32, 32), GCNConv(32, 8)])

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        for conv in self.convs[:-1]:
            x = F.relu(conv(x, edge_index))
        return self.convs[-1](x, edge_index)

    def training_step(self, batch: Any, i: int) -> torch.Tensor:
        return F.cross_entropy(self(batch.x, batch.edge_index), batch.y)

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters(), lr=0.01)


class EpochTimes(L.Callback):
    """Each training epoch's wall time (seconds)."""

    def __init__(self) -> None:
        self.times: List[float] = []
        self._t0 = 0.0

    def on_train_epoch_start(self, trainer: Any, module: Any) -> None:
        self._t0 = time.perf_counter()

    def on_train_epoch_end(self, trainer: Any, module: Any) -> None:
        self.times.append(time.perf_counter() - self._t0)


def _graphs() -> List[Data]:
    g = torch.Generator().manual_seed(0)
    return [
        Data(
            x=torch.randn(256, 32, generator=g),
            edge_index=torch.randint(0, 256, (2, 1024), generator=g),
            y=torch.randint(0, 8, (256,), generator=g),
        )
        for _ in range(BATCHES)
    ]


def _variants(folder: str) -> Dict[str, Callable[[], Any]]:
    from lightning.pytorch.profilers import PyTorchProfiler, SimpleProfiler

    return {
        "no profiler": lambda: None,
        "SimpleProfiler": lambda: SimpleProfiler(dirpath=folder, filename="simple"),
        "ConvProfiler": lambda: ConvProfiler(dirpath=folder),
        "ConvProfiler, record_every=10": lambda: ConvProfiler(dirpath=folder, record_every=10),
        "ConvProfiler, record_every=100": lambda: ConvProfiler(dirpath=folder, record_every=100),
        "PyTorchProfiler": lambda: PyTorchProfiler(dirpath=folder, filename="torch"),
        "no profiler again": lambda: None,
    }


def _epoch(profiler: Any, loader: Any, epochs: int) -> float:
    """The median training epoch time (seconds) of a fit, the first epoch left out."""
    torch.manual_seed(0)
    times = EpochTimes()
    trainer = L.Trainer(
        max_epochs=epochs,
        accelerator="cpu",
        profiler=profiler,
        callbacks=[times],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(GCN(), loader)
    return statistics.median(times.times[1:])


def main() -> None:
    """Measure and print (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--quick", action="store_true", help="2 rounds of 3 epochs (a smoke run)")
    args = p.parse_args()
    if args.quick:
        args.rounds, args.epochs = 2, 3
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    loader = DataLoader(_graphs(), batch_size=1)
    with tempfile.TemporaryDirectory() as folder:
        variants = _variants(folder)
        names = list(variants)
        times: Dict[str, List[float]] = {n: [] for n in names}
        for r in range(args.rounds):
            for name in names if r % 2 == 0 else reversed(names):
                times[name].append(_epoch(variants[name](), loader, args.epochs))
    base = times["no profiler"]
    print(
        f"Lightning {L.__version__}, torch {torch.__version__}, one thread; a 3-layer GCNConv "
        f"model, {BATCHES} batches of 256 nodes an epoch; {args.rounds} rounds of "
        f"{args.epochs} epochs (medians)"
    )
    print(f"{'variant':32} {'epoch (ms)':>11} {'x no profiler':>14} {'added us/batch':>15}")
    for name in names:
        ratio = statistics.median(t / b for t, b in zip(times[name], base))
        added = statistics.median((t - b) / BATCHES * 1e6 for t, b in zip(times[name], base))
        epoch = statistics.median(times[name]) * 1e3
        print(f"{name:32} {epoch:11.2f} {ratio:14.3f} {added:15.0f}")


if __name__ == "__main__":
    main()
