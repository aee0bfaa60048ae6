"""A plain PyG DDP script on gloo (nothing of instrumented_convs), for ``run`` under torchrun.

``--vanish RANK``: that rank leaves with ``os._exit(0)`` at the end, before anything at exit
runs (as a rank killed at the end would), so it saves nothing. ``--steps N`` (default 3)
training steps, or with ``--stop-file`` until that file exists (every rank looks each step
and the ranks agree, an all-reduce, so they stop at the same one: a long job for
``capture``); ``--sleep S`` waits S seconds a step. ``--hold RANK``: after the steps, that
rank waits in gloo for a message no rank sends (held in C: no Python runs there, as a rank
whose peer left a collective), the others sleep until they are ended.

It frees its DDP model and destroys the process group before it ends, so gloo's worker threads
are joined before the interpreter shuts down (see ``plain_dgl_ddp.py`` for why that matters).
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.distributed.nn  # noqa: F401  before the group exists: see plain_dgl_ddp.py
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch_geometric.nn import GCNConv

parser = argparse.ArgumentParser()
parser.add_argument("--vanish", type=int, default=-1)
parser.add_argument("--steps", type=int, default=3)
parser.add_argument("--stop-file")
parser.add_argument("--sleep", type=float, default=0.0)
parser.add_argument("--hold", type=int, default=-1)
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


def stop_now() -> bool:
    if not args.stop_file:
        return False
    stop = torch.tensor([float(os.path.exists(args.stop_file))])
    dist.all_reduce(stop, op=dist.ReduceOp.MAX)
    return bool(stop.item())


torch.manual_seed(0)
model = DistributedDataParallel(Net())
opt = torch.optim.Adam(model.parameters(), lr=0.01)
step = 0
while (args.stop_file or step < args.steps) and not stop_now():
    opt.zero_grad()
    F.cross_entropy(model(x, edge_index), y).backward()
    opt.step()
    step += 1
    if args.sleep:
        time.sleep(args.sleep)
if args.hold >= 0:
    print(f"rank {rank} holds", flush=True)
    if rank == args.hold:
        dist.recv(torch.zeros(1), src=(rank + 1) % dist.get_world_size())
    while True:
        time.sleep(0.05)
del model, opt  # DDP's reducer holds the group
dist.destroy_process_group()
print(f"rank {rank} done", flush=True)
if rank == args.vanish:
    os._exit(0)
