#!/usr/bin/env bash
# A real OpenTelemetry Collector for the tracing tests: the OTLP receiver (gRPC
# and HTTP) and the file exporter, nothing else, built from the collector's
# published Go modules (test infrastructure only; the product is Rust) and
# cached outside the checkout by version (about four minutes cold on two cores,
# module downloads included).
#
#   scripts/otelcol.sh build    build the collector into the cache (skipped when present)
#   scripts/otelcol.sh path     print the path of the built binary (fails when not built)
#
# The cache: ${EPP_OTELCOL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/epp-rs/otelcol}/<version>/otelcol
#
# The binary is the collector's own command (`otelcol --config FILE`); a config
# that writes every span it receives to a JSON-lines file:
#   receivers: {otlp: {protocols: {grpc: {endpoint: 127.0.0.1:4317}}}}
#   exporters: {file: {path: /tmp/spans.json}}
#   service: {pipelines: {traces: {receivers: [otlp], exporters: [file]}}}
set -euo pipefail

# The contrib module (file exporter) and the core modules are released together
# under the same v0.x version; they must match.
OTELCOL_VERSION=${EPP_OTELCOL_VERSION:-v0.165.0}
CACHE_ROOT=${EPP_OTELCOL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/epp-rs/otelcol}
BIN="$CACHE_ROOT/$OTELCOL_VERSION/otelcol"

log() { printf '[otelcol] %s\n' "$*" >&2; }
die() {
  log "error: $*"
  exit 1
}

write_module() {
  cat >go.mod <<EOF
module epp-rs.local/otelcol

go 1.24
EOF
  cat >main.go <<'EOF'
// The smallest collector the tracing tests need: OTLP in, JSON lines out.
package main

import (
	"log"

	"github.com/open-telemetry/opentelemetry-collector-contrib/exporter/fileexporter"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/confmap/provider/fileprovider"
	"go.opentelemetry.io/collector/exporter"
	"go.opentelemetry.io/collector/otelcol"
	"go.opentelemetry.io/collector/receiver"
	"go.opentelemetry.io/collector/receiver/otlpreceiver"
	"go.opentelemetry.io/collector/service/telemetry/otelconftelemetry"
)

func components() (otelcol.Factories, error) {
	receivers, err := otelcol.MakeFactoryMap[receiver.Factory](otlpreceiver.NewFactory())
	if err != nil {
		return otelcol.Factories{}, err
	}
	exporters, err := otelcol.MakeFactoryMap[exporter.Factory](fileexporter.NewFactory())
	if err != nil {
		return otelcol.Factories{}, err
	}
	return otelcol.Factories{
		Receivers: receivers,
		Exporters: exporters,
		Telemetry: otelconftelemetry.NewFactory(),
	}, nil
}

func main() {
	settings := otelcol.CollectorSettings{
		BuildInfo: component.BuildInfo{
			Command:     "otelcol",
			Description: "OTLP receiver and file exporter, for epp-rs tests",
			Version:     "epp-rs-test",
		},
		Factories: components,
		ConfigProviderSettings: otelcol.ConfigProviderSettings{
			ResolverSettings: confmap.ResolverSettings{
				ProviderFactories: []confmap.ProviderFactory{fileprovider.NewFactory()},
				DefaultScheme:     "file",
			},
		},
	}
	if err := otelcol.NewCommand(settings).Execute(); err != nil {
		log.Fatal(err)
	}
}
EOF
  go get "github.com/open-telemetry/opentelemetry-collector-contrib/exporter/fileexporter@$OTELCOL_VERSION" \
    "go.opentelemetry.io/collector/receiver/otlpreceiver@$OTELCOL_VERSION" \
    "go.opentelemetry.io/collector/otelcol@$OTELCOL_VERSION" >&2
  # -e: the proxy does not serve every module the dependencies' own tests
  # import (tidy looks at those too); the build needs none of them.
  log "resolving modules (errors about modules the dependencies' tests import are expected)"
  go mod tidy -e >&2 || true
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
  command -v go >/dev/null || die "go is not installed (needed to build the collector for the tracing tests)"
  mkdir -p "$(dirname "$BIN")"
  local start work
  start=$(date +%s)
  work=$(mktemp -d)
  log "building the OpenTelemetry Collector $OTELCOL_VERSION (OTLP receiver, file exporter; minutes on two cores)"
  (
    cd "$work"
    write_module
    # Two parallel jobs, niced: the machines have two cores shared with the Rust build.
    GOFLAGS=-mod=mod nice -n 10 go build -p 2 -trimpath -ldflags='-s -w' -o "$BIN.tmp" .
  ) || die "building the collector failed (work directory kept: $work)"
  mv "$BIN.tmp" "$BIN"
  rm -rf "$work"
  log "built in $(($(date +%s) - start)) s: $BIN"
}

case "${1:-}" in
  build) cmd_build ;;
  path)
    [ -x "$BIN" ] || die "the collector $OTELCOL_VERSION is not built: run $0 build"
    echo "$BIN"
    ;;
  *)
    echo "usage: $0 build | path" >&2
    exit 2
    ;;
esac
