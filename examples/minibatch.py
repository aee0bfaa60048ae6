"""Mini-batch training on sampled neighbourhoods: where the time goes, loader included.

The study's 3-layer GCN (in -> 128 -> 128 -> classes, ReLU, log_softmax; Adam lr 0.01, NLL
loss) trained on neighbour-sampled mini-batches, as a graph of ogbn-products' size needs:
PyG's NeighborLoader with the instrumented GCNConv, or DGL's DataLoader + NeighborSampler
(one block per layer) with the instrumented GraphConv. Batches of 1,024 training nodes,
15, 10 and 5 neighbours per hop from the seed nodes outward. Each epoch is timed per batch:
``sample`` (the loader: sampling, and gathering the batch's features and labels), ``to_device``
(the host-to-device copy), ``forward`` with every step of the layers inside, ``loss``,
``backward`` (with the layers' backward steps) and ``optimizer.step``. Prints the final
loss, the test accuracy (on up to 20,000 test nodes, sampled neighbourhoods) and the table.

The graph is generated, of ogbn-products' shape by default: 2,449,029 nodes, 61,859,140
undirected edges (123,718,280 directed), 100 features, 47 classes, split 196,615 / 39,323 /
2,213,091 (about 11 GB of memory and two minutes to generate, extrapolated from --scale 0.1:
1.2 GB, 11 s). PyG runs the model on each batch's whole sampled subgraph; DGL on blocks that
shrink layer by layer. --scale shrinks nodes, edges and split
alike, keeping the mean degree (0.01: 24,490 nodes, 1.2 M edges, seconds). PyG needs
pyg-lib or torch-sparse to sample; DGL needs nothing more.

    python examples/minibatch.py --scale 0.01
    python examples/minibatch.py --platform dgl --scale 0.01 --epochs 5
    python examples/minibatch.py --platform dgl --device cuda --batch-size 4096
    python examples/minibatch.py --quick --no-progress          # a smoke run
    torchrun --nproc-per-node 2 examples/ddp.py --scale 0.01     # the same, data-parallel
"""

import sys

from instrumented_convs.commands.study.minibatch_cli import minibatch_main

if __name__ == "__main__":
    sys.exit(minibatch_main(__doc__))
