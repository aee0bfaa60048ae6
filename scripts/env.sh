#!/usr/bin/env bash
# Build (once) and print the directory of one of our pinned virtual environments.
#
#   scripts/env.sh main   # Python 3.11, torch 2.13.0 CPU, PyG 2.8.1, dgl 1.1.3, torch-sparse
#   scripts/env.sh dgl2   # Python 3.11, torch 2.2.1, dgl 2.1.0
#
# Environments live outside the clone, in $INSTRUMENTED_CONVS_CACHE (default
# ~/.cache/instrumented_convs/envs), keyed by a hash of the pinned requirement files, so
# every CI run and every clone reuses them and a fresh machine builds each one once.
# A build goes to a temporary folder and is renamed into place only when complete.
set -euo pipefail
name=${1:?usage: scripts/env.sh main|dgl2}
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${INSTRUMENTED_CONVS_CACHE:-$HOME/.cache/instrumented_convs}
py=${PYTHON:-python3.11}
shopt -s nullglob
files=("$root"/requirements/"$name".txt "$root"/requirements/"$name"-*.txt)
[ -f "${files[0]}" ] || { echo "no requirements/$name.txt" >&2; exit 2; }
hash=$( { "$py" -c 'import sys; print(sys.version)'; cat "${files[@]}"; } | sha256sum | cut -c1-12)
dir=$cache/envs/$name-$hash
mkdir -p "$cache/envs"
exec 9>"$cache/envs/.$name.lock"
flock 9
if [ ! -f "$dir/.complete" ]; then
  echo "building environment $name in $dir (once per machine)" >&2
  tmp=$dir.building
  rm -rf "$tmp"
  "$py" -m venv "$tmp"
  pip=("$tmp/bin/python" -m pip install --disable-pip-version-check --progress-bar off -q)
  "${pip[@]}" -r "$root/requirements/$name.txt" >&2
  if [ -f "$root/requirements/$name-compiled.txt" ]; then
    # C++ extensions compiled against the torch just installed (pip caches the wheels).
    MAX_JOBS=${MAX_JOBS:-2} "${pip[@]}" --no-build-isolation -r "$root/requirements/$name-compiled.txt" >&2
  fi
  if [ -f "$root/requirements/$name-nodeps.txt" ]; then
    "${pip[@]}" --no-deps -r "$root/requirements/$name-nodeps.txt" >&2
  fi
  # A venv's scripts name its folder in their shebang lines: fix them after the rename.
  mv "$tmp" "$dir"
  grep -rlI --null "$tmp" "$dir/bin" 2>/dev/null | xargs -0 -r sed -i "s#$tmp#$dir#g"
  touch "$dir/.complete"
fi
echo "$dir"
