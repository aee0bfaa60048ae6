#!/usr/bin/env bash
# Install Debian's Chromium (headless use: the page tests) if it is missing. Needs root and
# Debian's package mirrors. Prints the browser's version (bounded: a broken install cannot hang).
set -euo pipefail
if ! command -v chromium >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >&2
fi
timeout 60 chromium --headless --no-sandbox --version 2>/dev/null || chromium --version
