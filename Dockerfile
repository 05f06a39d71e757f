# Images of Toolyard, from one multi-stage build:
#
#   docker build --target gateway    -t ghcr.io/toolyard/gateway:0.1.0 .
#   docker build --target controller -t ghcr.io/toolyard/controller:0.1.0 .
#   docker build --target runner     -t ghcr.io/toolyard/runner:0.1.0 .
#   docker build --target agent      -t ghcr.io/toolyard/agent:0.1.0 .
#   docker build --target pricing    -t ghcr.io/toolyard/pricing:0.1.0 .
#   docker build --target risk       -t ghcr.io/toolyard/risk:0.1.0 .      # pip installs numpy, pandas, matplotlib
#   docker build --target dev-s3     -t ghcr.io/toolyard/dev-s3:0.1.0 .   # development only
#
# The tag is the chart's appVersion (charts/toolyard/Chart.yaml), which the chart uses when no
# tag is set. Needs BuildKit (DOCKER_BUILDKIT=1 with Docker 20.10 and later, the default since 23).
#
# Where the binaries come from (BINARIES):
#   compile   (default) compiled here, in RUST_IMAGE: a plain build from source.
#   prebuilt  copied from .toolyard/image-bin/ in the build context: toolyard-gateway,
#             toolyard-controller, toolyard-runner (statically linked), s3s-fs. The test
#             harness (tests/cluster/images.sh) uses it with the binaries it has built already.
#
# The runner is linked statically (glibc, `-C target-feature=+crt-static`) because the
# controller copies it into arbitrary tool images with an init container: Debian-based ones,
# distroless ones and ones without any libc (busybox). The base images are build arguments, so
# a machine without a registry can build from base images it made itself.

ARG RUST_IMAGE=rust:1.95-bookworm
ARG PYTHON_IMAGE=python:3.12-slim-bookworm
ARG CC_IMAGE=gcr.io/distroless/cc-debian12:nonroot
ARG BUSYBOX_IMAGE=busybox:1.36-musl
ARG BINARIES=compile
# Wheels for an offline build of the risk image (see examples/risk/wheels/README.md).
ARG RISK_WHEELS=examples/risk/wheels
ARG VERSION=0.1.0
ARG S3S_VERSION=0.14.1

FROM ${RUST_IMAGE} AS compile
ARG S3S_VERSION
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry --mount=type=cache,target=/src/target \
    cargo build --release --locked -p toolyard-gateway -p toolyard-controller -p toolyard-cli \
 && RUSTFLAGS="-C target-feature=+crt-static" \
    cargo build --release --locked -p toolyard-runner --target x86_64-unknown-linux-gnu \
 && mkdir -p /out/data/toolyard \
 && cp target/release/toolyard-gateway target/release/toolyard-controller target/release/toolyard /out/ \
 && cp target/x86_64-unknown-linux-gnu/release/toolyard-runner /out/
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    cargo install s3s-fs --version "${S3S_VERSION}" --features binary --locked --root /s3s \
 && cp /s3s/bin/s3s-fs /out/

FROM scratch AS prebuilt
COPY .toolyard/image-bin/ /out/

FROM ${BINARIES} AS binaries

# The gateway: MCP endpoint, internal runner API, metrics.
FROM ${CC_IMAGE} AS gateway
ARG VERSION
LABEL org.opencontainers.image.title="toolyard-gateway" \
      org.opencontainers.image.description="Toolyard gateway: MCP over Streamable HTTP, internal runner API" \
      org.opencontainers.image.source="https://github.com/toolyard/toolyard" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=binaries /out/toolyard-gateway /usr/local/bin/toolyard-gateway
# The `toolyard` command (check, test, call), e.g. `kubectl exec deploy/toolyard-gateway -- toolyard --help`.
COPY --from=binaries /out/toolyard /usr/local/bin/toolyard
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/toolyard-gateway"]
CMD ["serve"]

# The controller: McpTool, ToolCall and CodingTask reconcilers.
FROM ${CC_IMAGE} AS controller
ARG VERSION
LABEL org.opencontainers.image.title="toolyard-controller" \
      org.opencontainers.image.description="Toolyard controller: McpTool, ToolCall and CodingTask reconcilers" \
      org.opencontainers.image.source="https://github.com/toolyard/toolyard" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=binaries /out/toolyard-controller /usr/local/bin/toolyard-controller
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/toolyard-controller"]

