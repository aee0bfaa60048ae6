"""A plain DGL training script (nothing of instrumented_convs): what ``run`` profiles unchanged.

Full-graph training with GraphConv (``dgl.nn``) and SAGEConv (``dgl.nn.pytorch``), an
evaluation under ``torch.no_grad()`` each epoch, then neighbour-sampled mini-batches from
DGL's ``DataLoader`` (its prefetching iterator) with GraphConv on blocks.
"""

import argparse

import dgl
import torch
import torch.nn.functional as F
from dgl.nn import GraphConv
from dgl.nn.pytorch import SAGEConv

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
args = parser.parse_args()

torch.manual_seed(0)
dgl.seed(0)
# The graph from torch's generator: dgl.rand_graph draws with a generator per OpenMP thread,
# so the same seed can give another graph when threads are scheduled otherwise.
src, dst = torch.randint(0, 120, (2, 480))
g = dgl.add_self_loop(dgl.graph((src, dst), num_nodes=120))
x = torch.randn(120, 8)
y = torch.randint(0, 3, (120,))


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = GraphConv(8, 16)
        self.conv2 = SAGEConv(16, 3, "mean")

    def forward(self, graph, feat):
        return self.conv2(graph, F.relu(self.conv1(graph, feat)))


model = Net()
opt = torch.optim.Adam(model.parameters(), lr=0.01)
for epoch in range(args.epochs):
    opt.zero_grad()
    loss = F.cross_entropy(model(g, x), y)
    loss.backward()
    opt.step()
    with torch.no_grad():
        acc = (model(g, x).argmax(-1) == y).float().mean().item()
    print(f"epoch {epoch} loss {loss.item()!r} acc {acc!r}")

sampler = dgl.dataloading.NeighborSampler([4])
loader = dgl.dataloading.DataLoader(g, torch.arange(40), sampler, batch_size=10)
conv = GraphConv(8, 3)
opt2 = torch.optim.SGD(conv.parameters(), lr=0.1)
for input_nodes, output_nodes, blocks in loader:
    opt2.zero_grad()
    loss = F.cross_entropy(conv(blocks[0], x[input_nodes]), y[output_nodes])
    loss.backward()
    opt2.step()
print("done")
