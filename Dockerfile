# syntax=docker/dockerfile:1.7
# Images of Toolyard, from one multi-stage build:
#
#   docker build --target gateway    -t ghcr.io/toolyard/gateway:0.1.0 .
#   docker build --target controller -t ghcr.io/toolyard/controller:0.1.0 .
#   docker build --target runner     -t ghcr.io/toolyard/runner:0.1.0 .
#   docker build --target agent      -t ghcr.io/toolyard/agent:0.1.0 .
#   docker build --target pricing    -t ghcr.io/toolyard/pricing:0.1.0 .
#   docker build --target dev-s3     -t ghcr.io/toolyard/dev-s3:0.1.0 .   # kind only
#
# scripts/kind.sh builds them all and loads them into a kind cluster. The tag is the chart's
# appVersion (charts/toolyard/Chart.yaml), which the chart uses when no tag is set.
#
# The runner is linked statically (musl) because the controller copies it into arbitrary
# tool images with an init container (`cp /toolyard-runner /toolyard/bin/`).
# Note: this file is not exercised by CI (the CI machines have no container engine).

ARG RUST_VERSION=1.95
ARG PYTHON_IMAGE=python:3.12-slim-bookworm
ARG VERSION=0.1.0
ARG S3S_VERSION=0.14.1

FROM rust:${RUST_VERSION}-bookworm AS build
RUN apt-get update && apt-get install -y --no-install-recommends musl-tools cmake clang && rm -rf /var/lib/apt/lists/*
RUN rustup target add x86_64-unknown-linux-musl
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry --mount=type=cache,target=/src/target \
    cargo build --release --locked -p toolyard-gateway -p toolyard-controller \
 && cargo build --release --locked -p toolyard-runner --target x86_64-unknown-linux-musl \
 && mkdir -p /out \
 && cp target/release/toolyard-gateway target/release/toolyard-controller /out/ \
 && cp target/x86_64-unknown-linux-musl/release/toolyard-runner /out/

# The S3-compatible server the tests use (s3s-fs), with the bucket `toolyard`: kind only.
FROM rust:${RUST_VERSION}-bookworm AS build-s3
ARG S3S_VERSION
RUN cargo install s3s-fs --version "${S3S_VERSION}" --features binary --locked --root /out \
 && mkdir -p /out/data/toolyard

# The gateway: MCP endpoint, internal runner API, metrics.
FROM gcr.io/distroless/cc-debian12:nonroot AS gateway
ARG VERSION
LABEL org.opencontainers.image.title="toolyard-gateway" \
      org.opencontainers.image.description="Toolyard gateway: MCP over Streamable HTTP, internal runner API" \
      org.opencontainers.image.source="https://github.com/toolyard/toolyard" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /out/toolyard-gateway /usr/local/bin/toolyard-gateway
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/toolyard-gateway"]
CMD ["serve"]

# The controller: McpTool, ToolCall and CodingTask reconcilers.
FROM gcr.io/distroless/cc-debian12:nonroot AS controller
ARG VERSION
LABEL org.opencontainers.image.title="toolyard-controller" \
      org.opencontainers.image.description="Toolyard controller: McpTool, ToolCall and CodingTask reconcilers" \
      org.opencontainers.image.source="https://github.com/toolyard/toolyard" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /out/toolyard-controller /usr/local/bin/toolyard-controller
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/toolyard-controller"]

# The runner image used by the init container of every Job and pool pod (needs `cp`).
FROM busybox:1.36-musl AS runner
ARG VERSION
LABEL org.opencontainers.image.title="toolyard-runner" \
      org.opencontainers.image.description="Toolyard runner, copied into every run pod by an init container" \
      org.opencontainers.image.source="https://github.com/toolyard/toolyard" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /out/toolyard-runner /toolyard-runner
USER 65532:65532

# The coding agent: runner + Python with the `toolyard` package (the code-execution harness).
FROM ${PYTHON_IMAGE} AS agent
ARG VERSION
LABEL org.opencontainers.image.title="toolyard-agent" \
      org.opencontainers.image.description="Toolyard coding agent: runner, Python 3 and the toolyard package" \
      org.opencontainers.image.source="https://github.com/toolyard/toolyard" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY worker-image/python /opt/toolyard/python
RUN pip install --no-cache-dir /opt/toolyard/python && rm -rf /opt/toolyard/python
COPY --from=build /out/toolyard-runner /toolyard-runner
USER 65532:65532
ENTRYPOINT ["/toolyard-runner", "agent"]

# The pricing example's tool image: Python with `toolyard` and the `pricing` package.
FROM ${PYTHON_IMAGE} AS pricing
ARG VERSION
LABEL org.opencontainers.image.title="toolyard-pricing" \
      org.opencontainers.image.description="The pricing example's tool image" \
      org.opencontainers.image.source="https://github.com/toolyard/toolyard" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY worker-image/python /opt/toolyard/python
RUN pip install --no-cache-dir /opt/toolyard/python && rm -rf /opt/toolyard/python
COPY examples/pricing/pricing /app/pricing
# Bytecode now: the pods' root filesystem is read-only, so Python could not cache it, and
# every call would compile the package again.
RUN python -m compileall -q /app
WORKDIR /app
ENV PYTHONPATH=/app
USER 65532:65532

# Development S3 server for kind (examples/kind/s3.yaml). Not for production.
FROM gcr.io/distroless/cc-debian12:nonroot AS dev-s3
ARG VERSION
LABEL org.opencontainers.image.title="toolyard-dev-s3" \
      org.opencontainers.image.description="s3s-fs with the bucket toolyard, for trying Toolyard on kind" \
      org.opencontainers.image.source="https://github.com/toolyard/toolyard" \
      org.opencontainers.image.version="${VERSION}"
COPY --from=build-s3 /out/bin/s3s-fs /usr/local/bin/s3s-fs
COPY --from=build-s3 --chown=65532:65532 /out/data /data
USER 65532:65532
EXPOSE 9000
ENTRYPOINT ["/usr/local/bin/s3s-fs"]
