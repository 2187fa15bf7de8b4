#!/usr/bin/env bash
# A real, kubelet-less Kubernetes control plane for the Kubernetes tests: etcd and
# kube-apiserver built from their published Go modules (test infrastructure only;
# the product is Rust).
#
#   scripts/kube-env.sh build        build both into $EPP_KUBE_CACHE (skipped when present)
#   scripts/kube-env.sh bin-dir      print the directory holding the built binaries
#   scripts/kube-env.sh start DIR    run etcd + kube-apiserver with state under DIR, install
#                                    the CRDs, print the kubeconfig path as the last line
#   scripts/kube-env.sh stop DIR     stop what `start DIR` started and delete its etcd data
#                                    (logs, certificates and kubeconfigs stay)
#   scripts/kube-env.sh apiserver-stop DIR | apiserver-start DIR
#                                    stop / restart only the API server, same port (fault tests)
#
# The cache lives outside the checkout, keyed by version:
#   ${EPP_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/epp-rs/kube}/k8s-<ver>-etcd-<ver>/
set -euo pipefail

KUBE_VERSION=${EPP_KUBE_VERSION:-v1.34.4}
ETCD_VERSION=${EPP_ETCD_VERSION:-v3.6.16}
CACHE_ROOT=${EPP_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/epp-rs/kube}
BIN_DIR="$CACHE_ROOT/k8s-$KUBE_VERSION-etcd-$ETCD_VERSION"
CHECKOUT=$(cd "$(dirname "$0")/.." && pwd)
# CI and the developer layout both keep shared/ next to the checkout.
CRD_DIR=${EPP_KUBE_CRDS:-$CHECKOUT/../shared/reference/crds}

