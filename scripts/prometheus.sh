#!/usr/bin/env bash
# A real Prometheus server and promtool for the observability tests (the alert
# rules' `promtool check rules` / `promtool test rules`, and the dashboard test
# that runs every panel's query against a Prometheus scraping a live demo),
# built from the published `github.com/prometheus/prometheus` Go module (test
# infrastructure only; the product is Rust) and cached outside the checkout by
# version. Service discovery other than static targets is left out
# (`-tags remove_all_sd`): the tests only scrape fixed local addresses.
#
#   scripts/prometheus.sh build             build both binaries into the cache (skipped when present)
#   scripts/prometheus.sh path promtool     print the path of a built binary (fails when not built)
#   scripts/prometheus.sh path prometheus
#
# The cache: ${EPP_PROMETHEUS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/epp-rs/prometheus}/<version>/{promtool,prometheus}
set -euo pipefail

# The module's v0.3xx.y is Prometheus 3.xx.y.
PROMETHEUS_VERSION=${EPP_PROMETHEUS_VERSION:-v0.316.0}
CACHE_ROOT=${EPP_PROMETHEUS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/epp-rs/prometheus}
DIR="$CACHE_ROOT/$PROMETHEUS_VERSION"

log() { printf '[prometheus] %s\n' "$*" >&2; }
die() {
  log "error: $*"
  exit 1
}

write_module() {
  printf 'module epp-rs.local/prometheus\n\ngo 1.26\n' >go.mod
  # Blank imports keep the two commands in the module graph for `go mod tidy`.
  printf '%s\n' '//go:build tools' '' 'package tools' '' 'import (' \
    '	_ "github.com/prometheus/prometheus/cmd/prometheus"' \
    '	_ "github.com/prometheus/prometheus/cmd/promtool"' ')' >tools.go
  go get "github.com/prometheus/prometheus@$PROMETHEUS_VERSION" >&2
  log "resolving modules (errors about modules the dependencies' tests import are expected)"
  go mod tidy -e >&2 || true
}

cmd_build() {
  mkdir -p "$CACHE_ROOT"
  # Concurrent test binaries may all ask for the build: one builds, the others wait.
  exec 9>"$CACHE_ROOT/.build.lock"
  flock 9
  if [ -x "$DIR/promtool" ] && [ -x "$DIR/prometheus" ]; then
    log "cached: $DIR"
    return 0
  fi
  command -v go >/dev/null || die "go is not installed (needed to build Prometheus for the observability tests)"
  mkdir -p "$DIR"
  local start work
  start=$(date +%s)
  work=$(mktemp -d)
  log "building Prometheus $PROMETHEUS_VERSION (promtool, prometheus; minutes on two cores)"
  (
    cd "$work"
    write_module
    for cmd in promtool prometheus; do
      # Two parallel jobs, niced: the machines have two cores shared with the Rust build.
      GOFLAGS=-mod=mod nice -n 10 go build -p 2 -trimpath -tags remove_all_sd -ldflags='-s -w' \
        -o "$DIR/$cmd.tmp" "github.com/prometheus/prometheus/cmd/$cmd"
    done
  ) || die "building Prometheus failed (work directory kept: $work)"
  mv "$DIR/promtool.tmp" "$DIR/promtool"
  mv "$DIR/prometheus.tmp" "$DIR/prometheus"
  rm -rf "$work"
  log "built in $(($(date +%s) - start)) s: $DIR"
}

case "${1:-}" in
  build) cmd_build ;;
  path)
    case "${2:-}" in
      promtool | prometheus) ;;
      *) die "usage: $0 path promtool|prometheus" ;;
    esac
    [ -x "$DIR/$2" ] || die "Prometheus $PROMETHEUS_VERSION is not built: run $0 build"
    echo "$DIR/$2"
    ;;
  *)
    echo "usage: $0 build | path promtool|prometheus" >&2
    exit 2
    ;;
esac
