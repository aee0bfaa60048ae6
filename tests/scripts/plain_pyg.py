"""A plain PyG training script (nothing of instrumented_convs): what ``run`` profiles unchanged.

Node classification with a model of GCNConv (``torch_geometric.nn``) and SAGEConv
(``torch_geometric.nn.conv``), PyG's own ``GAT`` model beside it, an evaluation under
``torch.no_grad()`` each epoch, then graph mini-batches from PyG's ``DataLoader`` with
GINConv. ``--end`` picks how it ends (return, exit, exit-msg, raise, interrupt).
"""

import argparse
import random
import sys

import torch
import torch.nn.functional as F
from torch_geometric.datasets import FakeDataset
from torch_geometric.loader import DataLoader
from torch_geometric.nn import GCNConv, GINConv, global_add_pool
from torch_geometric.nn.conv import SAGEConv
from torch_geometric.nn.models import GAT

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--end", default="return")
args = parser.parse_args()

random.seed(0)  # FakeDataset draws its sizes from random
torch.manual_seed(0)
data = FakeDataset(num_graphs=1, avg_num_nodes=120, num_channels=8, num_classes=3)[0]


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = GCNConv(8, 16)
        self.conv2 = SAGEConv(16, 3)

    def forward(self, x, edge_index):
        return self.conv2(F.relu(self.conv1(x, edge_index)), edge_index)


model = Net()
gat = GAT(8, 8, num_layers=2, out_channels=3, heads=2)
opt = torch.optim.Adam([*model.parameters(), *gat.parameters()], lr=0.01)
for epoch in range(args.epochs):
    model.train()
    opt.zero_grad()
    out = model(data.x, data.edge_index) + gat(data.x, data.edge_index)
    loss = F.cross_entropy(out, data.y)
    loss.backward()
    opt.step()
    model.eval()
    with torch.no_grad():
        acc = (model(data.x, data.edge_index).argmax(-1) == data.y).float().mean().item()
    print(f"epoch {epoch} loss {loss.item()!r} acc {acc!r}")

graphs = FakeDataset(num_graphs=6, avg_num_nodes=20, num_channels=8, num_classes=2)
loader = DataLoader(graphs, batch_size=2)
gin = GINConv(torch.nn.Linear(8, 2))
opt2 = torch.optim.SGD(gin.parameters(), lr=0.1)
for batch in loader:
    opt2.zero_grad()
    out = global_add_pool(gin(batch.x, batch.edge_index), batch.batch)
    loss = F.cross_entropy(out, batch.y)
    loss.backward()
    opt2.step()
    print(f"batch loss {loss.item()!r}")

if args.end == "exit":
    sys.exit(3)
if args.end == "exit-msg":
    sys.exit("stopped on purpose")
if args.end == "raise":
    raise RuntimeError("failed on purpose")
if args.end == "interrupt":
    raise KeyboardInterrupt
print(f"__name__ {__name__} argv {sys.argv[1:]}")
