"""The Cora study: GCNConv -> ReLU -> GCNConv -> ReLU -> GCNConv -> log_softmax.

The study is a published profiling of a 3-layer GCN on ogbn-arxiv and Cora with PyG and DGL,
which timed the layers' internal steps by copying the layers' source and inserting timers;
this example runs its Cora part with the instrumented layers instead.
The same 3-layer GCN as examples/arxiv.py (hidden 128, Adam lr 0.01), on Cora: 2,708 nodes,
10,556 directed edges, 1,433 features, 7 classes, the Planetoid split (140/500/1,000).
The default dataset, synthetic-cora, is a generated graph of that shape; --dataset cora uses
PyG's Planetoid loader when the files are under --root.

    python examples/cora.py --platform pyg --epochs 200
    python examples/cora.py --platform dgl
"""

import sys

from instrumented_convs.commands.study import study_main

if __name__ == "__main__":
    sys.exit(study_main(__doc__, ("synthetic-cora", "cora"), "synthetic-cora"))
