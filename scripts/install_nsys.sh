#!/usr/bin/env bash
# Install Nsight Systems (Debian bookworm's non-free package nsight-systems) if nsys is
# missing. Needs root and Debian's package mirrors. Prints the nsys version.
set -euo pipefail
if ! command -v nsys >/dev/null 2>&1; then
  src=/etc/apt/sources.list.d/instrumented-convs-nonfree.sources
  if [ ! -f "$src" ]; then
    cat > "$src" <<'SRC'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: contrib non-free
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
  fi
  . "$(dirname "$0")/apt_wait.sh"  # apt_update, apt_install: they wait for apt's locks
  apt_update
  apt_install nsight-systems
fi
nsys --version
