#!/usr/bin/env bash
# One Nsight Systems session at a time on this machine, bounded: CI profiles on both of its
# sides, and two sessions at once can fail with nsys's "End of file". The lock
# ($TMPDIR/instrumented_convs-nsys.lock, as Python's tempfile.gettempdir() names it) is held
# by flock alone (-o): nsys's agent daemon, which now and then outlives its session, must not
# inherit it (one did, and held every later session off). Agents left when the session has
# ended are killed before the lock is released.
# Usage: bash scripts/nsys_locked.sh SECONDS NSYS-ARGS...   (e.g. 600 profile -t nvtx ...)
set -u
seconds=${1:?usage: scripts/nsys_locked.sh SECONDS NSYS-ARGS...}
shift
exec flock -o "${TMPDIR:-/tmp}/instrumented_convs-nsys.lock" bash -c '
  timeout "$0" nsys "$@"; rc=$?
  pkill -KILL -u "$(id -u)" -f "[n]sys --start-agent" 2>/dev/null
  exit $rc' "$seconds" "$@"
