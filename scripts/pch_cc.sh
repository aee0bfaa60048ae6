#!/usr/bin/env bash
# The C++ compiler for the torch-scatter/torch-sparse build (scripts/env.sh sparse, as CXX):
# g++ with -O1 for their -O3, and with torch's headers precompiled once per set of flags.
# Each of their 32 sources spends most of its compile on torch's headers and their
# templates; a precompiled header and -O1 make the whole build less than half as long
# (docs/performance.md). The libraries' results are the same (no fast-math either way);
# only their speed differs, and CI's tests compare our layers with stock ones on them.
# A header that cannot be built or used (-Winvalid-pch says so in the log) falls back to
# the plain compile: slower, never different.
#   PCH_CC_DIR   folder for the precompiled headers (required)
#   PCH_CC_REAL  the compiler (default g++)
set -euo pipefail
real=${PCH_CC_REAL:-g++}
dir=${PCH_CC_DIR:?PCH_CC_DIR: a folder for the precompiled headers}
args=() src= key=()
while [ $# -gt 0 ]; do
  case $1 in
    -O3) args+=(-O1); key+=(-O1) ;;
    -o|-MF) args+=("$1" "$2"); shift ;;  # (-MF: ninja's dependency file, one per source)
    -MMD) args+=("$1") ;;
    -c) args+=("$1") ;;
    *.cpp|*.cc) src=$1; args+=("$1") ;;
    -DTORCH_EXTENSION_NAME=*) args+=("$1") ;;  # one per library, unused by the headers
    *) args+=("$1"); key+=("$1") ;;
  esac
  shift
done
[ -n "$src" ] || exec "$real" "${args[@]}"  # a link, or not C++

# The header's flags are the source's own, so gcc accepts it (it checks them).
pch=$dir/$(printf '%s\n' "${key[@]}" | sha256sum | cut -c1-12)
mkdir -p "$pch"
exec 8>"$pch/.lock"
flock 8
if [ ! -e "$pch/.tried" ]; then
  printf '#include <Python.h>\n#include <torch/extension.h>\n#include <torch/script.h>\n' >"$pch/pch.h"
  "$real" "${key[@]}" -x c++-header "$pch/pch.h" -o "$pch/pch.h.gch" >/dev/null 2>&1 \
    || { rm -f "$pch/pch.h.gch"; echo "scripts/pch_cc.sh: no precompiled header for $src" >&2; }
  touch "$pch/.tried"
fi
flock -u 8
if [ -e "$pch/pch.h.gch" ]; then
  exec "$real" -include "$pch/pch.h" -Winvalid-pch "${args[@]}"
fi
exec "$real" "${args[@]}"
