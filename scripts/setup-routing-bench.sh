#!/usr/bin/env bash
# Installs, idempotently, what the routing benchmark (benches/routing/run.sh)
# needs beyond scripts/setup.sh. Not part of scripts/test.sh: CI does not run
# the routing benchmark.
#   .venv/               sglang-router, vllm-router (the peer routers), matplotlib
#   .venv/py312/         inference-perf and tokenizers (inference-perf needs Python >= 3.12)
#   .venv/bench-tokenizer/  a small byte-level BPE tokenizer built offline
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[setup-routing-bench] %s\n' "$*" >&2; }

scripts/setup.sh --no-build

PIP=(--quiet --disable-pip-version-check)
if ! .venv/bin/python -c 'import sglang_router, vllm_router, matplotlib' >/dev/null 2>&1; then
  log "installing sglang-router, vllm-router, matplotlib into .venv"
  .venv/bin/pip install "${PIP[@]}" 'sglang-router>=0.3,<0.4' 'vllm-router>=0.1,<0.2' matplotlib
fi

# A Python >= 3.12, found without relying on what a shell has selected: a
# pyenv shim such as `python3.12` fails unless that version is selected, so
# pyenv's installed interpreters are tried by their real paths too.
find_py312() {
  local cands=("${PYTHON312:-}" python3.12 python3.13 python3.14)
  local root="${PYENV_ROOT:-$HOME/.pyenv}"
  if [ -d "$root/versions" ]; then
    # Oldest suitable first (the one wheels are likeliest to exist for).
    while IFS= read -r v; do cands+=("$root/versions/$v/bin/python3"); done \
      < <(ls "$root/versions" | sort -t. -k1,1n -k2,2n -k3,3n)
  fi
  for cand in "${cands[@]}"; do
    [ -n "$cand" ] || continue
    if "$cand" -c 'import sys, venv; sys.exit(sys.version_info < (3, 12))' >/dev/null 2>&1; then
      command -v "$cand"; return 0
    fi
  done
  return 1
}
if [ ! -x .venv/py312/bin/python ]; then
  PY312=$(find_py312) || { log "inference-perf needs Python >= 3.12: install one (e.g. pyenv install 3.12) or set PYTHON312"; exit 1; }
  log "creating .venv/py312 with $("$PY312" --version 2>&1)"
  "$PY312" -m venv .venv/py312
fi
if ! .venv/py312/bin/python -c 'import inference_perf, tokenizers' >/dev/null 2>&1; then
  log "installing inference-perf and tokenizers into .venv/py312"
  .venv/py312/bin/pip install "${PIP[@]}" 'inference-perf>=0.7,<0.8' tokenizers
fi

if [ ! -f .venv/bench-tokenizer/tokenizer.json ]; then
  log "building the benchmark tokenizer in .venv/bench-tokenizer"
  .venv/py312/bin/python benches/routing/make_tokenizer.py .venv/bench-tokenizer
fi
log "sglang-router $(.venv/bin/pip show sglang-router 2>/dev/null | sed -n 's/^Version: //p'), vllm-router $(.venv/bin/pip show vllm-router 2>/dev/null | sed -n 's/^Version: //p'), inference-perf $(.venv/py312/bin/pip show inference-perf 2>/dev/null | sed -n 's/^Version: //p')"
log "done"
