"""A plain DGL DDP script on gloo (nothing of instrumented_convs), for ``run`` under torchrun.

Each rank trains the same two-layer GraphConv model (``dgl.nn``) wrapped in
``DistributedDataParallel`` on its own graph: 3 full-graph steps, an evaluation under
``torch.no_grad()``, then 2 neighbour-sampled mini-batches from DGL's ``DataLoader`` with
``use_ddp=True`` (each rank its share of the seed nodes). The graph, features and labels come
from torch's generator seeded by the rank: ``dgl.rand_graph`` draws with a generator per
OpenMP thread, so the same seed can give another graph when threads are scheduled otherwise.
Prints each rank's losses, so a run can be compared with a plain one.

At the end it frees the DDP model and destroys the process group, which joins gloo's worker
threads. Without that, torch 2.13 aborts now and then at exit ("terminate called without an
active exception", measured 15-20% of plain runs here): work objects made during backward hold
the backward's Python context, and a gloo worker that drops the last one while the interpreter
is finalizing cannot take the GIL (pytorch/pytorch#190489). Importing ``torch.distributed.nn``
before the group exists matters too: DDP's first use imports it, and its functions then keep
``group.WORLD`` as a default argument, which keeps the destroyed group (and its threads) alive
to the end.
"""

import dgl
import torch
import torch.distributed as dist
import torch.distributed.nn  # noqa: F401  before the group exists (see above)
import torch.nn.functional as F
from dgl.nn import GraphConv
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
rank = dist.get_rank()
dgl.seed(rank)  # the neighbour sampler's
gen = torch.Generator().manual_seed(rank)
src, dst = torch.randint(0, 100, (2, 400), generator=gen)
g = dgl.add_self_loop(dgl.graph((src, dst), num_nodes=100))
x = torch.randn(100, 8, generator=gen)
y = torch.randint(0, 3, (100,), generator=gen)


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = GraphConv(8, 16)
        self.conv2 = GraphConv(16, 3)

    def forward(self, graphs, feat):
        first, second = graphs if isinstance(graphs, list) else (graphs, graphs)
        return self.conv2(second, F.relu(self.conv1(first, feat)))


torch.manual_seed(0)
model = DistributedDataParallel(Net())
opt = torch.optim.Adam(model.parameters(), lr=0.01)
for step in range(3):
    opt.zero_grad()
    loss = F.cross_entropy(model(g, x), y)
    loss.backward()
    opt.step()
    print(f"rank {rank} step {step} loss {loss.item()!r}", flush=True)
with torch.no_grad():
    acc = (model(g, x).argmax(-1) == y).float().mean().item()
print(f"rank {rank} acc {acc!r}", flush=True)

sampler = dgl.dataloading.NeighborSampler([4, 4])
loader = dgl.dataloading.DataLoader(
    g, torch.arange(40), sampler, batch_size=10, use_ddp=True, shuffle=False
)  # 40 seeds over 2 ranks in batches of 10: 2 batches a rank
for input_nodes, output_nodes, blocks in loader:
    opt.zero_grad()
    loss = F.cross_entropy(model(blocks, x[input_nodes]), y[output_nodes])
    loss.backward()
    opt.step()
    print(f"rank {rank} batch loss {loss.item()!r}", flush=True)
del model, opt, loss  # DDP's reducer holds the group
dist.destroy_process_group()
print(f"rank {rank} done", flush=True)
