"""The study's graph-augmentation loop (GraphSAINT with MH-Aug), reduced to its bottleneck.

Besides the 3-layer GCN of examples/arxiv.py and examples/cora.py, the published profiling
this package grew out of also profiled GraphSAINT training with MH-Aug graph augmentation.
Each iteration of its augmentation loop draws how much of the graph to drop, builds an
augmented graph, and evaluates the AGGNet (a 2-hop GraphConv on 1-dimensional features of
ones, allow_zero_in_degree=True) several times on the original and on the augmented graph
to compute the acceptance ratio. The study found that aggregation loop to be the bottleneck,
with many device-to-host copies. Here every phase is a region(), the AGGNet's GraphConv
layers record their steps, and every device-to-host copy the loop makes (``.item()``) is a
``d2h_copy`` step, so the table shows where the loop spends its time and how many copies it
makes per iteration.

    python examples/aggnet.py                       # Cora-shaped generated graph, 20 iterations
    python examples/aggnet.py --dataset synthetic-arxiv --iterations 5 --device cuda
"""

import argparse
import logging
import os
import sys

os.environ.setdefault("DGLBACKEND", "pytorch")

import dgl  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from instrumented_convs import region, registry  # noqa: E402
from instrumented_convs.commands.study import SHAPES, load_graph  # noqa: E402
from instrumented_convs.dgl import GraphConv  # noqa: E402
from instrumented_convs.layers import step  # noqa: E402


class AGGNet(torch.nn.Module):
    """The augmentation study's AGGNet: ``num_hop`` GraphConv(1, 1) layers on features of ones."""

    def __init__(self, num_hop: int = 2, dropout: float = 0.0) -> None:
        super().__init__()
        self.dropout = dropout
        self.convs = torch.nn.ModuleList(
            [GraphConv(1, 1, allow_zero_in_degree=True) for _ in range(num_hop)]
        )

    def forward(self, graph: dgl.DGLGraph) -> torch.Tensor:
        """Aggregate ``graph.ndata['feat']`` over ``num_hop`` hops."""
        feat = graph.ndata["feat"]
        for conv in self.convs[:-1]:
            feat = F.dropout(conv(graph, feat), p=self.dropout, training=self.training)
        return self.convs[-1](graph, feat)


def truncnorm(mean: float, std: float, gen: torch.Generator) -> float:
    """A draw from a normal clipped to [0, 1] (the study used scipy's truncnorm)."""
    return float(min(max(mean + std * torch.randn((), generator=gen).item(), 0.0), 1.0))


def run(args: argparse.Namespace) -> None:
    """The augmentation loop with its phases timed."""
    dataset = "synthetic-quick" if args.quick else args.dataset
    iterations = min(args.iterations, 3) if args.quick else args.iterations
    data = load_graph(dataset, seed=args.seed)
    dev = torch.device(args.device)
    gen = torch.Generator().manual_seed(args.seed)
    src, dst = data.edge_index.to(dev)
    n, e = data.num_nodes, data.num_edges
    with region("initialize"):
        g = dgl.add_self_loop(dgl.graph((src, dst), num_nodes=n)).to(dev)
        g.ndata["feat"] = torch.ones(n, 1, device=dev)
        node_kept = torch.ones(n, device=dev)
        edge_kept = torch.ones(e, dtype=torch.bool, device=dev)
        torch.manual_seed(args.seed)
        agg = AGGNet(num_hop=2).to(dev).eval()
    accepted = 0
    iterator = range(iterations)
    if not args.no_progress:
        from tqdm.auto import tqdm

        iterator = tqdm(iterator, desc="augmentation loop", unit="it", leave=False)
    for _ in iterator:
        with region("calculate_delta_value"):
            with step("d2h_copy"):
                delta_e = 1 - edge_kept.sum().item() / e
            with step("d2h_copy"):
                delta_v = 1 - node_kept.sum().item() / n
            delta_e_aug = truncnorm(delta_e, args.sigma, gen)
            delta_v_aug = truncnorm(delta_v, args.sigma, gen)
        with region("graph_augmentation"):
            keep_e = torch.rand(e, generator=gen).to(dev) >= delta_e_aug
            keep_v = (torch.rand(n, generator=gen).to(dev) >= delta_v_aug).float()
            aug_g = dgl.add_self_loop(dgl.graph((src[keep_e], dst[keep_e]), num_nodes=n))
            aug_g.ndata["feat"] = keep_v.unsqueeze(1)
        with torch.no_grad():
            with region("ego_message_passing"):
                org_ego = agg(g)
            with region("augmented_delta"):  # the study's four aggregations
                d_e = 1 - (agg(g) / org_ego).squeeze(1)
                d_aug_e = 1 - (agg(aug_g) / org_ego).squeeze(1)
                d_v = 1 - (agg(g) / org_ego).squeeze(1)
                d_aug_v = 1 - (agg(aug_g) / org_ego).squeeze(1)
        with region("accept"):
            ratio = torch.exp(-(d_aug_e - d_e).abs().mean() - (d_aug_v - d_v).abs().mean())
            with step("d2h_copy"):
                a = ratio.item()
            if torch.rand((), generator=gen).item() < a:
                edge_kept, node_kept = keep_e, keep_v
                accepted += 1
    s = registry.summary()
    copies = sum(r.count for r in s if r.step in ("d2h_copy", "zero_in_degree_check"))
    print(f"{data.describe()}; {iterations} iterations, {accepted} augmentations accepted")
    print(f"device-to-host copies: {copies} ({copies / iterations:.1f} per iteration)")
    print(s.table(title="Augmentation loop"))


def main(argv=None) -> int:
    """Parse the flags and run the loop."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--dataset",
        choices=sorted(SHAPES),
        default="synthetic-cora",
        help="generated graph shape to augment (default: Cora's)",
    )
    parser.add_argument("--iterations", type=int, default=20, help="augmentation-loop iterations")
    parser.add_argument(
        "--sigma",
        type=float,
        default=0.03,
        help="std of the drop-rate proposal (the study's: 0.03)",
    )
    parser.add_argument("--device", default="cpu", help="cpu or cuda (needs a CUDA build of DGL)")
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the graph and of the proposals"
    )
    parser.add_argument(
        "--quick", action="store_true", help="a tiny graph and 3 iterations: a smoke run"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
