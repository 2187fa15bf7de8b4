#!/usr/bin/env bash
# The reference endpoint picker, built from its published Go module, for side-by-side
# benchmarks (a peer under test, never part of the product; none of its code is in this tree).
#
#   scripts/reference-epp.sh build       build its `epp` into the cache (skipped when present)
#   scripts/reference-epp.sh path        print the path of the built binary
#   scripts/reference-epp.sh version     print the module@version it is built from
#   scripts/reference-epp.sh build-sim   build llm-d's inference simulator the same way
#   scripts/reference-epp.sh sim-path    print the path of the built simulator
#   scripts/reference-epp.sh build-sidecar  build llm-d's P/D routing sidecar the same way
#   scripts/reference-epp.sh sidecar-path   print the path of the built sidecar
#
# Which version. The picker users switch from is the Gateway API Inference Extension's
# reference EPP, which moved to llm-d/llm-d-router (module github.com/llm-d/llm-d-router from
# its v0.9.0; github.com/llm-d/llm-d-inference-scheduler before). What the Go module proxy these
# machines reach serves, checked 2026-11-24:
#   - github.com/llm-d/llm-d-router: no version at all (403 "This module version is not
#     available", the version list included);
#   - github.com/llm-d/llm-d-inference-scheduler v0.7.1: served, but it needs
#     github.com/llm-d/llm-d-kv-cache v0.7.1, which is not; v0.8.x is not served;
#   - sigs.k8s.io/gateway-api-inference-extension v1.5.0: served, with its cmd/epp.
# So the default is GIE v1.5.0's cmd/epp: the last release of the reference picker in GIE
# (v1.6.0 ships only cmd/lwepp), whose framework llm-d-router's epp still builds on (llm-d-router
# v0.10.0 requires GIE v1.5.0; its repository tags the sync as gaie-1.5-sync). It is built as
# released: no replace, no patch, pure Go (no cgo, nothing left out). Override with
# EPP_REFERENCE_MODULE / EPP_REFERENCE_VERSION (the package must be ./cmd/epp).
#
# The cache lives outside the checkout, keyed by version:
#   ${EPP_REFERENCE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/epp-rs/reference}/<version>/epp
set -euo pipefail

REF_MODULE=${EPP_REFERENCE_MODULE:-sigs.k8s.io/gateway-api-inference-extension}
REF_VERSION=${EPP_REFERENCE_VERSION:-v1.5.0}
SIM_MODULE=${EPP_REFERENCE_SIM_MODULE:-github.com/llm-d/llm-d-inference-sim}
SIM_VERSION=${EPP_REFERENCE_SIM_VERSION:-v0.10.2}
# llm-d's routing sidecar (cmd/pd-sidecar), the peer that reads the P/D and data-parallel
# headers epp sets. llm-d-router's module is not served (above); the last release of
# llm-d-inference-scheduler served here, v0.7.1, has the sidecar, and building that one
# package needs none of the modules the proxy refuses (llm-d-kv-cache is not imported by it).
SIDECAR_MODULE=${EPP_REFERENCE_SIDECAR_MODULE:-github.com/llm-d/llm-d-inference-scheduler}
SIDECAR_VERSION=${EPP_REFERENCE_SIDECAR_VERSION:-v0.7.1}
CACHE_ROOT=${EPP_REFERENCE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/epp-rs/reference}
# A module that asks for a newer Go than the installed one gets it from the module proxy.
export GOTOOLCHAIN=${GOTOOLCHAIN:-auto}

log() { printf '[reference-epp] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

ref_bin() { echo "$CACHE_ROOT/$REF_VERSION/epp"; }
sim_bin() { echo "$CACHE_ROOT/sim-$SIM_VERSION/llm-d-inference-sim"; }
sidecar_bin() { echo "$CACHE_ROOT/sidecar-$SIDECAR_VERSION/pd-sidecar"; }

# Go builds run niced with two parallel jobs: the machines have two cores shared with
# the Rust build. The released module is built from a copy of its own tree (its go.mod and
# go.sum, which has no replace directives) in a temporary directory: `go install pkg@version`
# would also ask the proxy for the version list, which it refuses.
go_build_module() { # module version package out-file
  local module="$1" version="$2" pkg="$3" out="$4" src work
  src=$(go mod download -json "$module@$version" | sed -n 's/^\s*"Dir": "\(.*\)",\?$/\1/p')
  [ -d "$src" ] || die "could not download $module@$version"
  work=$(mktemp -d)
  cp -r "$src" "$work/src"
  chmod -R u+w "$work/src"
  (cd "$work/src" && GOWORK=off GOFLAGS=-mod=mod nice -n 10 go build -p 2 -trimpath -ldflags='-s -w' -o "$out.tmp" "$pkg")
  mv "$out.tmp" "$out"
  rm -rf "$work"
}

# Builds `pkg` of `module@version` into `bin` unless it is there (one build
# at a time per cache, so concurrent callers wait for the first).
build_cached() { # bin what module version pkg
  local bin="$1" what="$2" module="$3" version="$4" pkg="$5"
  mkdir -p "$CACHE_ROOT"
  exec 9>"$CACHE_ROOT/.build.lock"
  flock 9
  if [ -x "$bin" ]; then
    log "cached: $bin"
    return 0
  fi
  command -v go >/dev/null || die "go is not installed (needed to build $what)"
  local start
  start=$(date +%s)
  mkdir -p "$(dirname "$bin")"
  log "building $module/${pkg#./}@$version ($what; several minutes on two cores)"
  go_build_module "$module" "$version" "$pkg" "$bin"
  log "built in $(($(date +%s) - start)) s: $bin"
}

cmd_build() {
  build_cached "$(ref_bin)" "the reference picker" "$REF_MODULE" "$REF_VERSION" ./cmd/epp
}

cmd_build_sim() {
  build_cached "$(sim_bin)" "the simulator" "$SIM_MODULE" "$SIM_VERSION" ./cmd/llm-d-inference-sim
}

cmd_build_sidecar() {
  build_cached "$(sidecar_bin)" "the routing sidecar" "$SIDECAR_MODULE" "$SIDECAR_VERSION" ./cmd/pd-sidecar
}

case "${1:-}" in
  build) cmd_build ;;
  path) ref_bin ;;
  version) echo "$REF_MODULE@$REF_VERSION" ;;
  build-sim) cmd_build_sim ;;
  sim-path) sim_bin ;;
  sim-version) echo "$SIM_MODULE@$SIM_VERSION" ;;
  build-sidecar) cmd_build_sidecar ;;
  sidecar-path) sidecar_bin ;;
  sidecar-version) echo "$SIDECAR_MODULE@$SIDECAR_VERSION" ;;
  *)
    echo "usage: $0 build | path | version | build-sim | sim-path | sim-version | build-sidecar | sidecar-path | sidecar-version" >&2
    exit 2
    ;;
esac
