"""One rank of the duty cycle's two-process tests (tests/test_cycle.py; started by torchrun).

    python -m torch.distributed.run --standalone --nproc-per-node 2 \\
        tests/cycle_worker.py OUT (every K | budget)

A DDP model of two instrumented PyG GCNConv layers trains 60 iterations (an all-reduce in
every backward) under ``configure(record_every=K)``, or under ``budget=0.01`` with each rank
proposing a different K (rank r: ``3 * (r + 1)``; the ranks must agree on the largest).
Every rank writes which iterations it recorded (what it saw of ``switches.drawn`` at each
step), the rate it ended at and what the merged summary says to ``OUT/rank<r>.json``.
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

import instrumented_convs as ic
from instrumented_convs.core.dutycycle import budget as budget_module
from instrumented_convs.core.dutycycle import cycle as cycle_module
from instrumented_convs.core.settings import switches
from instrumented_convs.pyg import GCNConv


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = GCNConv(8, 16), GCNConv(16, 3)

    def forward(self, x: torch.Tensor, ei: torch.Tensor) -> torch.Tensor:
        return F.log_softmax(self.b(F.relu(self.a(x, ei)), ei), dim=-1)


def main(out: str, mode: str, value: str) -> None:
    """Train, record which iterations were drawn, merge, write ``OUT/rank<r>.json``."""
    # Should a run of this file hang before its results are written (torchrun's 240 s
    # timeout; 6 s as a rule), every thread's stack is in the test's output.
    faulthandler.dump_traceback_later(150, exit=False)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    x, ei = torch.randn(40, 8), torch.randint(0, 40, (2, 160))
    y = torch.randint(0, 3, (40,))
    model = torch.nn.parallel.DistributedDataParallel(Net())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    if mode == "budget":
        budget_module.Budget.propose = lambda self: 3 * (rank + 1)  # the ranks disagree
        budget_module.DECIDE_EVERY = 8
        ic.configure(budget=float(value))
    else:
        ic.configure(record_every=int(value))
    drawn = []
    for i in range(60):
        drawn.append(bool(switches.drawn))
        opt.zero_grad()
        F.nll_loss(model(x, ei), y).backward()
        opt.step()
    summary = ic.registry.summary(all_ranks=True)
    result = {
        "drawn": drawn,
        "every": cycle_module.cycle.every,
        "sampling": summary.sampling,
        "count": summary["GCNConv"].count,
        "sampled": summary["GCNConv"].sampled,
    }
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    faulthandler.cancel_dump_traceback_later()
    # What is tested is done and written. Ending here: a worker hung twice in CI (under
    # load, once each in 2026-11-26's and 2026-11-27's runs) after its file was written and
    # the dump above cancelled, in torch's teardown at exit (gloo's, with the peer gone),
    # where nothing of ours runs; both ranks pass a barrier first, so neither leaves early.
    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main(*sys.argv[1:4])
