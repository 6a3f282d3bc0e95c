#!/usr/bin/env bash
# Build the programs some tests run next to the local control plane from their Go modules, into
# the per-user cache (like tests/envtest/build.sh), keyed by version:
#
#   kuberay-operator  the KubeRay operator, plus its CRDs (crds/), for the dockyard e2e tests
#   helm              for the Helm chart's install test
#   kube-router       its NetworkPolicy firewall alone, for the sandbox policy tests
#
#   tests/envtest/build-tools.sh [NAME...]   build (or reuse) NAMEs (default: all); prints the dir
#   NYMPH_CACHE_DIR=DIR ...                  where the cache lives (default: ~/.cache/nymph)
#
# The last line printed on stdout is the tools directory: DIR/<name> is each binary.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"
log() { echo "envtest-tools: $*" >&2; }

cache="${NYMPH_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/nymph}"
tools="$cache/tools/kuberay-${KUBERAY_VERSION}_helm-${HELM_VERSION}_kube-router-${KUBE_ROUTER_VERSION}"
names=("$@")
[[ ${#names[@]} -gt 0 ]] || names=(kuberay-operator helm kube-router)

missing=()
for n in "${names[@]}"; do
  case "$n" in
    kuberay-operator) [[ -x "$tools/kuberay-operator" && -d "$tools/crds" ]] || missing+=("$n") ;;
    helm|kube-router) [[ -x "$tools/$n" ]] || missing+=("$n") ;;
    *) log "unknown tool '$n' (known: kuberay-operator helm kube-router)"; exit 2 ;;
  esac
done
if [[ ${#missing[@]} -eq 0 ]]; then
  log "reusing $tools"
  echo "$tools"
  exit 0
fi
command -v go >/dev/null || { log "go is not on PATH; install Go to build ${missing[*]}"; exit 2; }

export GOMODCACHE="${GOMODCACHE_OVERRIDE:-$cache/go/mod}"
export GOCACHE="${GOCACHE_OVERRIDE:-$cache/go/build}"
export GOFLAGS="-buildvcs=false"
export CGO_ENABLED=0
mkdir -p "$tools" "$GOMODCACHE" "$GOCACHE"
start=$(date +%s)
elapsed() { echo "$(( $(date +%s) - start ))s"; }
with_heartbeat() {
  "$@" &
  local pid=$! ticks=0
  while kill -0 "$pid" 2>/dev/null; do
    sleep 2
    ticks=$((ticks + 1))
    if (( ticks % 15 == 0 )) && kill -0 "$pid" 2>/dev/null; then log "    ... still building ($(elapsed))"; fi
  done
  wait "$pid"
}
p="${NYMPH_BUILD_PARALLELISM:-$(nproc)}"
gobin="$tools/.gobin"

for n in "${missing[@]}"; do
  case "$n" in
    kuberay-operator)
      log "building the KubeRay operator ${KUBERAY_VERSION} (about 10 min cold on 2 cores) ($(elapsed))"
      mod=github.com/ray-project/kuberay/ray-operator
      with_heartbeat env GOBIN="$gobin" go install -p "$p" -trimpath -ldflags "-s -w" "$mod@${KUBERAY_VERSION}"
      mv "$gobin/ray-operator" "$tools/kuberay-operator"
      src=$(go mod download -json "$mod@${KUBERAY_VERSION}" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
      rm -rf "$tools/crds.tmp" && mkdir -p "$tools/crds.tmp"
      cp "$src"/config/crd/bases/*.yaml "$tools/crds.tmp/"
      chmod -R u+w "$tools/crds.tmp"
      rm -rf "$tools/crds" && mv "$tools/crds.tmp" "$tools/crds"
      ;;
    helm)
      log "building helm ${HELM_VERSION} ($(elapsed))"
      with_heartbeat env GOBIN="$gobin" go install -p "$p" -trimpath -ldflags "-s -w" "helm.sh/helm/v3/cmd/helm@${HELM_VERSION}"
      mv "$gobin/helm" "$tools/helm"
      ;;
    kube-router)
      log "building kube-router ${KUBE_ROUTER_VERSION} (test-only policy engine; about 5 min cold) ($(elapsed))"
      with_heartbeat env GOBIN="$gobin" go install -p "$p" -trimpath -ldflags "-s -w" \
        "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router@${KUBE_ROUTER_VERSION}"
      mv "$gobin/kube-router" "$tools/kube-router"
      ;;
  esac
done
rm -rf "$gobin"
if [[ -z "${NYMPH_KEEP_GOCACHE:-}" && -z "${GOCACHE_OVERRIDE:-}" ]]; then
  go clean -cache
  log "removed the Go build cache (set NYMPH_KEEP_GOCACHE=1 to keep it)"
fi
log "done in $(elapsed): $tools"
echo "$tools"
