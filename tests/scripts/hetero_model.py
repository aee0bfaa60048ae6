"""A model made by a graph transform, trained 10 steps after one call without grad, for
``run``: ``to_hetero`` (3 edge types), ``torch.fx`` (a traced homogeneous GNN), ``export``
(``torch.export(...).module()``) or ``compile`` (``torch.compile``, aot_eager). ``--swap``
builds the GNN from ``instrumented_convs.pyg`` (the import swap). Prints each loss."""

import argparse

import torch
import torch.nn.functional as F
from torch_geometric.data import HeteroData
from torch_geometric.nn import MessagePassing, to_hetero

parser = argparse.ArgumentParser()
parser.add_argument("--kind", choices=("to_hetero", "fx", "export", "compile"), required=True)
parser.add_argument("--swap", action="store_true")
parser.add_argument("--steps", type=int, default=10)
args = parser.parse_args()
if args.swap:
    from instrumented_convs.pyg import SAGEConv
else:
    from torch_geometric.nn import SAGEConv

torch.manual_seed(0)
data = HeteroData()
data["author"].x, data["paper"].x = torch.randn(40, 16), torch.randn(60, 16)
data["paper"].y = torch.randint(0, 4, (60,))
writes = torch.stack([torch.randint(0, 40, (200,)), torch.randint(0, 60, (200,))])
data["author", "writes", "paper"].edge_index = writes
data["paper", "cites", "paper"].edge_index = torch.randint(0, 60, (2, 300))
data["paper", "rev_writes", "author"].edge_index = writes.flip(0)


class GNN(torch.nn.Module):
    def __init__(self, lazy: bool):
        super().__init__()
        size = (-1, -1) if lazy else 16
        self.conv1 = SAGEConv(size, 32)
        self.conv2 = SAGEConv(size if lazy else 32, 4)

    def forward(self, x, edge_index):
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)


class Leaves(torch.fx.Tracer):
    """torch.fx's tracer, message-passing layers kept whole (their code is data-dependent)."""

    def is_leaf_module(self, m, name):
        return isinstance(m, MessagePassing) or super().is_leaf_module(m, name)


x, edge_index, y = data["paper"].x, data["paper", "cites", "paper"].edge_index, data["paper"].y
if args.kind == "to_hetero":
    model = to_hetero(GNN(lazy=True), data.metadata(), aggr="sum")
    inputs = (data.x_dict, data.edge_index_dict)
else:
    gnn = GNN(lazy=False)
    if args.kind == "fx":
        model = torch.fx.GraphModule(gnn, Leaves().trace(gnn))
    elif args.kind == "export":
        model = torch.export.export(gnn, (x, edge_index)).module()
    else:
        model = torch.compile(gnn, backend="aot_eager")
    inputs = (x, edge_index)


def out_of(result):
    return result["paper"] if isinstance(result, dict) else result


with torch.no_grad():
    model(*inputs)  # (to_hetero's lazy shapes)
opt = torch.optim.Adam(model.parameters(), lr=0.01)
for step in range(args.steps):
    opt.zero_grad()
    loss = F.cross_entropy(out_of(model(*inputs)), y)
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.6f}")