# The runner image used by the init container of every Job and pool pod (needs `cp`).
FROM ${BUSYBOX_IMAGE} AS runner
ARG VERSION
LABEL org.opencontainers.image.title="toolyard-runner" \
      org.opencontainers.image.description="Toolyard runner, copied into every run pod by an init container" \
      org.opencontainers.image.source="https://github.com/toolyard/toolyard" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=binaries /out/toolyard-runner /toolyard-runner
USER 65532:65532

# The `toolyard` Python package has no dependencies: it is copied, not pip-installed, so any
# Python >= 3.10 image serves (no pip, no build backend, no network at build time).
# The coding agent: runner + Python with the `toolyard` package (the code-execution harness).
FROM ${PYTHON_IMAGE} AS agent
ARG VERSION
LABEL org.opencontainers.image.title="toolyard-agent" \
      org.opencontainers.image.description="Toolyard coding agent: runner, Python 3 and the toolyard package" \
      org.opencontainers.image.source="https://github.com/toolyard/toolyard" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY worker-image/python/toolyard /opt/toolyard/python/toolyard
RUN python3 -m compileall -q /opt/toolyard/python
ENV TOOLYARD_AGENT_PYTHONPATH=/opt/toolyard/python
COPY --from=binaries /out/toolyard-runner /toolyard-runner
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
COPY worker-image/python/toolyard /opt/toolyard/python/toolyard
COPY examples/pricing/pricing /app/pricing
# Bytecode now: the pods' root filesystem is read-only, so Python could not cache it, and
# every call would compile the packages again.
RUN python3 -m compileall -q /opt/toolyard/python /app
WORKDIR /app
ENV PYTHONPATH=/app:/opt/toolyard/python
USER 65532:65532

# The risk example's tool image: Python with `toolyard`, the `risk` package and its pip
# dependencies (examples/risk/requirements.txt). pip runs in a stage of its own, so the image
# holds the installed packages and not pip's cache or the wheels. With wheels in RISK_WHEELS
# nothing is downloaded (and pip itself may come from a wheel there when the base has none).
FROM ${PYTHON_IMAGE} AS risk-deps
ARG RISK_WHEELS
COPY ${RISK_WHEELS}/ /tmp/wheels/
COPY examples/risk/requirements.txt /tmp/requirements.txt
RUN set -eu; \
    if python3 -m pip --version >/dev/null 2>&1; then pip="python3 -m pip"; \
    else pip="python3 $(ls /tmp/wheels/pip-*.whl)/pip"; fi; \
    if ls /tmp/wheels/*.whl >/dev/null 2>&1; then from="--no-index --find-links /tmp/wheels"; else from=""; fi; \
    $pip install --no-cache-dir --disable-pip-version-check --target /opt/risk/site $from -r /tmp/requirements.txt

FROM ${PYTHON_IMAGE} AS risk
ARG VERSION
LABEL org.opencontainers.image.title="toolyard-risk" \
      org.opencontainers.image.description="The risk example's tool image" \
      org.opencontainers.image.source="https://github.com/toolyard/toolyard" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=risk-deps /opt/risk/site /opt/risk/site
COPY worker-image/python/toolyard /opt/toolyard/python/toolyard
COPY examples/risk/risk /app/risk
RUN python3 -m compileall -q /opt/toolyard/python /app
WORKDIR /app
# Matplotlib keeps its font cache in MPLCONFIGDIR: /tmp is the pod's one writable folder.
ENV PYTHONPATH=/app:/opt/toolyard/python:/opt/risk/site MPLCONFIGDIR=/tmp/matplotlib MPLBACKEND=Agg
USER 65532:65532

# Development S3 server (s3s-fs, with the bucket `toolyard`) for trying Toolyard on a local
# cluster (examples/kind/s3.yaml). Not for production.
FROM ${CC_IMAGE} AS dev-s3
ARG VERSION
LABEL org.opencontainers.image.title="toolyard-dev-s3" \
      org.opencontainers.image.description="s3s-fs with the bucket toolyard, for trying Toolyard on a local cluster" \
      org.opencontainers.image.source="https://github.com/toolyard/toolyard" \
      org.opencontainers.image.version="${VERSION}"
COPY --from=binaries /out/s3s-fs /usr/local/bin/s3s-fs
COPY --from=binaries --chown=65532:65532 /out/data /data
USER 65532:65532
EXPOSE 9000
# s3s-fs stops on SIGINT only, and a container's first process ignores a signal it does not
# handle: with SIGTERM, every stop (a scale-down, an uninstall) waited out the pod's grace period.
STOPSIGNAL SIGINT
ENTRYPOINT ["/usr/local/bin/s3s-fs"]
