# syntax=docker/dockerfile:1
# The hwaccel images. Both run `/hwaccel` as uid 65532 on distroless with the same entrypoint;
# the chart runs `/hwaccel agent ...`, `/hwaccel controller ...` and `/hwaccel cleanup ...`.
#
# static (the default, the last stage): one static musl binary on distroless/static. Use it
# everywhere. It cannot load shared libraries, and the image has no glibc loader to run a
# runtime-injected nvidia-smi, so on NVIDIA nodes its detection reads sysfs only.
#   docker build -t ghcr.io/hwaccel/hwaccel-operator:dev .
#   docker buildx build --platform linux/amd64,linux/arm64 -t ... .   (each arch builds natively)
#
# glibc: the same binary built for the glibc target on distroless/cc, so it can load NVML
# (libnvidia-ml.so.1) that the NVIDIA container runtime injects from the host's driver. For
# the chart's NVIDIA node pools (agent.nvml, docs/install.md#nvidia-nodes-nvml); its tag is
# the static tag with "-glibc" appended.
#   docker build --target glibc -t ghcr.io/hwaccel/hwaccel-operator:dev-glibc .
#
# tests/dockerfile.rs checks these stage names, targets and base images.

# The toolchain rust-toolchain.toml pins (tests/dockerfile.rs checks they agree).
ARG RUST_VERSION=1.95.0

# The glibc build: Debian bookworm's glibc (2.36), the one distroless/cc-debian12 ships.
FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS build-glibc
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    target="$(uname -m)-unknown-linux-gnu" \
 && cargo build --release --locked --bin hwaccel --target "$target" \
 && mkdir -p /out \
 && cp "target/$target/release/hwaccel" /out/hwaccel \
 && /out/hwaccel --version \
 && ldd /out/hwaccel | grep -q 'libc\.so\.6'

# distroless/cc: distroless/static plus glibc and libgcc (no shell, no package manager).
FROM gcr.io/distroless/cc-debian12:nonroot AS glibc
LABEL org.opencontainers.image.title="hwaccel-operator" \
      org.opencontainers.image.description="Finds every AI accelerator on every Kubernetes node and plans where models run on them (glibc build, loads NVML)" \
      org.opencontainers.image.source="https://github.com/hwaccel/hwaccel-operator" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build-glibc /out/hwaccel /hwaccel
USER 65532:65532
ENTRYPOINT ["/hwaccel"]

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
# package manager, no libc. The binary needs none of them. The last stage, so the default.
FROM gcr.io/distroless/static-debian12:nonroot AS static
LABEL org.opencontainers.image.title="hwaccel-operator" \
      org.opencontainers.image.description="Finds every AI accelerator on every Kubernetes node and plans where models run on them" \
      org.opencontainers.image.source="https://github.com/hwaccel/hwaccel-operator" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /out/hwaccel /hwaccel
USER 65532:65532
ENTRYPOINT ["/hwaccel"]
