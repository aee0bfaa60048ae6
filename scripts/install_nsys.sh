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
  apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends nsight-systems >&2
fi
nsys --version
