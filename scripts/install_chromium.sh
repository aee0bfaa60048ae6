#!/usr/bin/env bash
# Install Debian's Chromium (headless use: the page tests) if it is missing. Needs root and
# Debian's package mirrors. Prints the browser's version (bounded: a broken install cannot hang).
set -euo pipefail
if ! command -v chromium >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  # Wait for apt's locks rather than fail (a new machine runs its upgrades at boot): dpkg's
  # for up to 10 minutes (DPkg::Lock::Timeout, apt >= 1.9.11); the package lists' lock, which
  # that option does not cover, by trying the update again for as long.
  apt_update() {
    local err
    for _ in $(seq 60); do
      err=$(apt-get -o DPkg::Lock::Timeout=600 update -qq 2>&1 >/dev/null) && return 0
      case $err in *"Could not get lock"*) sleep 10 ;; *) break ;; esac
    done
    echo "$err" >&2
    return 1
  }
  apt_update
  apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends chromium fonts-dejavu-core >&2
fi
timeout 60 chromium --headless --no-sandbox --version 2>/dev/null || chromium --version
