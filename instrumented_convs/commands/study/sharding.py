"""Which rank this process is, its share of the training nodes, and PyG's sampler check.

Helpers of the mini-batch study (:mod:`.minibatch`): under ``torch.distributed`` every rank
trains on a share of the training nodes of the same size (:func:`shard`), so that every
rank runs the same number of batches.
"""

from __future__ import annotations

from typing import Tuple

import torch
from torch import Tensor

from .data import MissingDependency

__all__ = ["require_pyg_sampler", "rank_and_world", "shard"]


def require_pyg_sampler() -> None:
    """Raise :class:`MissingDependency` unless PyG's ``NeighborLoader`` can sample here.

    PyG samples with pyg-lib or, failing that, torch-sparse; with neither, ``NeighborLoader``
    builds but its first batch raises. Say so before generating the data.
    """
    import torch_geometric.typing as pyg_typing

    if not (pyg_typing.WITH_PYG_LIB or pyg_typing.WITH_TORCH_SPARSE):
        raise MissingDependency(
            "PyG's NeighborLoader needs pyg-lib or torch-sparse to sample neighbours, and "
            "neither is installed here. Install pyg-lib (pip install pyg-lib -f https://data.pyg.org/whl/"
            "torch-<torch version>+<cpu|cuXYZ>.html) or torch-sparse (pip install "
            "instrumented_convs[sparse], or a wheel from https://data.pyg.org/whl/), or run "
            "--platform dgl: DGL's sampler needs nothing more."
        )


def rank_and_world() -> Tuple[int, int]:
    """This process's rank and the number of ranks (``(0, 1)`` outside ``torch.distributed``)."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def shard(nodes: Tensor, rank: int, world: int) -> Tensor:
    """Rank ``rank``'s share of ``nodes`` (every ``world``-th node), all shares the same size.

    Padded by wrapping around to the first nodes, as torch's ``DistributedSampler`` and DGL's
    ``use_ddp`` do, so every rank runs the same number of batches.
    """
    if nodes.numel() == 0:
        raise ValueError("no nodes to share out")
    per = -(-nodes.numel() // world)
    padded = nodes.repeat(-(-per * world // nodes.numel()))[: per * world]
    return padded[rank::world]
