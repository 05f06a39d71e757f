# syntax=docker/dockerfile:1.7
# Images of Toolyard, from one multi-stage build:
#
#   docker build --target gateway    -t ghcr.io/toolyard/gateway:0.1.0 .
#   docker build --target controller -t ghcr.io/toolyard/controller:0.1.0 .
#   docker build --target runner     -t ghcr.io/toolyard/runner:0.1.0 .
#   docker build --target agent      -t ghcr.io/toolyard/agent:0.1.0 .
#   docker build --target pricing    -t ghcr.io/toolyard/pricing:0.1.0 .
#
# The runner is linked statically (musl) because the controller copies it into arbitrary
# tool images with an init container (`cp /toolyard-runner /toolyard/bin/`).
# Note: this file is not exercised by CI (the CI machines have no container engine).

ARG RUST_VERSION=1.95
ARG PYTHON_IMAGE=python:3.12-slim-bookworm

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

# The gateway: MCP endpoint, internal runner API, metrics.
FROM gcr.io/distroless/cc-debian12:nonroot AS gateway
COPY --from=build /out/toolyard-gateway /usr/local/bin/toolyard-gateway
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/toolyard-gateway"]
CMD ["serve"]

# The controller: McpTool, ToolCall and CodingTask reconcilers.
FROM gcr.io/distroless/cc-debian12:nonroot AS controller
COPY --from=build /out/toolyard-controller /usr/local/bin/toolyard-controller
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/toolyard-controller"]

# The runner image used by the init container of every Job and pool pod (needs `cp`).
FROM busybox:1.36-musl AS runner
COPY --from=build /out/toolyard-runner /toolyard-runner
USER 65532:65532

# The coding agent: runner + Python with the `toolyard` package (the code-execution harness).
FROM ${PYTHON_IMAGE} AS agent
COPY worker-image/python /opt/toolyard/python
RUN pip install --no-cache-dir /opt/toolyard/python && rm -rf /opt/toolyard/python
COPY --from=build /out/toolyard-runner /toolyard-runner
USER 65532:65532
ENTRYPOINT ["/toolyard-runner", "agent"]

# The pricing example's tool image: Python with `toolyard` and the `pricing` package.
FROM ${PYTHON_IMAGE} AS pricing
COPY worker-image/python /opt/toolyard/python
RUN pip install --no-cache-dir /opt/toolyard/python && rm -rf /opt/toolyard/python
COPY examples/pricing/pricing /app/pricing
WORKDIR /app
ENV PYTHONPATH=/app
USER 65532:65532
