# The epp container image, for builders with a registry (docker build, podman build, buildah):
#
#   docker build -t epp:0.1.0 \
#     --build-arg VERSION=0.1.0 --build-arg REVISION="$(git rev-parse HEAD)" .
#
# It holds the same files as the image scripts/build-image.sh assembles without a registry (the
# one scripts/test-image.sh runs): a static musl build of epp, /etc/passwd and /etc/group from
# deploy/image/ with the user nonroot (65532:65532) it runs as, and the CA roots of Debian's
# ca-certificates package for verified HTTPS scrapes. No shell, no package manager, no libc.
# Keep the two in step.
#
# The project's machines reach no image registry, so this file is not built by its tests. It was
# checked with buildah against a local stand-in for the rust image (Debian bookworm, Rust 1.95 via
# rustup): the result passes the same image test (EPP_IMAGE=localhost/epp:TAG
# cargo test -p epp-bin --test image -- --include-ignored).

FROM docker.io/library/rust:1.95-bookworm AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends musl-tools ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && rustup target add x86_64-unknown-linux-musl
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p epp-bin --bin epp --target x86_64-unknown-linux-musl \
 && install -D -m 0755 target/x86_64-unknown-linux-musl/release/epp /rootfs/epp \
 && strip --strip-debug /rootfs/epp \
 && install -D -m 0644 deploy/image/passwd /rootfs/etc/passwd \
 && install -D -m 0644 deploy/image/group /rootfs/etc/group \
 && mkdir -p /rootfs/etc/ssl/certs \
 && cat $(dpkg -L ca-certificates | grep '^/usr/share/ca-certificates/.*\.crt$' | LC_ALL=C sort) \
      > /rootfs/etc/ssl/certs/ca-certificates.crt \
 && chmod 0644 /rootfs/etc/ssl/certs/ca-certificates.crt

FROM scratch
ARG VERSION=0.1.0
ARG REVISION=unknown
COPY --from=build /rootfs/ /
USER 65532:65532
# ext_proc (gRPC), gRPC health, Prometheus metrics
EXPOSE 9002 9003 9090
WORKDIR /
ENTRYPOINT ["/epp"]
LABEL org.opencontainers.image.title="epp" \
      org.opencontainers.image.description="Endpoint picker for LLM inference (Envoy ext_proc)" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0"
