#!/usr/bin/env bash
# Every GPU claim of the library, proven in one prepared run (issue 44): one command for the
# device machine (Python 3.12, torch 2.11 + CUDA 13, PyG 2.8.0, no DGL, no torch-sparse, no
# nsys, no network), about 5 minutes, its results under $OUT as few files:
#   0. the machine's facts: device, driver, clocks (nvidia-smi), versions (facts.json);
#   1. the C fast path built there (Python 3.12) and in use;
#   2. python -m instrumented_convs check --device cuda --json check.json;
#   3. the GPU tests of tests/ (pytest -m gpu: CUDA events resolved lazily, CUDA-graph capture,
#      backward on the device thread, equivalence on the device);
#   4. the study's GCN with PyG at Cora's and arxiv's shapes under `run` (table, page,
#      timeline: the GPU track from the steps' own events, checked by scripts/gpu_checks.py);
#      and a PyG DataLoader with 2 worker processes, pinned batches copied non_blocking
#      (tests/scripts/loader_training.py): its workers and copies (gpu_checks.py loaders);
#   5. the launch-bound proxy (benchmarks/launch_bound.py --device cuda: stock, defaults,
#      no statements, timeline, backward off, disabled, the duty cycle at one in 10, under a
#      1% budget and drawing nothing, A/A, torch.profiler with CUPTI), and the duty cycle's
#      table against a full recording (benchmarks/fidelity.py, PyG, Cora's and arxiv's shapes);
#   6. each step against the kernels CUPTI saw inside its label (check's section 2, forward and
#      backward, at Cora's and arxiv's shapes; benchmarks/accuracy.py, forward, arxiv);
#   7. memory per step against the allocator's own figures (benchmarks/memory.py);
#   8. what the first CUDA steps of a fresh process synchronise (scripts/gpu_checks.py
#      first-sync), and where a step's cost goes on the device (benchmarks/cuda_step.py: its
#      CUDA calls one by one, training epochs under cProfile);
#   9. the summary of it all (scripts/gpu_checks.py summary), and the files packed.
# Every step runs under its own time limit and the run goes on when one fails; the exit status
# is the number of failed steps. Wheels of missing packages (nvtx) travel in .whl/ (the device
# README says how) and are installed into /tmp/site when present.
#
#   bash scripts/gpu.sh                      # on the GPU machine: OUT=... set by the tool
#   bash scripts/gpu.sh --device cpu --quick # the same steps on a CPU: the plumbing (a test)
set -uo pipefail
device=cuda
quick=0
while [ $# -gt 0 ]; do
  case "$1" in
    --device) device=$2; shift 2 ;;
    --quick) quick=1; shift ;;
    *) echo "usage: bash scripts/gpu.sh [--device cuda|cpu] [--quick]" >&2; exit 2 ;;
  esac
done
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
py=${PYTHON:-python3}
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
res=$(mktemp -d)/gpu-results
mkdir -p "$res"
exec > >(tee "$out/log.txt") 2>&1
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 DGLBACKEND=pytorch
start=$SECONDS
failed=()

step() {  # step NAME SECONDS COMMAND...: run it under a limit, note its status and time
  local name=$1 limit=$2 t0=$SECONDS rc
  shift 2
  echo "== $name ($(( SECONDS - start )) s so far)"
  if declare -F "$1" >/dev/null; then  # a function of this script: timeout runs programs
    timeout -k 10 "$limit" bash -c "$(declare -f "$1"); py=$py res=$res; $(printf '%q ' "$@")"
  else
    timeout -k 10 "$limit" "$@"
  fi
  rc=$?
  echo "-- $name: exit $rc in $(( SECONDS - t0 )) s"
  echo "step | $name | exit $rc | $(( SECONDS - t0 )) s" >>"$res/steps.txt"
  [ "$rc" = 0 ] || failed+=("$name")
}

if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
if [ "$quick" = 1 ]; then  # the plumbing: every step, the smallest sizes
  check_args=(--quick --sections equivalence sync environment) epochs_cora=2 epochs_arxiv=1
  lb_args=(--quick --no-profiler --layers "PyG GCNConv") mem_shapes=(synthetic-cora)
  cs_args=(--n 500 --rounds 1 --epochs 5 --top 5) fid_args=(--quick --platforms pyg)
