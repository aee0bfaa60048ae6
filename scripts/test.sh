#!/usr/bin/env bash
# Set up the pinned environments (once per machine) and run every check CI runs:
#   1. the test suite in the main environment (torch 2.13 CPU, PyG 2.8.1, dgl 1.1.3);
#   2. the Sphinx docs, warnings as errors;
#   3. smoke runs of the benchmarks;
#   4. a short study under real Nsight Systems, checking our NVTX ranges in its report
#      (installs Debian's nsight-systems first if it is missing and we are root);
#   5. the core and DGL tests, and the DGL nsys check, in the newest-DGL environment
#      (torch 2.2.1, dgl 2.1.0, nvtx 0.2.17).
# Usage: bash scripts/test.sh [extra pytest args]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1
export DGLBACKEND=pytorch

main=$(bash scripts/env.sh main)
echo "== main environment: $main"
# torch-sparse must import here: the SparseTensor equivalence tests must run, not skip.
"$main/bin/python" - <<'PY'
from importlib.metadata import version
import torch, torch_geometric, torch_sparse, torch_scatter, dgl, nvtx  # noqa: F401
print(" | ".join(f"{p} {version(p)}" for p in ("torch", "torch-geometric", "torch-sparse", "torch-scatter", "dgl", "nvtx")))
PY
"$main/bin/python" -m pytest -p no:cacheprovider -q -rs tests "$@"

echo "== docs (sphinx -W)"
rm -rf docs/_build
"$main/bin/python" -m sphinx -W --keep-going -q -b html docs docs/_build/html

echo "== benchmark smoke run"
"$main/bin/python" benchmarks/step_cost.py --n 2000 --rounds 1 >/dev/null
"$main/bin/python" -W ignore::UserWarning benchmarks/overhead.py --quick >/dev/null

echo "== Nsight Systems: our ranges in a real nsys report"
if ! command -v nsys >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  bash scripts/install_nsys.sh >/dev/null
fi
if command -v nsys >/dev/null 2>&1; then
  "$main/bin/python" scripts/nsys_check.py --python "$main/bin/python"
else
  echo "nsys missing and not root: cannot install Debian's nsight-systems; skipping the nsys check"
  if [ "${CI:-}" = true ]; then exit 1; fi
fi

dgl2=$(bash scripts/env.sh dgl2)
echo "== newest-DGL environment: $dgl2"
"$dgl2/bin/python" -c 'from importlib.metadata import version as v; print(" | ".join(f"{p} {v(p)}" for p in ("torch", "dgl", "nvtx")))'
"$dgl2/bin/python" -m pytest -p no:cacheprovider -q -rs \
  tests/test_core.py tests/test_report.py tests/test_cuda_timing.py tests/test_nvtx.py \
  $(ls tests/test_dgl*.py 2>/dev/null) "$@"
# nvtx 0.2.17 here: its ranges must reach nsys 2022.4 too (see docs/nsys.md)
"$dgl2/bin/python" scripts/nsys_check.py --python "$dgl2/bin/python" --platform dgl
