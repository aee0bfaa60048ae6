#!/usr/bin/env bash
# Issue 52 measured in one prepared call of the device machine (Python 3.12, torch 2.11 + CUDA
# 13, PyG 2.8.0, no DGL on CUDA, no torch-sparse, no nsys, no network): about 300 s of steps,
# each under its own limit (the limits add up to 485 s), its results under $OUT as three
# files (log.txt, summary.txt, results.tar.gz). The default steps, in order (the estimate of
# each, in seconds, from the H100 runs of docs/performance.md's "GPU" section, then its limit):
#   1. the C fast path built there (Python 3.12) and in use ............................ 10 / 20
#   2. the machine's facts: device, driver, clocks (nvidia-smi), versions (facts.json) . 10 / 40
#   3. what the first CUDA steps of a fresh process synchronise (gpu_checks.py
#      first-sync, warn then error, 30 s each at most) ................................. 25 / 65
#   4. a step on the CUDA clock, C clock and Python twin, against the raw cost of its two
#      event records made from C; epochs under cProfile (benchmarks/cuda_step.py) ....... 12 / 25
#   5. check --device cuda --sections cost accuracy: both at Cora's and arxiv's shapes .. 45 / 60
#   6. the GPU tests of tests/ (pytest -m gpu: the C clock on the device, lazily resolved
#      events, CUDA-graph capture, the backward's device thread, equivalence) ........... 45 / 60
#   7. `run` of the study's PyG GCN at Cora's shape (50 epochs), then its folder (page,
#      timeline, GPU track) and its host/device verdict: launch-bound ............. 12+5 / 25+20
#   8. the same at arxiv's shape (5 epochs): device-bound ........................ 14+5 / 25+20
#   9. the launch-bound proxy on CUDA (benchmarks/launch_bound.py, the four PyG layers, 10
#      rounds: every variant, the duty cycle's included, torch.profiler with CUPTI) ..... 70 / 85
#  10. where the cost goes, host or device, events or code (benchmarks/device_cost.py,
#      Cora's and arxiv's shapes) ..................................................... 18 / 30
#  11. the summary of it all, issue 52's goals PASS/FAIL (gpu_checks.py summary) ......... 1 / 10
# With --all, before the summary, the older steps (about 150 s more: a second call): check's
# other sections, a PyG DataLoader's workers under `run` (tests/scripts/loader_training.py)
# and their check, the duty cycle against a full recording (benchmarks/fidelity.py), forward
# steps against CUPTI's kernels (benchmarks/accuracy.py) and memory per step against the
# allocator (benchmarks/memory.py).
# With --fallbacks, instead (issue 64, about 200 s): the fast path built, the facts, then
# check's accuracy and environment sections with torch's private calls in use, then with the
# CUDA stream reader's fallback forced, the profiler label's, and every fallback at once
# (INSTRUMENTED_CONVS_FALLBACK): each must pass, the environment section naming the verdicts.
# With --cost, instead (issue 68's section 2, about 200 s): the fast path built, the facts,
# then steps 4, 5, 9 and 10 (a step's cost and its polls' parts, check's cost, the proxy, where
# the cost goes) and the summary.
# With --advice, instead (issue 68's section 1, about 450 s): the fast path built, the facts,
# then `run --advise` of the study's PyG GCN at Cora's shape (the advice must say host-bound),
# the same with --advise-compile (the compiled layers timed on the GPU), at arxiv's shape
# (cache-normalization), each folder's items and timed changes printed; then
# benchmarks/advice_truth.py --device cuda (three cases, 2 rounds): the stated savings against
# the changes applied.
# The run goes on when a step fails; the exit status is the number of failed steps. Wheels of
# missing packages (nvtx) travel in .whl/ (the device README says how) and are installed into
# /tmp/site when present.
#
#   bash scripts/gpu.sh                      # on the GPU machine: OUT=... set by the tool
#   bash scripts/gpu.sh --all                # and the older steps
#   bash scripts/gpu.sh --fallbacks          # torch's private calls' fallbacks, forced
#   bash scripts/gpu.sh --cost               # what the tool costs on the GPU, alone
#   bash scripts/gpu.sh --advice             # the advice on the GPU, its savings checked
#   bash scripts/gpu.sh --device cpu --quick # the same steps on a CPU: the plumbing (a test)
set -uo pipefail
device=cuda
quick=0
all=0
fallbacks=0
cost=0
advice=0
while [ $# -gt 0 ]; do
  case "$1" in
    --device) device=$2; shift 2 ;;
    --quick) quick=1; shift ;;
    --all) all=1; shift ;;
    --fallbacks) fallbacks=1; shift ;;
    --cost) cost=1; shift ;;
    --advice) advice=1; shift ;;
    *) echo "usage: bash scripts/gpu.sh [--device cuda|cpu] [--quick] [--all | --fallbacks | --cost | --advice]" >&2
       exit 2 ;;
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
slack=1  # the limits are the GPU machine's; a CPU (a test, beside others) gets three times them
[ "$device" = cpu ] && slack=3

