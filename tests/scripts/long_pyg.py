"""A plain PyG training script (nothing of instrumented_convs unless asked) that trains until
it is told to stop: what ``run --on-demand`` and ``capture`` are tried on, as on a long job.

A GCNConv + SAGEConv model on a generated graph, full-batch, one optimizer step an epoch, an
evaluation under ``torch.no_grad()`` every 5 epochs; each epoch's loss printed (flushed).
``--epochs N`` stops after N epochs (0: until ``--stop-file`` exists), ``--sleep S`` waits
S seconds an epoch (a slower job). Ours, where asked: ``--region NAME`` runs each epoch
inside ``region(NAME)`` (for ``--iteration NAME``); ``--ours`` takes the layers from
``instrumented_convs.pyg``; ``--configure DIR`` calls ``configure(record="on-demand",
captures=DIR)`` first (a script of one's own on demand); ``--stop-on-sigterm FOLDER``
installs a SIGTERM handler that stops the loop (saying whether FOLDER held a saved run);
``--sigterm-goes-on`` one that only says it ran (the loop goes on).
"""

import argparse
import contextlib
import os
import signal
import time

import torch
import torch.nn.functional as F
from torch_geometric.nn import GCNConv, SAGEConv

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=0)
parser.add_argument("--stop-file")
parser.add_argument("--sleep", type=float, default=0.0)
parser.add_argument("--region")
parser.add_argument("--ours", action="store_true")
parser.add_argument("--configure")
parser.add_argument("--stop-on-sigterm", metavar="FOLDER")
parser.add_argument("--sigterm-goes-on", action="store_true")
args = parser.parse_args()
stopping = []
if args.stop_on_sigterm:  # a handler of its own, as Lightning's: the loop stops, then ends

    def on_sigterm(signum, frame):
        saved = os.path.exists(os.path.join(args.stop_on_sigterm, "run.json"))
        print(f"handler: SIGTERM, the run saved before: {saved}", flush=True)
        stopping.append(signum)

    signal.signal(signal.SIGTERM, on_sigterm)
    print(f"handler installed: {signal.getsignal(signal.SIGTERM) is on_sigterm}", flush=True)
if args.sigterm_goes_on:
    signal.signal(signal.SIGTERM, lambda signum, frame: print("handler: going on", flush=True))
if args.ours:
    from instrumented_convs.pyg import GCNConv, SAGEConv  # noqa: F811
if args.configure:
    import instrumented_convs

    instrumented_convs.configure(record="on-demand", captures=args.configure)

torch.manual_seed(0)
n = 300
x = torch.randn(n, 16)
y = torch.randint(0, 4, (n,))
edge_index = torch.randint(0, n, (2, 2400))


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = GCNConv(16, 32)
        self.conv2 = SAGEConv(32, 4)

    def forward(self, x, edge_index):
        return self.conv2(F.relu(self.conv1(x, edge_index)), edge_index)


def epoch_region():
    if args.region is None:
        return contextlib.nullcontext()
    from instrumented_convs import region

    return region(args.region)


model = Net()
opt = torch.optim.Adam(model.parameters(), lr=0.01)
epoch = 0
while (args.epochs == 0 or epoch < args.epochs) and not stopping:
    if args.stop_file and os.path.exists(args.stop_file):
        break
    with epoch_region():
        model.train()
        opt.zero_grad()
        loss = F.cross_entropy(model(x, edge_index), y)
        loss.backward()
        opt.step()
    if epoch % 5 == 0:
        model.eval()
        with torch.no_grad():
            model(x, edge_index)
    print(f"epoch {epoch} loss {loss.item()!r}", flush=True)
    epoch += 1
    if args.sleep:
        time.sleep(args.sleep)
print("done", flush=True)
