#!/usr/bin/env bash
# helm (v3) for the chart tests: built from its published Go module (test
# tooling only; the product is Rust), cached outside the checkout by version.
#
#   scripts/helm.sh build    build helm into the cache (skipped when present)
#   scripts/helm.sh path     print the path of the built binary (fails when not built)
#
# The cache: ${EPP_HELM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/epp-rs/helm}/<version>/helm
set -euo pipefail

HELM_VERSION=${EPP_HELM_VERSION:-v3.22.0}
CACHE_ROOT=${EPP_HELM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/epp-rs/helm}
BIN="$CACHE_ROOT/$HELM_VERSION/helm"

log() { printf '[helm] %s\n' "$*" >&2; }
die() {
  log "error: $*"
  exit 1
}

cmd_build() {
  mkdir -p "$CACHE_ROOT"
  # Concurrent test binaries may all ask for the build: one builds, the others wait.
  exec 9>"$CACHE_ROOT/.build.lock"
  flock 9
  if [ -x "$BIN" ]; then
    log "cached: $BIN"
    return 0
  fi
  command -v go >/dev/null || die "go is not installed (needed to build helm for the chart tests)"
  mkdir -p "$(dirname "$BIN")"
  local start gobin
  start=$(date +%s)
  gobin=$(mktemp -d)
  log "building helm $HELM_VERSION from helm.sh/helm/v3/cmd/helm (a few minutes on two cores)"
  # Two parallel jobs, niced: the machines have two cores shared with the Rust build.
  GOBIN="$gobin" GOFLAGS=-mod=mod nice -n 10 go install -p 2 -trimpath \
    -ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" \
    "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" ||
    die "go install helm.sh/helm/v3/cmd/helm@$HELM_VERSION failed"
  mv "$gobin/helm" "$BIN.tmp"
  mv "$BIN.tmp" "$BIN"
  rm -rf "$gobin"
  log "built in $(($(date +%s) - start)) s: $BIN"
}

case "${1:-}" in
  build) cmd_build ;;
  path)
    [ -x "$BIN" ] || die "helm $HELM_VERSION is not built: run $0 build"
    echo "$BIN"
    ;;
  *)
    echo "usage: $0 build | path" >&2
    exit 2
    ;;
esac
