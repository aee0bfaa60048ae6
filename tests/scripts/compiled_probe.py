"""A compiled model trained a few steps; writes Dynamo's counters and its outputs as JSON.

python compiled_probe.py CASE OUT.json [--ours]. CASE: ``gcn`` (PyG's examples/compile/gcn.py
model, dynamic=False), ``gin`` (examples/compile/gin.py's, dynamic=True, mini-batches),
``dgl`` (two DGL GraphConv), ``step`` (a GCN's whole training step compiled as a function),
``rgcn`` (PyG RGCNConv, which breaks the graph), ``reduce`` (the GCN under
``mode="reduce-overhead"``: inductor, compiled for real). ``--ours`` swaps the import for
ours. The backend is otherwise aot_eager: Dynamo's frames, guards and graph breaks are the
same as inductor's, without its compile time. Run it plainly, or under
``python -m instrumented_convs run``.
"""

import json
import os
import sys

import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters

case, out_path = sys.argv[1], sys.argv[2]
ours = "--ours" in sys.argv
torch.manual_seed(0)
# One thread: inductor's C++ reductions run in parallel chunks otherwise, summed in another
# order run to run (a last-bit difference between two plain runs of the reduce case).
torch.set_num_threads(1)
BACKEND = "aot_eager"


def pyg(name):
    if ours:
        import instrumented_convs.pyg as m
    else:
        import torch_geometric.nn as m
    return getattr(m, name)


outputs = []
if case in ("gcn", "step", "rgcn", "reduce"):
    n, e = 60, 240
    x = torch.randn(n, 16)
    ei = torch.randint(0, n, (2, e))
    w = torch.rand(e)
    et = torch.randint(0, 3, (e,))
    y = torch.randint(0, 4, (n,))

    class GCN(torch.nn.Module):
        def __init__(self):
            super().__init__()
            if case == "rgcn":
                self.conv1 = pyg("RGCNConv")(16, 8, 3)
                self.conv2 = pyg("RGCNConv")(8, 4, 3)
            else:
                self.conv1 = pyg("GCNConv")(16, 8, normalize=False)
                self.conv2 = pyg("GCNConv")(8, 4, normalize=False)

        def forward(self, x, edge_index, edge_weight):
            x = F.dropout(x, p=0.5, training=self.training)
            if case == "rgcn":
                return self.conv2(self.conv1(x, edge_index, et).relu(), edge_index, et)
            x = self.conv1(x, edge_index, edge_weight).relu()
            x = F.dropout(x, p=0.5, training=self.training)
            return self.conv2(x, edge_index)

    model = GCN()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    if case == "step":

        def train_step():
            optimizer.zero_grad()
            out = model(x, ei, w)
            loss = F.cross_entropy(out, y)
            loss.backward()
            optimizer.step()
            return loss.detach()

        train_step = torch.compile(train_step, backend=BACKEND)
        for _ in range(4):
            outputs.append(float(train_step()))
    else:
        if case == "reduce":  # inductor (CUDA graphs where the model is on a GPU: not here)
            compiled = torch.compile(model, mode="reduce-overhead", dynamic=False)
        else:
            compiled = torch.compile(model, dynamic=False, backend=BACKEND)
        for _ in range(4 if case != "reduce" else 2):
            compiled.train()
            optimizer.zero_grad()
            loss = F.cross_entropy(compiled(x, ei, w), y)
            loss.backward()
            optimizer.step()
            outputs.append(float(loss))
            with torch.no_grad():
                compiled.eval()
                outputs.append(float(compiled(x, ei, w).sum()))
elif case == "gin":
    from torch_geometric.data import Batch, Data
    from torch_geometric.nn import MLP, global_add_pool

    class GIN(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.convs = torch.nn.ModuleList()
            c = 7
            for _ in range(3):
                self.convs.append(pyg("GINConv")(nn=MLP([c, 16, 16]), train_eps=False))
                c = 16
            self.mlp = MLP([16, 16, 2], norm=None, dropout=0.5)

        def forward(self, x, edge_index, batch, batch_size):
            for conv in self.convs:
                x = conv(x, edge_index).relu()
            return self.mlp(global_add_pool(x, batch, size=batch_size))

    graphs = []
    for i in range(24):
        k = 10 + i % 7
        graphs.append(
            Data(
                x=torch.randn(k, 7),
                edge_index=torch.randint(0, k, (2, 3 * k)),
                y=torch.tensor([i % 2]),
            )
        )
    model = GIN()
    compiled = torch.compile(model, dynamic=True, backend=BACKEND)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    for start in (0, 8, 16, 0):
        b = Batch.from_data_list(graphs[start : start + 8 - start // 16])
        optimizer.zero_grad()
        out = compiled(b.x, b.edge_index, b.batch, b.num_graphs)
        loss = F.cross_entropy(out, b.y)
        loss.backward()
        optimizer.step()
        outputs.append(float(loss))
elif case == "dgl":
    os.environ.setdefault("DGLBACKEND", "pytorch")
    import dgl

    if ours:
        from instrumented_convs.dgl import GraphConv
    else:
        from dgl.nn import GraphConv
    torch.manual_seed(0)  # after the imports: the same draws whichever layers were imported

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.c2 = GraphConv(16, 8), GraphConv(8, 4)

        def forward(self, g, x):
            return self.c2(g, self.c1(g, x).relu())

    src, dst = torch.randint(0, 40, (2, 160))  # (dgl.rand_graph draws differ run to run)
    g = dgl.add_self_loop(dgl.graph((src, dst), num_nodes=40))
    x = torch.randn(40, 16)
    model = Net()
    compiled = torch.compile(model, backend=BACKEND)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(4):
        optimizer.zero_grad()
        out = compiled(g, x)
        out.sum().backward()
        optimizer.step()
        outputs.append(float(out.sum()))
else:
    raise SystemExit(f"unknown case {case!r}")

frames = counters["frames"]
result = {
    "frames": frames["total"],
    "frames_ok": frames["ok"],
    "graph_breaks": sum(counters["graph_break"].values()),
    "graphs": counters["stats"]["unique_graphs"],
    "captured": counters["stats"]["calls_captured"],
    "recompile_limit": sum(v for k, v in counters["unimplemented"].items() if "recompile" in k),
    "outputs": outputs,
}
with open(out_path, "w") as fh:
    json.dump(result, fh)
