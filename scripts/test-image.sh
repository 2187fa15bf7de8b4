#!/usr/bin/env bash
# Builds the container image and tests it by running it:
#
#   scripts/test-image.sh
#
# 1. scripts/build-image.sh (static release epp, image in target/image/epp-oci.tar);
# 2. installs podman and runc when missing (Debian packages; needs root) and Envoy (scripts/setup.sh);
# 3. loads the image into podman (localhost/epp:<version>);
# 4. runs crates/epp-bin/tests/image.rs with --include-ignored, which checks:
#    - the image config: user 65532:65532, entrypoint /epp, ports 9002/9003/9090, the version
#      label, the revision label equal to this checkout's commit;
#    - its files, exactly: /epp (static: no program interpreter), /etc/passwd, /etc/group,
#      /etc/ssl/certs/ca-certificates.crt (Debian's roots, none of this machine's local CAs);
#      no /bin/sh, and `--entrypoint /bin/sh` cannot run while `--entrypoint /epp` can;
#    - the running container (host network, loopback only, read-only root, no capabilities,
#      no-new-privileges) pointed at an epp-sim: gRPC health SERVING for "", liveness, readiness,
#      inference-extension and the ext_proc service; /metrics answers and shows the simulator
#      scraped from inside the container; the process is epp as uid/gid 65532 with no
#      capabilities; a request through Envoy is routed by it to the simulator; SIGTERM through
#      podman drains it, it exits 0 and the container is gone.
#
# Root podman is needed (the test mounts the image to list its files). Podman here is told, through
# a containers.conf of its own (CONTAINERS_CONF), to use runc and explicit rlimits: on this
# project's machines (cgroup v1, no CAP_SYS_RESOURCE) crun refuses the hybrid cgroup layout and
# podman's default rlimits (nofile 1048576) cannot be set. Both settings also work elsewhere.
#
# Cold, from a fresh clone on the project's 2-core machine (shared, load 3-6): 262-320 s for the
# image (the musl release build) before Kubernetes discovery, 625 s with it; then 172-191 s for
# this script with the image built (Envoy into .venv, the debug build of the simulator and the
# test; none of it again after scripts/test.sh), and about a second for the tests themselves.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[test-image] %s\n' "$*" >&2; }
start=$SECONDS

if [ "$(id -u)" != 0 ]; then
  log "needs root (root podman mounts the image to list its files)"; exit 1
fi

ARCHIVE=$(scripts/build-image.sh)
IMAGE=localhost/$(cat "$(dirname "$ARCHIVE")/epp-oci.tag")

missing=()
command -v podman >/dev/null || missing+=(podman)
command -v runc >/dev/null || missing+=(runc)
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${missing[*]}"
  apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
fi
scripts/setup.sh --no-build

CONTAINERS_CONF=$PWD/target/image/containers.conf
nofile=$(ulimit -Hn)
[ "$nofile" = unlimited ] && nofile=1048576
cat > "$CONTAINERS_CONF" <<EOF
# Written by scripts/test-image.sh for its podman runs.
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=4096:4096"]
[engine]
runtime = "runc"
EOF
export CONTAINERS_CONF

log "loading $ARCHIVE as $IMAGE"
podman load --quiet --input "$ARCHIVE" >&2

log "building the simulator and the image test"
cargo build --quiet -p epp-sim --bin epp-sim
cargo test --quiet -p epp-bin --test image --no-run
log "running the image test"
EPP_IMAGE=$IMAGE cargo test -p epp-bin --test image -- --include-ignored
log "done in $((SECONDS - start)) s"
