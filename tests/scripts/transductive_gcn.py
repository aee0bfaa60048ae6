"""A plain transductive PyG training script (nothing of instrumented_convs): a 2-layer GCN
trained full-batch on one generated graph, the same graph at every call, evaluated under
``torch.no_grad()`` each epoch; for the advice's tests (tests/test_advice.py).

    python tests/scripts/transductive_gcn.py [--epochs E] [--cached] [--new-graph-each-epoch]
"""

import argparse

import torch
import torch.nn.functional as F
from torch_geometric.nn import GCNConv

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=5)
parser.add_argument("--cached", action="store_true")
parser.add_argument("--new-graph-each-epoch", action="store_true")
args = parser.parse_args()

torch.manual_seed(0)
n, e = 2000, 20000
x = torch.randn(n, 4)
y = torch.randint(0, 3, (n,))
edge_index = torch.randint(0, n, (2, e))


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = GCNConv(4, 8, cached=args.cached)
        self.conv2 = GCNConv(8, 3, cached=args.cached)

    def forward(self, x, edge_index):
        return self.conv2(F.relu(self.conv1(x, edge_index)), edge_index)


model = Net()
opt = torch.optim.Adam(model.parameters(), lr=0.01)
for epoch in range(args.epochs):
    graph = edge_index.clone() if args.new_graph_each_epoch else edge_index
    model.train()
    opt.zero_grad()
    loss = F.cross_entropy(model(x, graph), y)
    loss.backward()
    opt.step()
    model.eval()
    with torch.no_grad():
        acc = (model(x, graph).argmax(-1) == y).float().mean().item()
    print(f"epoch {epoch} loss {loss.item():.4f} acc {acc:.3f}")