else
  check_args=() epochs_cora=50 epochs_arxiv=5 lb_args=(--rounds 20 --warmup 3 --layers
    "PyG GCNConv" "PyG SAGEConv" "PyG GATConv" "PyG GINConv" "DGL GraphConv")
  mem_shapes=(synthetic-cora synthetic-arxiv)
  cs_args=(--n 5000 --rounds 5 --epochs 200 --top 30) fid_args=(--platforms pyg)
fi

build_fast_path() {  # for this Python (its own file name: a 3.11 build beside stays)
  "$py" setup.py -q build_ext --inplace >"$res/build.txt" 2>&1 || { cat "$res/build.txt"; return 1; }
  "$py" -c 'from instrumented_convs.core import native as n; print("fast path:", n.IMPLEMENTATION)
assert n.IMPLEMENTATION == "C"'
}
step "the C fast path, built here" 120 build_fast_path
step "facts" 60 "$py" scripts/gpu_checks.py facts "$res/facts.json"
nvidia-smi -q -d CLOCK,PERFORMANCE,POWER >"$res/nvidia-smi-before.txt" 2>&1 || true

if [ "$device" != cpu ]; then  # first: a fresh process, nothing of CUDA set up yet
  for mode in warn error; do
    step "the first CUDA steps of a process: what synchronises ($mode)" 60 "$py" \
      scripts/gpu_checks.py first-sync "$mode"
  done
fi

step "check --device $device" 210 "$py" -W ignore::UserWarning -m instrumented_convs check \
  --device "$device" "${check_args[@]}" --no-progress --json "$res/check.json"

step "the GPU tests of tests/ (pytest -m gpu)" 150 "$py" -m pytest -p no:cacheprovider -q -rs \
  -m gpu tests -W ignore::DeprecationWarning --junitxml "$res/pytest-gpu.xml"

for shape in cora arxiv; do
  n=$([ "$shape" = cora ] && echo "$epochs_cora" || echo "$epochs_arxiv")
  step "run: the study's PyG GCN, $shape's shape, $n epochs" 120 "$py" -W ignore::UserWarning \
    -m instrumented_convs run --warmup 1 -o "$res/run-$shape" "examples/$shape.py" \
    --platform pyg --device "$device" --epochs "$n" --no-progress
  step "run folder $shape: page, timeline, GPU track" 60 "$py" scripts/gpu_checks.py \
    run-folder "$res/run-$shape" --device "$device"
done

step "run: a PyG DataLoader's workers, the batches copied to $device" 120 "$py" -W ignore::UserWarning \
  -m instrumented_convs run -o "$res/run-loaders" tests/scripts/loader_training.py --device "$device"
step "run folder loaders: every batch taken, copies timed, workers on the timeline" 60 "$py" \
  scripts/gpu_checks.py loaders "$res/run-loaders" --device "$device"

step "launch-bound proxy on $device" 150 "$py" -W ignore::UserWarning benchmarks/launch_bound.py \
  --device "$device" "${lb_args[@]}" --json "$res/launch_bound.json"

step "the duty cycle against a full recording on $device" 120 "$py" -W ignore::UserWarning \
  benchmarks/fidelity.py --device "$device" "${fid_args[@]}" --json "$res/fidelity.json"

step "a step's parts on $device, and epochs under cProfile" 90 "$py" -W ignore::UserWarning \
  benchmarks/cuda_step.py --device "$device" "${cs_args[@]}" --json "$res/cuda_step.json"

if [ "$quick" = 0 ] && [ "$device" != cpu ]; then
  step "accuracy: forward steps against CUPTI's kernels, arxiv" 90 "$py" -W ignore::UserWarning \
    benchmarks/accuracy.py --passes 20 --json "$res/accuracy.json"
fi

for shape in "${mem_shapes[@]}"; do
  step "memory per step against the allocator, $shape" 90 "$py" -W ignore::UserWarning \
    benchmarks/memory.py --device "$device" --shape "$shape" --json "$res/memory-$shape.json"
done
cp "$res/memory-synthetic-cora.json" "$res/memory.json" 2>/dev/null || true
nvidia-smi -q -d CLOCK,PERFORMANCE,POWER >"$res/nvidia-smi-after.txt" 2>&1 || true

echo "== summary ($(( SECONDS - start )) s)"
"$py" scripts/gpu_checks.py summary "$res" | tee "$res/summary.txt"
echo "failed steps: ${#failed[@]}${failed[*]:+ (${failed[*]})}"
tar -czf "$out/results.tar.gz" -C "$(dirname "$res")" "$(basename "$res")"
cp "$res/summary.txt" "$out/summary.txt"
exit "${#failed[@]}"