step() {  # step NAME SECONDS COMMAND...: run it under a limit, note its status and time
  local name=$1 limit=$(( $2 * slack )) t0=$SECONDS rc
  shift 2
  echo "== $name ($(( SECONDS - start )) s so far)"
  if declare -F "$1" >/dev/null; then  # a function of this script: timeout runs programs
    timeout -k 10 "$limit" bash -c "$(declare -f "$1"); py=$py res=$res device=$device quick=$quick; $(printf '%q ' "$@")"
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
  check_args=(--quick) other_check_args=(--quick) epochs_cora=2 epochs_arxiv=1
  lb_args=(--quick --layers "PyG GCNConv") mem_shapes=(synthetic-cora)
  cs_args=(--n 500 --rounds 1 --epochs 5 --top 5) fid_args=(--quick --platforms pyg)
  dc_args=(--quick) ex_args=(--quick)  # the examples' own: a 1,000-node graph
else
  check_args=() other_check_args=() epochs_cora=50 epochs_arxiv=5
  lb_args=(--rounds 10 --warmup 1 --layers "PyG GCNConv" "PyG SAGEConv" "PyG GATConv"
    "PyG GINConv") mem_shapes=(synthetic-cora synthetic-arxiv)
  cs_args=(--n 5000 --rounds 5 --epochs 50 --top 30) fid_args=(--platforms pyg)
  dc_args=() ex_args=()
fi

build_fast_path() {  # for this Python (its own file name: a 3.11 build beside stays)
  "$py" setup.py -q build_ext --inplace >"$res/build.txt" 2>&1 || { cat "$res/build.txt"; return 1; }
  "$py" -c 'from instrumented_convs.core import native as n; print("fast path:", n.IMPLEMENTATION)
assert n.IMPLEMENTATION == "C"'
}
first_sync() {  # each mode in a fresh process: nothing of CUDA set up yet
  local rc=0 mode
  for mode in warn error; do  # a fresh process's import and CUDA start: 10-20 s
    local t0=$SECONDS r=0
    timeout -k 2 30 "$py" scripts/gpu_checks.py first-sync "$mode" || r=$?
    echo "first-sync ($mode): exit $r in $(( SECONDS - t0 )) s"
    [ "$r" = 0 ] || rc=1
  done
  return $rc
}
run_check() {  # check's verdict on a GPU; on a CPU (the plumbing, two cores beside other work,
  # where its accuracy lines judge noise) the report it wrote
  "$py" -W ignore::UserWarning -m instrumented_convs check "$@" \
    || { [ "$device" = cpu ] && test -s "$res/check.json"; }
}
folder_checks() {  # folder_checks SHAPE DEVICE EXPECT: the run folder, then its verdict
  local rc=0
  "$py" scripts/gpu_checks.py run-folder "$res/run-$1" --device "$2" || rc=1
  "$py" scripts/gpu_checks.py verdict "$res/run-$1" --device "$2" --expect "$3" \
    --json "$res/verdict-$1.json" || rc=1
  return $rc
}

step "the C fast path, built here" 20 build_fast_path
step "facts" 40 "$py" scripts/gpu_checks.py facts "$res/facts.json"

if [ "$fallbacks" = 1 ]; then
  # (on a CPU the plumbing only: its accuracy section, two cores beside other work, judges
  # noise; tests/test_private.py holds the fallbacks' numbers to the stock layer's there)
  sections=(accuracy environment)
  [ "$device" = cpu ] && sections=(environment)
  for names in "" raw_stream record_function all; do
    step "check --device $device, ${sections[*]}; fallbacks forced: ${names:-none}" 60 \
      env INSTRUMENTED_CONVS_FALLBACK="$names" "$py" -W ignore::UserWarning -m instrumented_convs \
      check --device "$device" "${check_args[@]}" --sections "${sections[@]}" --no-progress \
      --json "$res/check-fallback-${names:-none}.json"
  done
  echo "failed steps: ${#failed[@]}${failed[*]:+ (${failed[*]})}"
  tar -czf "$out/results.tar.gz" -C "$(dirname "$res")" "$(basename "$res")"
  exit "${#failed[@]}"
fi
if [ "$advice" = 1 ]; then
  truth_args=(--rounds 2 --cases "SAGEConv, fused-sparse" "GINConv, project-first"
    "SAGEConv, lower-precision")
  [ "$quick" = 1 ] && truth_args=(--quick --cases "GINConv, project-first")
  advised() {  # advised NAME EPOCHS EXPECT ARGS...: run --advise, then what it said
    local name=$1 n=$2 expect=$3 small=()
    shift 3
    [ "$quick" = 1 ] && small=(--quick)
    "$py" -W ignore::UserWarning -m instrumented_convs run --advise "$@" --quiet \
      -o "$res/advice-$name" "examples/${name%%-*}.py" --platform pyg --device "$device" \
      --epochs "$n" --no-progress "${small[@]}" || return 1
    "$py" scripts/gpu_checks.py advice "$res/advice-$name" --expect $expect
  }
  host_bound=host-bound cache=cache-normalization
  [ "$device" = cpu ] && host_bound="" cache=""  # (no verdict; a CPU's shares are its own)
  step "run --advise, Cora's shape: host-bound at stake" 60 advised cora "$epochs_cora" \
    "$host_bound"
  step "run --advise --advise-compile, Cora's shape: the compiled layers timed" 150 advised \
    cora-compiled "$epochs_cora" "" --advise-compile --advise-seconds 120
  step "run --advise, arxiv's shape: cache-normalization" 90 advised arxiv "$epochs_arxiv" \
    "$cache" --advise-seconds 60
  step "the stated savings against the changes applied (advice_truth.py)" 300 "$py" \
    -W ignore::UserWarning benchmarks/advice_truth.py --device "$device" "${truth_args[@]}" \
    --json "$res/advice_truth.json"
  echo "failed steps: ${#failed[@]}${failed[*]:+ (${failed[*]})}"
  tar -czf "$out/results.tar.gz" -C "$(dirname "$res")" "$(basename "$res")"
  exit "${#failed[@]}"
fi
nvidia-smi -q -d CLOCK,PERFORMANCE,POWER >"$res/nvidia-smi-before.txt" 2>&1 || true

if [ "$device" != cpu ] && [ "$cost" = 0 ]; then  # first: a fresh process, nothing of CUDA set up yet
  step "the first CUDA steps of a process: what synchronises (warn, error)" 65 first_sync
fi

step "a step on the CUDA clock against its raw event records, epochs under cProfile" 25 \
  "$py" -W ignore::UserWarning benchmarks/cuda_step.py --device "$device" "${cs_args[@]}" \
  --json "$res/cuda_step.json"

step "check --device $device --sections cost accuracy" 60 run_check --device "$device" \
  "${check_args[@]}" --sections cost accuracy --no-progress --json "$res/check.json"

[ "$cost" = 0 ] && step "the GPU tests of tests/ (pytest -m gpu)" 60 "$py" -m pytest -p no:cacheprovider -q -rs \
  -m gpu tests -W ignore::DeprecationWarning --junitxml "$res/pytest-gpu.xml"

shapes=(cora arxiv)
[ "$cost" = 1 ] && shapes=()
for shape in "${shapes[@]}"; do
  n=$([ "$shape" = cora ] && echo "$epochs_cora" || echo "$epochs_arxiv")
  expect=$([ "$shape" = cora ] && echo launch-bound || echo device-bound)
  step "run: the study's PyG GCN, $shape's shape, $n epochs" 25 "$py" -W ignore::UserWarning \
    -m instrumented_convs run --warmup 1 -o "$res/run-$shape" "examples/$shape.py" \
    --platform pyg --device "$device" --epochs "$n" --no-progress "${ex_args[@]}"
  step "run folder $shape: page, timeline, GPU track; host/device verdict $expect" 20 \
    folder_checks "$shape" "$device" "$expect"
done

step "launch-bound proxy on $device, torch.profiler and the duty cycle beside" 85 "$py" \
  -W ignore::UserWarning benchmarks/launch_bound.py --device "$device" "${lb_args[@]}" \
  --json "$res/launch_bound.json"

step "where the cost goes on $device: host or device, events or code" 30 "$py" \
  -W ignore::UserWarning benchmarks/device_cost.py --device "$device" "${dc_args[@]}" \
  --json "$res/device_cost.json"

if [ "$all" = 1 ]; then  # the older steps (issue 44's), not issue 52's
  step "check --device $device: the other sections" 150 "$py" -W ignore::UserWarning \
    -m instrumented_convs check --device "$device" "${other_check_args[@]}" \
    --sections equivalence sync environment --no-progress --json "$res/check-other.json"
  step "run: a PyG DataLoader's workers, the batches copied to $device" 120 "$py" \
    -W ignore::UserWarning -m instrumented_convs run -o "$res/run-loaders" \
    tests/scripts/loader_training.py --device "$device"
  step "run folder loaders: every batch taken, copies timed, workers on the timeline" 60 "$py" \
    scripts/gpu_checks.py loaders "$res/run-loaders" --device "$device"
  step "the duty cycle against a full recording on $device" 120 "$py" -W ignore::UserWarning \
    benchmarks/fidelity.py --device "$device" "${fid_args[@]}" --json "$res/fidelity.json"
  if [ "$quick" = 0 ] && [ "$device" != cpu ]; then
    step "accuracy: forward steps against CUPTI's kernels, arxiv" 90 "$py" -W ignore::UserWarning \
      benchmarks/accuracy.py --passes 20 --json "$res/accuracy.json"
  fi
  for shape in "${mem_shapes[@]}"; do
    step "memory per step against the allocator, $shape" 90 "$py" -W ignore::UserWarning \
      benchmarks/memory.py --device "$device" --shape "$shape" --json "$res/memory-$shape.json"
  done
  cp "$res/memory-synthetic-cora.json" "$res/memory.json" 2>/dev/null || true
fi
nvidia-smi -q -d CLOCK,PERFORMANCE,POWER >"$res/nvidia-smi-after.txt" 2>&1 || true

echo "== summary ($(( SECONDS - start )) s)"
timeout -k 5 10 "$py" scripts/gpu_checks.py summary "$res" | tee "$res/summary.txt"
echo "failed steps: ${#failed[@]}${failed[*]:+ (${failed[*]})}"
tar -czf "$out/results.tar.gz" -C "$(dirname "$res")" "$(basename "$res")"
cp "$res/summary.txt" "$out/summary.txt"
exit "${#failed[@]}"
