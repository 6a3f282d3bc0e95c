#!/usr/bin/env bash
# Installs, only when missing, the Debian packages the real node and the local image builds use:
#   runc, containernetworking-plugins   the container runtime and the bridge/host-local/portmap CNI
#   debootstrap, debian-archive-keyring the offline python base image (nymph.localcluster.images)
#   buildah, uidmap, containers-common  building daemonset/Dockerfile without a daemon
#                                       (--isolation chroot, vfs storage: no fuse-overlayfs)
#   gcc, libc6-dev                      the static pause binary
#   postgresql                          the server the queue's PostgreSQL tests start
#                                       (initdb + postgres into a temp dir; no service is used)
#   chromium                            the browser the console's tests drive (headless, with
#                                       Playwright given its executable_path)
#   ipset                               the sets kube-router's firewall matches Pods by (the
#                                       sandbox NetworkPolicy tests' policy engine)
# Quiet and quick when everything is there; needs root otherwise. Usage: tests/envtest/deps.sh
set -euo pipefail

PACKAGES=(
  runc
  containernetworking-plugins
  debootstrap
  debian-archive-keyring
  buildah
  uidmap
  golang-github-containers-common
  gcc
  libc6-dev
  postgresql
  chromium
  ipset
)

installed() {
  [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" = "install ok installed" ]
}

missing=()
for pkg in "${PACKAGES[@]}"; do
  installed "$pkg" || missing+=("$pkg")
done
[ "${#missing[@]}" -eq 0 ] && exit 0

if ! command -v apt-get >/dev/null 2>&1; then
  echo "deps.sh: missing ${missing[*]} and this machine has no apt-get; install them by other means" >&2
  exit 1
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "deps.sh: missing Debian packages: ${missing[*]}" >&2
  echo "deps.sh: run as root (sudo $0) or install them: apt-get install --no-install-recommends ${missing[*]}" >&2
  exit 1
fi

echo "deps.sh: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
# Another apt run on the machine holds the lock for a while: wait for it rather than fail.
APT=(apt-get -q -o DPkg::Lock::Timeout=600 -o Dpkg::Use-Pty=0)
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! "${APT[@]}" install -y --no-install-recommends "${missing[@]}" >"$log" 2>&1; then
  # A missing or stale package list is the usual cause: refresh once and try again.
  echo "deps.sh: install failed; refreshing the package lists and retrying" >&2
  if ! "${APT[@]}" update >"$log" 2>&1 \
    || ! "${APT[@]}" install -y --no-install-recommends "${missing[@]}" >"$log" 2>&1; then
    tail -n 20 "$log" >&2
    echo "deps.sh: could not install ${missing[*]}" >&2
    exit 1
  fi
fi

still=()
for pkg in "${missing[@]}"; do
  installed "$pkg" || still+=("$pkg")
done
if [ "${#still[@]}" -ne 0 ]; then
  echo "deps.sh: still missing after install: ${still[*]}" >&2
  exit 1
fi
echo "deps.sh: installed ${missing[*]}" >&2
