#!/usr/bin/env bash
# Set up the main environment (once per machine: about 3 minutes, no compiling) and run the
# demo: the 3-layer GCN of a published profiling study of PyG and DGL, on a generated graph
# of ogbn-arxiv's shape, both frameworks side by side (python -m instrumented_convs demo;
# extra flags pass through, e.g. --epochs 100 --plot breakdown.png; --with-sparse also runs
# PyG with SparseTensor input, and builds torch-sparse for it the first time).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
main=$(bash "$root/scripts/env.sh" main)
path="$root${PYTHONPATH:+:$PYTHONPATH}"
for arg in "$@"; do
  if [ "$arg" = --with-sparse ]; then
    # PyG with SparseTensor input needs torch-sparse: compiled once (~10 CPU-minutes)
    path="$path:$(bash "$root/scripts/env.sh" sparse)"
  fi
done
cd "$root"
export DGLBACKEND=pytorch
PYTHONPATH="$path" exec "$main/bin/python" -m instrumented_convs demo "$@"
