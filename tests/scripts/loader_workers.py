"""A training loop over a data loader with worker processes, for tests/test_workers.py.

    python tests/scripts/loader_workers.py [--kind torch|pyg|dgl|neighbor|link] [--workers N]
        [--context fork|spawn] [--persistent] [--prefetch K] [--epochs E] [--stop-after B]
        [--kill I | --raise I] [--library] [--no-filter-per-worker]

Prints one line per batch (``batch <epoch> <n> <digest>``: what the loop got, to compare
runs with and without recording), ``done``; with ``--library`` the loader is given to
``instrument_loader`` and the script prints ``RESULT <json>`` (the recorder's result, its
timeline calls left out) and ``ROWS <json>`` (the training process's rows: path, count).
``--kill I``: the worker that loads item I kills itself (SIGKILL), ``--raise I``: raises
ValueError there (the loop raises what torch raises, as stock).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys

import numpy as np
import torch
from torch.utils.data import Dataset


class Items(Dataset):
    """Item i: 8 numbers made from i, after a little work (a sampler's stand-in)."""

    def __init__(self, n: int, kill: int = -1, fail: int = -1) -> None:
        self.n, self.kill, self.fail = n, kill, fail

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == self.kill:
            os.kill(os.getpid(), signal.SIGKILL)
        if i == self.fail:
            raise ValueError(f"item {i} is bad")
        g = torch.Generator().manual_seed(i)
        x = torch.randn(64, 64, generator=g)
        for _ in range(3):
            x = torch.tanh(x @ x.T / 64)
        return x[0, :8].clone()


def loader(args: argparse.Namespace) -> torch.utils.data.DataLoader:
    """The loader ``--kind`` asks for."""
    common = dict(num_workers=args.workers, persistent_workers=args.persistent and args.workers > 0)
    if args.workers:
        common.update(multiprocessing_context=args.context, prefetch_factor=args.prefetch)
    if args.kind == "torch":
        return torch.utils.data.DataLoader(
            Items(48, args.kill, args.raise_),
            batch_size=4,
            shuffle=True,
            generator=torch.Generator().manual_seed(1),
            **common,
        )
    from instrumented_convs.commands.study.data import synthetic_graph

    data = synthetic_graph("g", 2000, 16000, 16, 4, split=(400, 200, 1400))
    if args.kind == "pyg":
        from torch_geometric.data import Data
        from torch_geometric.loader import DataLoader

        graphs = [
            Data(x=data.x[i * 20 : i * 20 + 20], y=data.y[i * 20 : i * 20 + 20]) for i in range(40)
        ]
        return DataLoader(
            graphs, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(1), **common
        )
    if args.kind == "neighbor":
        from torch_geometric.data import Data
        from torch_geometric.loader import NeighborLoader

        graph = Data(x=data.x, y=data.y, edge_index=data.edge_index)
        filter_per_worker = not args.no_filter_per_worker
        return NeighborLoader(
            graph,
            num_neighbors=[5, 5],
            batch_size=50,
            input_nodes=data.train_idx,
            shuffle=True,
            filter_per_worker=filter_per_worker,
            **common,
        )
    if args.kind == "link":
        from torch_geometric.data import Data
        from torch_geometric.loader import LinkNeighborLoader

        graph = Data(x=data.x, y=data.y, edge_index=data.edge_index)
        return LinkNeighborLoader(
            graph,
            num_neighbors=[5, 5],
            batch_size=50,
            edge_label_index=data.edge_index[:, :400],
            shuffle=True,
            **common,
        )
    import dgl

    g = dgl.graph((data.edge_index[0], data.edge_index[1]), num_nodes=data.x.size(0))
    g.ndata["feat"], g.ndata["label"] = data.x, data.y
    sampler = dgl.dataloading.NeighborSampler(
        [5, 5], prefetch_node_feats=["feat"], prefetch_labels=["label"]
    )
    dgl.seed(0)
    return dgl.dataloading.DataLoader(
        g, data.train_idx, sampler, batch_size=50, shuffle=True, **common
    )


def digest(batch: object) -> str:
    """A short fingerprint of a batch (its tensors' sums; DGL's: its seed nodes, as DGL's
    neighbour sampling differs from run to run, stock as well)."""
    if isinstance(batch, (list, tuple)) and len(batch) == 3 and isinstance(batch[2], list):
        return "seeds " + digest(batch[1]) + f" in {len(batch[2])} blocks"
    if isinstance(batch, torch.Tensor):
        return f"{float(batch.double().sum()):.6f}"
    if isinstance(batch, (list, tuple)):
        return ",".join(digest(b) for b in batch)
    if hasattr(batch, "ndata") and hasattr(batch, "srcdata"):  # a DGL block
        return digest(batch.srcdata["feat"]) + ":" + str(batch.num_edges())
    if hasattr(batch, "x"):  # PyG Data / Batch
        return digest(batch.x) + ":" + str(getattr(batch, "num_edges", 0))
    return type(batch).__name__


def _quiet_child_signals() -> None:
    """After a killed worker, torch's SIGCHLD handler raises its RuntimeError whenever the
    signal arrives, also after the loop's own error, while this script prints what was
    recorded: torch's handler is put away first (the handler may fire while it is put away:
    retried)."""
    while True:
        try:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            return
        except RuntimeError:
            continue


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--kind", default="torch", choices=("torch", "pyg", "dgl", "neighbor", "link"))
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--context", default="fork", choices=("fork", "spawn", "forkserver"))
    p.add_argument("--persistent", action="store_true")
    p.add_argument("--prefetch", type=int, default=2)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--stop-after", type=int, default=-1)
    p.add_argument("--kill", type=int, default=-1)
    p.add_argument("--raise", dest="raise_", type=int, default=-1)
    p.add_argument("--library", action="store_true")
    p.add_argument("--no-filter-per-worker", action="store_true")
    args = p.parse_args()
    torch.manual_seed(0)
    np.random.seed(0)  # DGL shuffles with numpy's generator
    dl = loader(args)
    if args.library:
        from instrumented_convs import registry
        from instrumented_convs.testing import open_steps
        from instrumented_convs.workers import instrument_loader, loaders_result

        instrument_loader(dl)
    try:
        for epoch in range(args.epochs):
            for n, batch in enumerate(dl):
                print("batch", epoch, n, digest(batch), flush=True)
                if n + 1 == args.stop_after:
                    break
    finally:
        if args.library:
            try:  # the first call: a signal pending now finds the default handler
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            except RuntimeError:  # torch's handler fired before it: again
                _quiet_child_signals()
            result = loaders_result()
            for w in result["workers"]:
                w.pop("calls")
            print("RESULT", json.dumps(result), flush=True)
            rows = [(r.name, r.count) for r in registry.summary()]
            print("ROWS", json.dumps(rows), flush=True)
            print("OPEN", json.dumps(open_steps()), flush=True)
    print("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
