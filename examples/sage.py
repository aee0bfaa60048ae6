"""GraphSAGE on Cora's shape: SAGEConv -> ReLU -> SAGEConv -> ReLU -> SAGEConv -> log_softmax.

The study's model is a 3-layer GCN; this example runs the same network, loop and data with
GraphSAGE layers instead: three SAGEConv layers with mean aggregation (in -> 128 -> 128 ->
classes, Adam lr 0.01), PyG's instrumented SAGEConv(in, out) and DGL's instrumented
SAGEConv(in, out, "mean") side by side, as ``python -m instrumented_convs compare --model sage``.
It prints each framework's accuracy and per-step tables, then one table of both frameworks'
time per epoch aligned by role: dense transform (PyG lin_l + lin_r, DGL fc_neigh + fc_self)
and sparse aggregation (PyG propagate, DGL update_all); SAGEConv has no normalisation or bias
step of its own (the biases are inside the linear layers).

PyG takes edge_index (or a SparseTensor with --with-sparse); DGL takes the graph with
self-loops added, as in the GCN study, so DGL's neighbourhood mean includes the node itself.
The default dataset, synthetic-cora, is a generated graph of Cora's shape (2,708 nodes, 10,556
directed edges, 1,433 features, 7 classes); every flag of ``compare`` passes through:

    python examples/sage.py
    python examples/sage.py --epochs 20 --quick --no-progress
    python examples/sage.py --dataset synthetic-arxiv --plot sage.png
"""

import sys

from instrumented_convs.commands.study.cli import main

if __name__ == "__main__":
    args = sys.argv[1:]
    if not any(a == "--dataset" or a.startswith("--dataset=") for a in args):
        args = ["--dataset", "synthetic-cora"] + args
    sys.exit(main(["compare", "--model", "sage"] + args))
