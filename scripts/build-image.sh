#!/usr/bin/env bash
# Builds the epp container image from scratch, without a registry or a daemon:
#
#   scripts/build-image.sh            # -> target/image/epp-oci.tar
#
# What it does, idempotently (run it again after a change; it rebuilds what changed):
#   1. installs what it needs when missing: the Rust target x86_64-unknown-linux-musl (rustup),
#      Debian's musl-tools (a C compiler for ring's and mimalloc's C code), umoci (assembles the
#      OCI image) and ca-certificates (the CA roots put into the image);
#   2. builds `epp` in release mode as a static musl binary (no libc in the image to match);
#   3. assembles an OCI image with one layer holding only:
#        /epp                                 the binary (debug info stripped, symbols kept)
#        /etc/passwd, /etc/group              root and the user epp runs as, nonroot (65532:65532)
#        /etc/ssl/certs/ca-certificates.crt   CA roots for verified HTTPS metric scrapes: the
#                                             certificates Debian's ca-certificates package ships,
#                                             not this machine's bundle (which may hold local CAs)
#      and a config: User 65532:65532, Entrypoint ["/epp"], ports 9002 (ext_proc),
#      9003 (gRPC health), 9090 (metrics), OCI labels with the version and the git commit;
#   4. writes it as an OCI archive (`target/image/epp-oci.tar`, tag epp:<version>), prints its path,
#      digest and size. Load it with `podman load -i target/image/epp-oci.tar` (or
#      `skopeo copy oci-archive:target/image/epp-oci.tar docker-daemon:epp:<version>` for Docker).
#
# No shell, no package manager, no libc. The root Dockerfile builds the same file set for users
# with a registry. The image's timestamps are the commit's, so two builds of one commit give the
# same layer when the binary is the same.
#
# Environment: CARGO_BUILD_JOBS as for cargo; EPP_IMAGE_OUT (default target/image) to write elsewhere.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[build-image] %s\n' "$*" >&2; }

TARGET=x86_64-unknown-linux-musl
OUT=${EPP_IMAGE_OUT:-target/image}

# 1. Tools.
if ! rustup target list --installed | grep -qx "$TARGET"; then
  log "adding the Rust target $TARGET"
  rustup target add "$TARGET"
fi
missing=()
command -v musl-gcc >/dev/null || missing+=(musl-tools)
command -v umoci >/dev/null || missing+=(umoci)
dpkg -s ca-certificates >/dev/null 2>&1 || missing+=(ca-certificates)
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${missing[*]}"
  SUDO=; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
fi

# 2. The static binary.
log "building epp (release, $TARGET)"
start=$SECONDS
nice -n 10 cargo build --release --locked -p epp-bin --bin epp --target "$TARGET" --quiet
BIN=target/$TARGET/release/epp
if ! ldd "$BIN" 2>&1 | grep -Eq 'statically linked|not a dynamic executable'; then
  log "$BIN is dynamically linked; the image has no libc for it"; exit 1
fi
log "built in $((SECONDS - start)) s"

VERSION=$("$BIN" --version | awk '{print $2}')
REVISION=$(git rev-parse HEAD)
git diff --quiet HEAD -- 2>/dev/null || REVISION="$REVISION-dirty"
EPOCH=$(git log -1 --format=%ct HEAD)
CREATED=$(date -u -d "@$EPOCH" +%Y-%m-%dT%H:%M:%SZ)

# 3. The image: a blank OCI image unpacked into a bundle, the files put into its root file system,
# repacked as one layer. Built in a scratch directory, moved into place at the end.
WORK=$(mktemp -d "${TMPDIR:-/tmp}/epp-image.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
LAYOUT=$WORK/oci
BUNDLE=$WORK/bundle
TAG=build  # working tag; renamed to the full reference at the end
ROOTLESS=; [ "$(id -u)" = 0 ] || ROOTLESS=--rootless  # then files are recorded as uid/gid 0
umoci init --layout "$LAYOUT"
umoci new --image "$LAYOUT:$TAG"
umoci unpack $ROOTLESS --image "$LAYOUT:$TAG" "$BUNDLE"
ROOT=$BUNDLE/rootfs
install -d -m 0755 "$ROOT/etc" "$ROOT/etc/ssl" "$ROOT/etc/ssl/certs"
install -m 0755 "$BIN" "$ROOT/epp"
strip --strip-debug "$ROOT/epp"
install -m 0644 deploy/image/passwd "$ROOT/etc/passwd"
install -m 0644 deploy/image/group "$ROOT/etc/group"
# The package's roots only: /etc/ssl/certs/ca-certificates.crt also holds whatever was added
# under /usr/local/share/ca-certificates on the building machine.
mapfile -t cas < <(dpkg -L ca-certificates | grep '^/usr/share/ca-certificates/.*\.crt$' | LC_ALL=C sort)
[ ${#cas[@]} -gt 0 ] || { log "the ca-certificates package lists no certificates"; exit 1; }
cat "${cas[@]}" > "$ROOT/etc/ssl/certs/ca-certificates.crt"
chmod 0644 "$ROOT/etc/ssl/certs/ca-certificates.crt"
[ -n "$ROOTLESS" ] || chown -R 0:0 "$ROOT"
chmod 0755 "$ROOT"
find "$ROOT" -exec touch -h -d "@$EPOCH" {} +
umoci repack $ROOTLESS --image "$LAYOUT:$TAG" \
  --history.created "$CREATED" --history.created_by "scripts/build-image.sh: epp, passwd, group, CA roots" \
  "$BUNDLE"
umoci config --image "$LAYOUT:$TAG" \
  --created "$CREATED" --author "epp-rs" \
  --architecture amd64 --os linux \
  --config.user 65532:65532 \
  --config.entrypoint /epp \
  --config.workingdir / \
  --config.exposedports 9002/tcp --config.exposedports 9003/tcp --config.exposedports 9090/tcp \
  --config.label org.opencontainers.image.title=epp \
  --config.label "org.opencontainers.image.description=Endpoint picker for LLM inference (Envoy ext_proc)" \
  --config.label "org.opencontainers.image.version=$VERSION" \
  --config.label "org.opencontainers.image.revision=$REVISION" \
  --config.label "org.opencontainers.image.created=$CREATED" \
  --config.label org.opencontainers.image.licenses=Apache-2.0 \
  --manifest.annotation "org.opencontainers.image.version=$VERSION" \
  --manifest.annotation "org.opencontainers.image.revision=$REVISION" \
  --no-history
# The archive's one name is a full reference, so `podman load` names the image epp:<version>.
umoci tag --image "$LAYOUT:$TAG" "epp:$VERSION"
umoci rm --image "$LAYOUT:$TAG"
umoci gc --layout "$LAYOUT"

# 4. The archive: an OCI layout in a tar, as `oci-archive:` transports read it.
mkdir -p "$OUT"
tar --sort=name --mtime="@$EPOCH" --owner=0 --group=0 --numeric-owner \
  -C "$LAYOUT" -cf "$WORK/epp-oci.tar" .
mv -f "$WORK/epp-oci.tar" "$OUT/epp-oci.tar"
printf 'epp:%s\n' "$VERSION" > "$OUT/epp-oci.tag"
DIGEST=$(grep -o '"digest":"sha256:[0-9a-f]*"' "$LAYOUT/index.json" | cut -d'"' -f4)
log "image epp:$VERSION (revision $REVISION), manifest $DIGEST"
log "binary $(du -h "$ROOT/epp" | cut -f1), archive $(du -h "$OUT/epp-oci.tar" | cut -f1)"
echo "$OUT/epp-oci.tar"
