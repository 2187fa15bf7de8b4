#!/usr/bin/env bash
# The whole test suite, from a fresh checkout: installs what it needs (Envoy into
# .venv/, Debian's chromium, the Rust build), checks formatting and lints, then runs every test,
# including the end-to-end tests through the real Envoy and the Kubernetes
# tests against a real kube-apiserver (built from Go modules by kube-env.sh),
# the Helm chart's tests with a real helm (built by helm.sh), the tracing
# tests against a real OpenTelemetry Collector (built by otelcol.sh), and the
# P/D and data-parallel tests through llm-d's routing sidecar (built by
# reference-epp.sh build-sidecar).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh --no-build
echo "[test] cargo fmt --check" >&2
cargo fmt --all -- --check
echo "[test] cargo clippy" >&2
cargo clippy --workspace --all-targets --quiet -- -D warnings
echo "[test] building the test control plane (etcd, kube-apiserver; cached after the first time)" >&2
scripts/kube-env.sh build
echo "[test] building helm for the chart tests (cached after the first time)" >&2
scripts/helm.sh build
echo "[test] building the OpenTelemetry Collector for the tracing tests (cached after the first time)" >&2
scripts/otelcol.sh build
echo "[test] building Prometheus and promtool for the observability tests (cached after the first time)" >&2
scripts/prometheus.sh build
echo "[test] building llm-d's routing sidecar for the P/D tests (cached after the first time)" >&2
scripts/reference-epp.sh build-sidecar
echo "[test] building llm-d's inference simulator for the KV-event test (cached after the first time)" >&2
scripts/reference-epp.sh build-sim
echo "[test] building binaries the end-to-end tests start" >&2
cargo build --workspace --bins --quiet
echo "[test] cargo test" >&2
cargo test --workspace --no-fail-fast
