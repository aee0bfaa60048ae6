"""A plain Lightning script (nothing of instrumented_convs unless asked): a PyG GCN trained
on generated Cora-shaped mini-graphs, a validation loop, the losses printed.

``--profiler DIR`` trains with ``ConvProfiler(dirpath=DIR)``; ``--devices 2`` under the
``ddp`` strategy (gloo, two CPU processes Lightning launches itself: this script again).
What ``run`` profiles unchanged, and what the DDP test runs.
"""

import argparse
import random

import lightning as L
import torch
import torch.nn.functional as F
from torch_geometric.datasets import FakeDataset
from torch_geometric.loader import DataLoader
from torch_geometric.nn import GCNConv

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--devices", type=int, default=1)
parser.add_argument("--profiler", default=None)
args = parser.parse_args()


class GCN(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = GCNConv(8, 16)
        self.conv2 = GCNConv(16, 3)

    def forward(self, x, edge_index):
        return self.conv2(F.relu(self.conv1(x, edge_index)), edge_index)

    def training_step(self, batch, i):
        loss = F.cross_entropy(self(batch.x, batch.edge_index), batch.y)
        print(f"batch {self.global_rank} {i} loss {loss.item()!r}", flush=True)
        return loss

    def validation_step(self, batch, i):
        loss = F.cross_entropy(self(batch.x, batch.edge_index), batch.y)
        self.log("val_loss", loss, batch_size=1)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.01)


random.seed(0)
torch.manual_seed(0)
graphs = FakeDataset(num_graphs=8, avg_num_nodes=30, num_channels=8, num_classes=3, task="node")
profiler = None
if args.profiler:
    from instrumented_convs.lightning import ConvProfiler

    profiler = ConvProfiler(dirpath=args.profiler)
trainer = L.Trainer(
    max_epochs=args.epochs,
    accelerator="cpu",
    devices=args.devices,
    strategy="ddp" if args.devices > 1 else "auto",
    profiler=profiler,
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
    limit_val_batches=1,
)
trainer.fit(GCN(), DataLoader(graphs, batch_size=2), DataLoader(graphs, batch_size=4))
