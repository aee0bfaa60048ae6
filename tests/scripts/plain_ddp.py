"""A plain PyG DDP script on gloo (nothing of instrumented_convs), for ``run`` under torchrun.

``--vanish RANK``: that rank leaves with ``os._exit(0)`` at the end, before anything at exit
runs (as a rank killed at the end would), so it saves nothing.

It frees its DDP model and destroys the process group before it ends, so gloo's worker threads
are joined before the interpreter shuts down (see ``plain_dgl_ddp.py`` for why that matters).
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.distributed.nn  # noqa: F401  before the group exists: see plain_dgl_ddp.py
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch_geometric.nn import GCNConv

parser = argparse.ArgumentParser()
parser.add_argument("--vanish", type=int, default=-1)
args = parser.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(rank)
x = torch.randn(100, 8)
edge_index = torch.randint(0, 100, (2, 400))
y = torch.randint(0, 3, (100,))


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = GCNConv(8, 16)
        self.conv2 = GCNConv(16, 3)

    def forward(self, x, edge_index):
        return self.conv2(F.relu(self.conv1(x, edge_index)), edge_index)


torch.manual_seed(0)
model = DistributedDataParallel(Net())
opt = torch.optim.Adam(model.parameters(), lr=0.01)
for _ in range(3):
    opt.zero_grad()
    F.cross_entropy(model(x, edge_index), y).backward()
    opt.step()
del model, opt  # DDP's reducer holds the group
dist.destroy_process_group()
print(f"rank {rank} done", flush=True)
if rank == args.vanish:
    os._exit(0)
