#!/usr/bin/env bash
# The demo: 4 simulated model servers, epp and Envoy on loopback; a burst of
# requests through Envoy; which server served how many, with latency
# percentiles; then everything shuts down. Installs what it needs first.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh --no-build
echo "[demo] building (release)" >&2
cargo build --release --quiet -p epp-bin -p epp-sim --bins --examples
exec target/release/examples/demo "$@"
