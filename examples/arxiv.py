"""The ogbn-arxiv study: a 3-layer GCN trained with instrumented PyG or DGL layers.

The study is a published profiling of a 3-layer GCN on ogbn-arxiv and Cora with PyG and DGL,
which timed the layers' internal steps by copying the layers' source and inserting timers;
this example runs its ogbn-arxiv part with the instrumented layers instead.
Model: in -> 128 -> 128 -> classes, ReLU, log_softmax; Adam (lr 0.01), NLL loss, 100 epochs.
Each epoch is timed by phase (forward, loss, backward, optimizer.step) and every step inside
the convolution layers is timed too. Prints the accuracy, the epoch-level table and the
per-step table.

The default dataset, synthetic-arxiv, is a generated graph of ogbn-arxiv's shape (169,343
nodes, 1,166,243 directed edges made symmetric, 128 features, 40 classes, the same split
sizes) whose labels are learnable, deterministic given --seed. --dataset ogbn-arxiv uses
the real ogb loaders when the data is under --root.

    python examples/arxiv.py --platform pyg
    python examples/arxiv.py --platform pyg --sparse       # SparseTensor adj_t (fused path)
    python examples/arxiv.py --platform dgl --epochs 10
"""

import sys

from instrumented_convs.commands.study import study_main

if __name__ == "__main__":
    sys.exit(study_main(__doc__, ("synthetic-arxiv", "ogbn-arxiv"), "synthetic-arxiv"))
