# syntax=docker/dockerfile:1
# The hwaccel image: one static binary (/hwaccel) on distroless, running as uid 65532.
#   docker build -t ghcr.io/hwaccel/hwaccel-operator:dev .
#   docker buildx build --platform linux/amd64,linux/arm64 -t ... .   (each arch builds natively)
# The chart runs `/hwaccel agent ...`, `/hwaccel controller ...` and `/hwaccel cleanup ...`.

ARG RUST_VERSION=1

FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS build
# musl-tools: a C compiler for the musl target (ring, used by rustls, has C and assembly parts).
RUN apt-get update \
 && apt-get install -y --no-install-recommends musl-tools \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# The target follows the build platform's architecture (x86_64 or aarch64); the caches keep
# the registry and the build directory between builds.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    target="$(uname -m)-unknown-linux-musl" \
 && rustup target add "$target" \
 && cargo build --release --locked --bin hwaccel --target "$target" \
 && mkdir -p /out \
 && cp "target/$target/release/hwaccel" /out/hwaccel \
 && /out/hwaccel --version

# distroless/static: CA certificates, /etc/passwd with the nonroot user, tzdata; no shell, no
# package manager, no libc. The binary needs none of them.
FROM gcr.io/distroless/static-debian12:nonroot
LABEL org.opencontainers.image.title="hwaccel-operator" \
      org.opencontainers.image.description="Finds every AI accelerator on every Kubernetes node and plans where models run on them" \
      org.opencontainers.image.source="https://github.com/hwaccel/hwaccel-operator" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /out/hwaccel /hwaccel
USER 65532:65532
ENTRYPOINT ["/hwaccel"]