log() { printf '[kube-env] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# Go builds run niced with two parallel jobs: the machines have two cores shared
# with the Rust build.
go_build() {
  nice -n 10 go build -p 2 -trimpath -ldflags='-s -w' "$@"
}

build_etcd() {
  local work="$1"
  mkdir -p "$work/etcd"
  (
    cd "$work/etcd"
    cat >go.mod <<EOF
module epp-rs.local/kube-env/etcd

go 1.24
EOF
    cat >main.go <<'EOF'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
EOF
    go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >&2
    go mod tidy >&2
    go_build -o "$BIN_DIR/etcd.tmp" .
    mv "$BIN_DIR/etcd.tmp" "$BIN_DIR/etcd"
  )
}

build_apiserver() {
  local work="$1"
  mkdir -p "$work/apiserver"
  (
    cd "$work/apiserver"
    local gomod minor
    gomod=$(go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | sed -n 's/^\s*"GoMod": "\(.*\)",\?$/\1/p')
    [ -f "$gomod" ] || die "could not download k8s.io/kubernetes@$KUBE_VERSION"
    # v1.34.4 -> the staging modules are published as v0.34.4.
    minor=${KUBE_VERSION#v1.}
    {
      echo "module epp-rs.local/kube-env/apiserver"
      echo
      echo "go 1.24"
      echo
      echo "require k8s.io/kubernetes $KUBE_VERSION"
      echo
      echo "replace ("
      sed -n 's|^\s*\(k8s.io/[A-Za-z0-9._-]*\) => ./staging/.*$|\1|p' "$gomod" |
        while read -r module; do echo "	$module => $module v0.$minor"; done
      echo ")"
    } >go.mod
    grep -q '=> k8s.io/api v0' go.mod || die "found no staging modules in $gomod"
    cat >tools.go <<'EOF'
//go:build tools

package tools

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
EOF
    go mod tidy -e >&2 || true
    go mod download >&2
    GOFLAGS=-mod=mod go_build -o "$BIN_DIR/kube-apiserver.tmp" k8s.io/kubernetes/cmd/kube-apiserver
    mv "$BIN_DIR/kube-apiserver.tmp" "$BIN_DIR/kube-apiserver"
  )
}

cmd_build() {
  # Concurrent test binaries may all ask for the build: one builds, the others wait.
  mkdir -p "$CACHE_ROOT"
  exec 9>"$CACHE_ROOT/.build.lock"
  flock 9
  if [ -x "$BIN_DIR/etcd" ] && [ -x "$BIN_DIR/kube-apiserver" ]; then
    log "cached: $BIN_DIR"
    return 0
  fi
  command -v go >/dev/null || die "go is not installed (needed to build the test control plane)"
  mkdir -p "$BIN_DIR"
  local work start
  work=$(mktemp -d)
  start=$(date +%s)
  if [ ! -x "$BIN_DIR/etcd" ]; then
    log "building etcd $ETCD_VERSION"
    build_etcd "$work"
  fi
  if [ ! -x "$BIN_DIR/kube-apiserver" ]; then
    log "building kube-apiserver $KUBE_VERSION (long: several minutes on two cores)"
    build_apiserver "$work"
  fi
  rm -rf "$work"
  log "built in $(($(date +%s) - start)) s: $BIN_DIR"
}

# --- the running control plane ------------------------------------------------

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Test ServiceAccount users with a static token each (RBAC decides what they may do).
SERVICE_ACCOUNTS=${EPP_KUBE_SERVICE_ACCOUNTS:-epp epp-b restricted}

write_kubeconfig() { # file user token server ca
  cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: epp-test
  cluster:
    server: $4
    certificate-authority: $5
users:
- name: $2
  user:
    token: $3
contexts:
- name: $2
  context:
    cluster: epp-test
    user: $2
    namespace: default
current-context: $2
EOF
}

make_pki() { # dir
  local d="$1"
  mkdir -p "$d"
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=epp-test-ca" \
    -keyout "$d/ca.key" -out "$d/ca.crt" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" \
    -keyout "$d/serving.key" -out "$d/serving.csr" 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' >"$d/serving.ext"
  openssl x509 -req -in "$d/serving.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -CAcreateserial \
    -days 3650 -extfile "$d/serving.ext" -out "$d/serving.crt" 2>/dev/null
  openssl genrsa -out "$d/sa.key" 2048 2>/dev/null
  openssl rsa -in "$d/sa.key" -pubout -out "$d/sa.pub" 2>/dev/null
}

# etcd on two free ports; prints the client port once etcd answers. A port
# free when picked can be taken by another test before etcd binds it: etcd
# then exits with "address already in use", and new ports are tried.
start_etcd() { # dir
  local dir="$1" client peer attempt pid
  for attempt in 1 2 3 4 5; do
    client=$(free_port)
    peer=$(free_port)
    rm -rf "$dir/etcd-data"
    spawn "$dir" etcd "$BIN_DIR/etcd" --name default --data-dir "$dir/etcd-data" \
      --listen-client-urls "http://127.0.0.1:$client" --advertise-client-urls "http://127.0.0.1:$client" \
      --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
      --initial-cluster "default=http://127.0.0.1:$peer" --unsafe-no-fsync --log-level warn
    pid=$(cat "$dir/etcd.pid")
    for _ in $(seq 200); do
      if curl -fsS "http://127.0.0.1:$client/health" >/dev/null 2>&1; then
        echo "$client"
        return 0
      fi
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.05
    done
    if kill -0 "$pid" 2>/dev/null; then
      die "etcd did not answer on 127.0.0.1:$client within 10 s (log: $dir/etcd.log)"
    fi
    grep -q "address already in use" "$dir/etcd.log" ||
      die "etcd exited: $(tail -3 "$dir/etcd.log")"
    log "etcd: port taken before it bound (attempt $attempt), trying others"
  done
  die "etcd: no free ports in 5 attempts"
}

# Runs a command detached from this shell: pid in DIR/NAME.pid, output in DIR/NAME.log.
spawn() { # dir name cmd...
  local dir="$1" name="$2"
  shift 2
  setsid "$@" >"$dir/$name.log" 2>&1 </dev/null &
  echo $! >"$dir/$name.pid"
}

kill_pidfile() { # file
  local pidfile="$1" pid
  [ -f "$pidfile" ] || return 0
  pid=$(cat "$pidfile")
  if kill "$pid" 2>/dev/null; then
    for _ in $(seq 100); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$pidfile"
}

api() { # dir method path [curl args...]
  local dir="$1" method="$2" path="$3"
  shift 3
  curl -sS --cacert "$dir/pki/ca.crt" -H "Authorization: Bearer $(cat "$dir/admin.token")" \
    -X "$method" "$(cat "$dir/server")$path" "$@"
}

wait_ready() { # dir seconds
  local dir="$1" deadline=$((SECONDS + $2))
  while [ $SECONDS -lt $deadline ]; do
    if [ "$(api "$dir" GET /readyz -o /dev/null -w '%{http_code}' 2>/dev/null)" = 200 ]; then
      return 0
    fi
    if ! kill -0 "$(cat "$dir/apiserver.pid")" 2>/dev/null; then
      tail -20 "$dir/apiserver.log" >&2
      die "kube-apiserver exited (log: $dir/apiserver.log)"
    fi
    sleep 0.3
  done
  tail -20 "$dir/apiserver.log" >&2
  die "kube-apiserver not ready after $2 s (log: $dir/apiserver.log)"
}

cmd_apiserver_start() { # dir
  local dir="$1"
  [ -f "$dir/apiserver.args" ] || die "$dir holds no control plane (run start first)"
  local args
  mapfile -t args <"$dir/apiserver.args"
  spawn "$dir" apiserver "$BIN_DIR/kube-apiserver" "${args[@]}"
  wait_ready "$dir" 180
}

crd_files() {
  local f
  for f in "$CRD_DIR"/*.yaml "$CHECKOUT"/scripts/kube-crds/*.yaml; do
    [ -f "$f" ] && echo "$f"
  done
}

install_crds() { # dir
  local dir="$1" crd name code
  [ -n "$(ls "$CRD_DIR"/*.yaml 2>/dev/null)" ] ||
    die "no CRDs in $CRD_DIR (shared/ is expected next to the checkout; or set EPP_KUBE_CRDS)"
  for crd in $(crd_files); do
    code=$(api "$dir" POST /apis/apiextensions.k8s.io/v1/customresourcedefinitions \
      -H 'Content-Type: application/yaml' --data-binary "@$crd" -o "$dir/crd.out" -w '%{http_code}')
    case "$code" in
      201 | 409) ;;
      *)
        cat "$dir/crd.out" >&2
        die "installing $crd: HTTP $code"
        ;;
    esac
  done
  # Usable once every CRD reports Established.
  for crd in $(crd_files); do
    name=$(sed -n '/^metadata:/,/^[a-z]/s/^  name: *//p' "$crd" | head -1)
    for _ in $(seq 300); do
      if api "$dir" GET "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/$name" 2>/dev/null |
        tr -d ' \n' | grep -q '"type":"Established","status":"True"'; then
        continue 2
      fi
      sleep 0.1
    done
    die "CRD $name not established"
  done
}

random_token() {
  head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n'
}

# Deletes the tests' stopped control planes (`epp-kube-*`, no etcd running)
# in PARENT that are over a day old. A test's own cluster goes when the test
# passes, but the one a test process shares lives in a static and is stopped
# by the owner watcher, which cannot tell a passed run from a failed one: its
# logs stay for a day for a failed test's reader, then go (one directory per
# test process, ~150 KB each, otherwise piling up run after run).
prune_stopped() { # parent
  local d
  for d in "$1"/epp-kube-*; do
    [ -d "$d" ] && [ ! -e "$d/etcd.pid" ] && [ ! -e "$d/apiserver.pid" ] || continue
    [ -n "$(find "$d" -maxdepth 0 -mmin +1440)" ] && rm -rf "$d"
  done
  return 0
}

cmd_start() { # dir
  local dir="$1"
  [ -x "$BIN_DIR/etcd" ] && [ -x "$BIN_DIR/kube-apiserver" ] ||
    die "control plane not built: run $0 build"
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  [ -f "$dir/apiserver.pid" ] && die "$dir already runs a control plane (stop it first)"
  prune_stopped "$(dirname "$dir")"
  make_pki "$dir/pki"
  local etcd_port api_port server sa
  etcd_port=$(start_etcd "$dir") || exit 1
  api_port=$(free_port)
  server="https://127.0.0.1:$api_port"
  echo "$server" >"$dir/server"

  random_token >"$dir/admin.token"
  {
    echo "$(cat "$dir/admin.token"),admin,admin,system:masters"
    for sa in $SERVICE_ACCOUNTS; do
      random_token >"$dir/sa-$sa.token"
      echo "$(cat "$dir/sa-$sa.token"),system:serviceaccount:default:$sa,sa-$sa,\"system:serviceaccounts,system:serviceaccounts:default\""
    done
  } >"$dir/tokens.csv"
  write_kubeconfig "$dir/kubeconfig" admin "$(cat "$dir/admin.token")" "$server" "$dir/pki/ca.crt"
  for sa in $SERVICE_ACCOUNTS; do
    write_kubeconfig "$dir/kubeconfig-$sa" "$sa" "$(cat "$dir/sa-$sa.token")" "$server" "$dir/pki/ca.crt"
  done

  cat >"$dir/apiserver.args" <<EOF
--etcd-servers=http://127.0.0.1:$etcd_port
--bind-address=127.0.0.1
--advertise-address=127.0.0.1
--secure-port=$api_port
--tls-cert-file=$dir/pki/serving.crt
--tls-private-key-file=$dir/pki/serving.key
--cert-dir=$dir/pki
--service-cluster-ip-range=10.0.0.0/24
--service-account-issuer=https://kubernetes.default.svc
--service-account-key-file=$dir/pki/sa.pub
--service-account-signing-key-file=$dir/pki/sa.key
--token-auth-file=$dir/tokens.csv
--authorization-mode=RBAC
--disable-admission-plugins=ServiceAccount
--enable-priority-and-fairness=false
EOF
  cmd_apiserver_start "$dir"
  install_crds "$dir"
  # Tests pass their pid: the control plane goes when they do, even if killed.
  if [ -n "${EPP_KUBE_OWNER_PID:-}" ]; then
    setsid bash -c 'while kill -0 "$1" 2>/dev/null && [ -f "$2/etcd.pid" ]; do sleep 1; done; "$3" stop "$2"' \
      _ "$EPP_KUBE_OWNER_PID" "$dir" "$CHECKOUT/scripts/kube-env.sh" >/dev/null 2>&1 </dev/null &
  fi
  log "kube-apiserver ready at $server (state in $dir)"
  echo "$dir/kubeconfig"
}

cmd_stop() { # dir
  local dir="$1"
  kill_pidfile "$dir/apiserver.pid"
  kill_pidfile "$dir/etcd.pid"
  # etcd's data (~60 MB a cluster, five clusters a test run) goes with it;
  # the logs, certificates and kubeconfigs (~100 KB) stay for a failed
  # test's reader. Left behind, the data filled /tmp by 3 GB in a day.
  rm -rf "$dir/etcd-data"
}

case "${1:-}" in
  build) cmd_build ;;
  bin-dir) echo "$BIN_DIR" ;;
  start) cmd_start "${2:?usage: $0 start DIR}" ;;
  stop) cmd_stop "${2:?usage: $0 stop DIR}" ;;
  apiserver-stop) kill_pidfile "${2:?usage: $0 apiserver-stop DIR}/apiserver.pid" ;;
  apiserver-start) cmd_apiserver_start "${2:?usage: $0 apiserver-start DIR}" ;;
  *)
    echo "usage: $0 build | bin-dir | start DIR | stop DIR | apiserver-stop DIR | apiserver-start DIR" >&2
    exit 2
    ;;
esac
