#!/usr/bin/env bash
# The routing-quality benchmark in one command (see docs/BENCHMARKS.md):
# installs the peer routers and inference-perf, builds release binaries, then
# runs every workload through every contender on fresh simulators.
#   benches/routing/run.sh                 # full run (48 min on 2 busy shared cores; --repeats 1 halves it)
#   benches/routing/run.sh --quick         # smoke test: two rates, one run
#   benches/routing/run.sh --workloads shared-prefix --repeats 3
#   benches/routing/run.sh --quick --contenders epp,reference   # epp vs the reference picker
#   benches/routing/run.sh --fleet llm-d-sim   # the same on llm-d's simulator (built from its Go module, cached)
# The reference picker (contender `reference`) needs scripts/reference-epp.sh build and
# scripts/kube-env.sh build (Go; cached outside the checkout): skipped when they are
# missing, built first when named in --contenders.
# Results: target/routing-bench/<time>/{results.jsonl,report.md,ttft_p90.png}
set -euo pipefail
cd "$(dirname "$0")/../.."
scripts/setup-routing-bench.sh
cargo build --release --quiet -p epp-bin -p epp-sim --bins
exec .venv/bin/python benches/routing/run.py "$@"
