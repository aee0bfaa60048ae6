#!/usr/bin/env bash
# Sourced by the install scripts: apt_update and apt_install wait for apt's locks rather than
# fail (a new machine runs its upgrades at boot): dpkg's for up to 10 minutes
# (DPkg::Lock::Timeout, apt >= 1.9.11); the package lists' lock, which that option does not
# cover, by trying the update again for as long.
export DEBIAN_FRONTEND=noninteractive
apt_update() {
  local err
  for _ in $(seq 60); do
    err=$(apt-get -o DPkg::Lock::Timeout=600 update -qq 2>&1 >/dev/null) && return 0
    case $err in *"Could not get lock"*) sleep 10 ;; *) break ;; esac
  done
  echo "$err" >&2
  return 1
}
apt_install() {
  apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "$@" >&2
}
