#!/usr/bin/env bash
# Set up the main environment (once per machine) and run the demo.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
main=$(bash "$root/scripts/env.sh" main)
cd "$root"
PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" exec "$main/bin/python" examples/demo.py "$@"
