"""Mini-batch training on neighbour-sampled subgraphs, PyG and DGL, with the loader timed too.

The study's full-graph loop (:mod:`.loop`) does not fit a graph of ogbn-products' size, and
where the time goes then includes the loader: each timed epoch's batches are sampled,
copied and trained on under regions of their own (:func:`train_minibatch`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from instrumented_convs import configure, region

from .data import GraphData
from .models import build_model
from .sharding import rank_and_world, require_pyg_sampler, shard

__all__ = [
    "FANOUTS",
    "BATCH_SIZE",
    "MiniBatchSetup",
    "MiniBatchResult",
    "setup",
    "make_loader",
    "to_device",
    "train_minibatch",
    "evaluate",
    "describe",
]

#: Neighbours sampled per hop, from the seed nodes outward (PyG's ogbn-products example).
FANOUTS: Tuple[int, ...] = (15, 10, 5)
#: Seed (training) nodes per mini-batch.
BATCH_SIZE = 1024


@dataclass
class MiniBatchSetup:
    """What mini-batch training needs: the data and graph on the host, the model on its device."""

    platform: str
    data: GraphData  #: on the host (the loaders sample there)
    graph: Any  #: PyG ``Data`` / DGL graph with self-loops, ``feat`` and ``label``; on the host
    net: torch.nn.Module  #: the model, on ``device``
    model: torch.nn.Module  #: ``net``, wrapped in ``DistributedDataParallel`` when distributed
    fanouts: Tuple[int, ...]
    batch_size: int
    device: torch.device
    rank: int = 0
    world: int = 1
    seed: int = 0
    num_workers: int = 0  #: loader worker processes (0: sample in the training process)


@dataclass
class MiniBatchResult:
    """What :func:`train_minibatch` measured (this rank's batches; accuracy over all ranks)."""

    epochs: int
    batches: int  #: mini-batches per epoch on this rank
    final_loss: float  #: mean loss over the last epoch's batches
    test_acc: float  #: accuracy on the evaluated test nodes (sampled neighbourhoods)
    test_nodes: int  #: test nodes evaluated, all ranks together


def setup(
    platform: str,
    data: GraphData,
    fanouts: Sequence[int] = FANOUTS,
    batch_size: int = BATCH_SIZE,
    hidden: int = 128,
    device: Any = "cpu",
    model: str = "gcn",
    seed: int = 0,
    num_workers: int = 0,
) -> MiniBatchSetup:
    """Build the study's model for ``platform`` and the graph its loader samples from.

    ``data`` stays on the host. One fanout per layer (the study's model has 3). When
    ``torch.distributed`` is initialised the model is wrapped in ``DistributedDataParallel``
    (``device_ids=[device]`` on CUDA, none on CPU). With ``num_workers`` the loaders sample
    in worker processes and ``sample`` times how long training waits for the next batch.
    """
    if platform == "pyg":
        require_pyg_sampler()
    device = torch.device(device)
    torch.manual_seed(seed)
    net, graph = build_model(platform, data, hidden, model=model)
    if len(fanouts) != len(net.convs):
        raise ValueError(
            f"the model has {len(net.convs)} layers: give as many fanouts, not {list(fanouts)}"
        )
    rank, world = rank_and_world()
    if platform == "pyg":
        from torch_geometric.data import Data

        graph = Data(x=data.x, y=data.y, edge_index=data.edge_index)
    else:  # build_model added the self-loops: every sampled destination node has an in-edge
        import dgl

        graph.ndata["feat"], graph.ndata["label"] = data.x, data.y
        dgl.seed(seed + rank)  # DGL's sampling RNG; each rank samples its own neighbourhoods
    net = net.to(device)
    wrapped = net
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel

        if device.type == "cuda":  # one device per process; gloo on CPU takes no device_ids
            index = device.index if device.index is not None else torch.cuda.current_device()
            wrapped = DistributedDataParallel(net, device_ids=[index], output_device=index)
        else:
            wrapped = DistributedDataParallel(net)
    return MiniBatchSetup(
        platform,
        data,
        graph,
        net,
        wrapped,
        tuple(fanouts),
        batch_size,
        device,
        rank,
        world,
        seed,
        num_workers,
    )


def make_loader(s: MiniBatchSetup, nodes: Tensor, train: bool = True) -> Any:
    """A neighbour-sampling loader over ``nodes`` (host-side; batches of ``s.batch_size``).

    ``train``: shuffled, and under ``torch.distributed`` this rank's equal share only (PyG:
    :func:`shard`; DGL: ``use_ddp=True``): every rank runs the same number of batches, or
    DDP's gradient all-reduce would wait forever in the backward of a rank that has one batch
    more. Otherwise in order, over ``nodes`` as given. Fanouts go from the seed nodes outward
    (PyG's ``num_neighbors`` order); DGL's ``NeighborSampler`` counts from the input layer, so
    it gets them reversed and both frameworks sample the same neighbourhoods.
    """
    workers = dict(num_workers=s.num_workers, persistent_workers=s.num_workers > 0)
    if s.platform == "pyg":
        from torch_geometric.loader import NeighborLoader

        if train and s.world > 1:
            nodes = shard(nodes, s.rank, s.world)
        return NeighborLoader(
            s.graph,
            num_neighbors=list(s.fanouts),
            batch_size=s.batch_size,
            input_nodes=nodes,
            shuffle=train,
            **workers,
        )
    import dgl

    sampler = dgl.dataloading.NeighborSampler(
        list(reversed(s.fanouts)), prefetch_node_feats=["feat"], prefetch_labels=["label"]
    )
    return dgl.dataloading.DataLoader(
        s.graph,
        nodes,
        sampler,
        batch_size=s.batch_size,
        shuffle=train,
        drop_last=False,
        use_ddp=train and s.world > 1,
        ddp_seed=s.seed,
        **workers,
    )


def to_device(s: MiniBatchSetup, batch: Any) -> Tuple[Tensor, Any, Tensor]:
    """Copy a batch to ``s.device``: ``(x, graph argument of the model, labels of the seeds)``."""
    if s.platform == "pyg":
        batch = batch.to(s.device)
        return batch.x, batch.edge_index, batch.y[: batch.batch_size]
    blocks = [block.to(s.device) for block in batch[2]]
    return blocks[0].srcdata["feat"], blocks, blocks[-1].dstdata["label"]


def train_minibatch(
    s: MiniBatchSetup,
    epochs: int = 3,
    lr: float = 0.01,
    warmup: int = 3,
    eval_nodes: Optional[int] = 20_000,
    on_batch: Optional[Callable[[], None]] = None,
    on_epoch: Optional[Callable[[int, float], None]] = None,
) -> MiniBatchResult:
    """``warmup`` untimed batches, then ``epochs`` timed epochs of mini-batches, then the
    test accuracy.

    Each epoch is ``region("epoch")`` with, per batch: ``sample``, the next batch from the
    loader (neighbour sampling, and gathering the batch's features and labels on the host:
    PyG's ``NeighborLoader`` collates them, DGL's ``NeighborSampler`` prefetches them);
    ``to_device``, the batch's copy to the device (PyG ``Data``, DGL blocks with their
    features and labels); ``forward`` (the layers' steps inside: PyG runs the 3-layer model
    on the whole sampled subgraph and keeps the seed nodes' rows, DGL one layer per block,
    each smaller than the last), ``loss``, ``backward`` and ``optimizer.step``. Warm-up
    batches run with instrumentation off, so the first, slower calls (allocations, lazy
    initialisation, DDP's first backward) do not skew the table. ``on_batch()`` is called
    after each timed batch, ``on_epoch(epoch, mean loss)`` after each epoch; ``eval_nodes``
    caps the test nodes evaluated (``None``: all).
    """
    opt = torch.optim.Adam(s.model.parameters(), lr=lr)
    s.model.train()
    loader = make_loader(s, s.data.train_idx, train=True)
    batches = len(loader)

    def one_batch(batch: Any) -> Tensor:
        with region("to_device"):
            x, graph, y = to_device(s, batch)
        opt.zero_grad()
        with region("forward"):
            out = s.model(x, graph)
        with region("loss"):
            loss = F.nll_loss(out[: y.size(0)], y)
        with region("backward"):
            loss.backward()
        with region("optimizer.step"):
            opt.step()
        return loss.detach()

    with configure(enabled=False):
        it = iter(loader)
        for _ in range(min(warmup, batches)):  # the same count on every rank
            one_batch(next(it))
        del it
    final = float("nan")
    for epoch in range(epochs):
        losses = []
        with region("epoch", device=s.device):
            it = iter(loader)
            for _ in range(batches):
                with region("sample"):
                    batch = next(it)
                losses.append(one_batch(batch))
                if on_batch is not None:
                    on_batch()
        final = float(torch.stack(losses).mean()) if losses else float("nan")
        if on_epoch is not None:
            on_epoch(epoch, final)
    test = s.data.test_idx if eval_nodes is None else s.data.test_idx[:eval_nodes]
    acc, count = evaluate(s, test)
    return MiniBatchResult(epochs, batches, final, acc, count)


def evaluate(s: MiniBatchSetup, nodes: Tensor) -> Tuple[float, int]:
    """Accuracy on ``nodes`` with the training fanouts (instrumentation off); ``(accuracy, count)``.

    Under ``torch.distributed`` each rank evaluates every ``world``-th node and the counts
    are summed over ranks (a collective: every rank must call it).
    """
    correct = total = 0
    mine = nodes[s.rank :: s.world]
    with configure(enabled=False), torch.no_grad():
        s.net.eval()
        if mine.numel():
            for batch in make_loader(s, mine, train=False):
                x, graph, y = to_device(s, batch)
                pred = s.net(x, graph)[: y.size(0)].argmax(dim=-1)
                correct += int((pred == y).sum())
                total += y.numel()
        s.net.train()
    counts = torch.tensor([correct, total], dtype=torch.float64, device=s.device)
    if s.world > 1:
        torch.distributed.all_reduce(counts)
    hit, count = counts.tolist()
    return (hit / count if count else float("nan")), int(count)


def describe(s: MiniBatchSetup, result: MiniBatchResult) -> str:
    """Lines a run prints: the data, the sampling, the loss and the accuracy."""
    dist = f", {s.world} ranks (DistributedDataParallel)" if s.world > 1 else ""
    return "\n".join(
        [
            s.data.describe(),
            f"{s.platform}: fanouts {','.join(map(str, s.fanouts))} (from the seeds outward), "
            f"batch size "
            f"{s.batch_size}, {result.batches} batch{'es' if result.batches != 1 else ''} per "
            f"epoch{' per rank' if dist else ''}{dist}",
            f"{result.epochs} timed epochs, final loss {result.final_loss:.4f} (mean of the last "
            f"epoch's batches{' on rank 0' if dist else ''})",
            f"Test accuracy {result.test_acc:.4f} on {result.test_nodes:,} test nodes, sampled "
            f"neighbourhoods "
            f"(chance {1 / s.data.num_classes:.4f})",
        ]
    )
