#!/usr/bin/env bash
# Install Debian's Chromium (headless use: the page tests) if it is missing. Needs root and
# Debian's package mirrors. Prints the browser's version (bounded: a broken install cannot hang).
set -euo pipefail
if ! command -v chromium >/dev/null 2>&1; then
  . "$(dirname "$0")/apt_wait.sh"  # apt_update, apt_install: they wait for apt's locks
  apt_update
  apt_install chromium fonts-dejavu-core
fi
timeout 60 chromium --headless --no-sandbox --version 2>/dev/null || chromium --version
