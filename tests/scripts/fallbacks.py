"""A GCN of ours and a stock twin trained side by side, with counters, memory and a profiler
on: what each private torch call's fallback changes (INSTRUMENTED_CONVS_FALLBACK set by the
caller). Writes JSON: both models' losses and gradients, the rows, the labels the profiler
saw, the private calls' verdicts and the probes' readings.

python fallbacks.py OUT.json
"""

import json
import sys

import torch
import torch.nn.functional as F
from torch_geometric.nn import GCNConv as StockGCNConv

import instrumented_convs as ic
from instrumented_convs.core.compiler import dynamo
from instrumented_convs.core.native import private
from instrumented_convs.pyg import GCNConv

torch.manual_seed(0)
x, edge_index = torch.randn(40, 8), torch.randint(0, 40, (2, 160))
y = torch.randint(0, 3, (40,))


def net(conv):
    torch.manual_seed(1)
    return [conv(8, 16), conv(16, 3)]


def train(layers, steps=3):
    losses = []
    for _ in range(steps):
        for layer in layers:
            layer.zero_grad()
        out = layers[1](F.relu(layers[0](x, edge_index)), edge_index)
        loss = F.cross_entropy(out, y)
        loss.backward()
        losses.append(loss.item())
    return losses, [p.grad.tolist() for layer in layers for p in layer.parameters()]


ours, stock = net(GCNConv), net(StockGCNConv)
ic.configure(counters=True, memory=True)
with torch.profiler.profile() as prof:
    result = {"ours": train(ours)}
ic.configure(counters=False, memory=False)
result["stock"] = train(stock)
summary = ic.registry.summary()
result["rows"] = sorted({(r.name, r.phase, r.count) for r in summary.rows})
top = [r for r in summary.rows if r.depth == 0 and r.phase == "forward"]
result["flops"] = sum(r.flops for r in top)
result["saved_bytes"] = sum(r.saved_bytes for r in top)
steps = {r.step for r in summary.rows}
labels = {e.name for e in prof.events()}
result["labels"] = sorted(n for n in labels if n.replace(" [backward]", "") in steps)
result["verdicts"] = private.verdicts()
result["compiling"] = [dynamo.compiling(), dynamo.inside_compiled()]
json.dump(result, open(sys.argv[1], "w"))
