#!/usr/bin/env bash
# Set up the main environment (once per machine) and run the demo: the seeds' study for
# PyG and DGL on a generated ogbn-arxiv-shaped graph, side by side (python -m
# instrumented_convs compare; extra flags pass through, e.g. --epochs 100 --plot out.png).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
main=$(bash "$root/scripts/env.sh" main)
cd "$root"
export DGLBACKEND=pytorch
PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" exec "$main/bin/python" -m instrumented_convs compare "$@"
