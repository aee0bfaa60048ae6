#!/usr/bin/env bash
# The duty cycle on a GPU (issue 39), one short call of the device machine (about 5 minutes):
# the C fast path built there, the cycle's tests (tests/test_cycle.py), the launch-bound proxy
# on CUDA with the cycle's variants (one in 10, a 1% budget, nothing drawn) beside stock,
# defaults and the A/A floor (PyG layers: the machine has no CUDA build of DGL), and the
# sampled table against a full recording at Cora's and arxiv's shapes (benchmarks/fidelity.py).
# Results under $OUT: log.txt, launch_bound.json, fidelity.json. scripts/gpu.sh runs the same
# benchmarks among all the others.
#
#   bash scripts/gpu_cycle.sh                 # on the GPU machine (OUT set by the tool)
#   bash scripts/gpu_cycle.sh --device cpu    # the plumbing, on a CPU
set -uo pipefail
device=cuda
if [ "${1:-}" = --device ]; then device=$2; fi
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
py=${PYTHON:-python3}
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
exec > >(tee "$out/log.txt") 2>&1
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 DGLBACKEND=pytorch
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
failed=0
run() {  # run SECONDS COMMAND...: under a limit; count a failure
  local limit=$1; shift
  echo "== $* (limit ${limit} s)"
  timeout "$limit" "$@" || { echo "!! exit $?"; failed=$((failed + 1)); }
}
run 120 "$py" setup.py -q build_ext --inplace
"$py" -c 'from instrumented_convs.core import native; print("fast path:", native.IMPLEMENTATION)'
"$py" -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA")'
run 120 "$py" -m pytest -p no:cacheprovider -q -x tests/test_cycle.py -k "not rank" \
  -W ignore::DeprecationWarning
run 300 "$py" -W ignore::UserWarning benchmarks/launch_bound.py --device "$device" --rounds 40 \
  --warmup 3 --no-profiler --layers "PyG GCNConv" "PyG SAGEConv" "PyG GATConv" "PyG GINConv" \
  --json "$out/launch_bound.json"
run 150 "$py" -W ignore::UserWarning benchmarks/fidelity.py --device "$device" --platforms pyg \
  --json "$out/fidelity.json"
echo "failed: $failed"
exit "$failed"
