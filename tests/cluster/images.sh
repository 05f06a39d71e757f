#!/usr/bin/env bash
# Builds every container image the chart, the examples and the tests use, with no registry:
#
#   1. base images made from Debian packages with mmdebstrap (cached in
#      $TOOLYARD_CACHE/images, rebuilt when their recipe changes):
#        toolyard.local/cc       libc, libgcc, libssl, CA certificates, user 65532 (a distroless/cc stand-in)
#        toolyard.local/python   Debian bookworm minbase with python3 (a python:3-slim stand-in)
#        toolyard.local/busybox  busybox-static alone: no libc at all (a busybox stand-in)
#   2. the statically linked runner (cargo, `-C target-feature=+crt-static`);
#      every binary is of the profile TOOLYARD_IMAGE_PROFILE names: `debug` (the default, what
#      the tests build) or `release` (for benches on the node: `cargo build --release
#      --workspace --bins` first);
#   3. the Dockerfile's images from the binaries built already (`--build-arg BINARIES=prebuilt`):
#        ghcr.io/toolyard/{gateway,controller,runner,agent,pricing,risk,dev-s3}:<appVersion>
#      and the test images: the pause and CoreDNS images of the test node, an MCP server on the
#      official Python SDK, the misbehaving fixtures, one tool image of each kind the runner
#      must run in, and the node_pool bench's Python SDK server of the pricing function;
#   4. one `docker save` archive of them all: $TOOLYARD_CACHE/images/images.tar (printed last),
#      which tests/cluster/cluster.sh imports into the node's containerd.
#
# dockerd runs only while this script does, in its own mount namespace, network namespace
# (loopback only: builds never reach a network) and cgroup; its layer cache is kept in
# $TOOLYARD_CACHE/images/docker.
#
# Environment: TOOLYARD_CACHE, CARGO_TARGET_DIR (where the workspace's binaries were built),
# TOOLYARD_IMAGE_PROFILE (debug or release), TOOLYARD_DEBIAN_MIRROR (default: mmdebstrap's,
# deb.debian.org).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
# shellcheck source=tests/cluster/lib.sh
source "$HERE/lib.sh"
CACHE=${TOOLYARD_CACHE:-$HOME/.cache/toolyard}
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
IMAGES=$CACHE/images
BIN=$("$HERE/build.sh" path)
VERSION=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$ROOT/charts/toolyard/Chart.yaml")
S3S_VERSION=$(basename "$BIN" | sed -n 's/.*-s3s-\([^-]*\)-.*/\1/p')
COREDNS_VERSION=$(basename "$BIN" | sed -n 's/.*-coredns-\([^-]*\)-.*/\1/p')
ID=$(openssl rand -hex 3)
GROUP=toolyard-images-$ID
WORK=$(mktemp -d "${TMPDIR:-/tmp}/toolyard-images-XXXXXX")
DOCKER=/usr/bin/docker
SOCK=$WORK/docker.sock
PROFILE=${TOOLYARD_IMAGE_PROFILE:-debug}
case $PROFILE in
  debug) PROFILE_FLAG=() ;;
  release) PROFILE_FLAG=(--release) ;;
  *) die "TOOLYARD_IMAGE_PROFILE is debug or release, not '$PROFILE'" ;;
esac

((EUID == 0)) || die "building images needs root (dockerd, mmdebstrap)"
for b in dockerd "$DOCKER" mmdebstrap unshare apt-get dpkg-deb gcc; do
  command -v "$b" >/dev/null 2>&1 || die "$b is missing: run tests/cluster/build.sh debs"
done
for b in pause coredns s3s-fs; do
  [[ -x $BIN/$b ]] || die "$BIN/$b is missing: run tests/cluster/build.sh"
done
for b in toolyard-gateway toolyard-controller toolyard; do
  [[ -x $TARGET/$PROFILE/$b ]] || die "$TARGET/$PROFILE/$b is missing: run 'cargo build ${PROFILE_FLAG[*]} --workspace --bins' first"
done
mkdir -p "$IMAGES"

cleanup() {
  local pid
  pid=$(cat "$WORK/dockerd.pid" 2>/dev/null) || pid=
  if [[ -n $pid ]]; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  fi
  cgroup_kill "$GROUP" || log "could not stop everything in cgroup $GROUP"
  rm -rf "$WORK" "$ROOT/.toolyard/image-bin" "$ROOT/.toolyard/risk-wheels"
}
trap cleanup EXIT
cgroup_create "$GROUP"

# --- 1. base images ---------------------------------------------------------------------
MIRROR=()
[[ -n ${TOOLYARD_DEBIAN_MIRROR:-} ]] && MIRROR=("$TOOLYARD_DEBIAN_MIRROR")
NONROOT_HOOK='printf "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n" > "$1/etc/passwd"; printf "root:x:0:\nnonroot:x:65532:\nnobody:x:65534:\n" > "$1/etc/group"; mkdir -p "$1/home/nonroot" "$1/tmp"; chown 65532:65532 "$1/home/nonroot"; chmod 1777 "$1/tmp"'
SLIM_OPTS=(--aptopt='APT::Install-Recommends "false"' --aptopt='Acquire::Languages "none"'
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*'
  --dpkgopt='path-include=/usr/share/doc/*/copyright' --dpkgopt='path-exclude=/usr/share/locale/*')

# mmdebstrap mounts /proc and /dev in the new tree while it works: in a mount namespace of
# its own, those mounts cannot outlive it. (The extract variant runs extract hooks only: no
# maintainer script runs, so the CA bundle is assembled by hand.)
debootstrap_cc() {
  unshare --mount --propagation private mmdebstrap --quiet --format=tar --variant=extract \
    --include=libc6,libgcc-s1,libssl3,ca-certificates,tzdata,netbase "${SLIM_OPTS[@]}" \
    --extract-hook='mkdir -p "$1/etc/ssl/certs" && cat "$1"/usr/share/ca-certificates/mozilla/*.crt > "$1/etc/ssl/certs/ca-certificates.crt"' \
    --extract-hook="$NONROOT_HOOK" \
    bookworm "$1" "${MIRROR[@]}"
}
debootstrap_python() {
  unshare --mount --propagation private mmdebstrap --quiet --format=tar --variant=minbase \
    --include=python3,ca-certificates "${SLIM_OPTS[@]}" \
    --customize-hook='chroot "$1" useradd --uid 65532 --user-group --create-home nonroot' \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin' \
    bookworm "$1" "${MIRROR[@]}"
}
debootstrap_busybox() {
  local out=$1 d
  d=$(mktemp -d "$WORK/busybox-XXXXXX")
  (cd "$d" && apt-get download busybox-static >/dev/null 2>&1) || die "apt-get download busybox-static failed"
  dpkg-deb -x "$d"/busybox-static_*.deb "$d/pkg"
  mkdir -p "$d/root/bin" "$d/root/tmp" "$d/root/etc"
  cp "$d/pkg/bin/busybox" "$d/root/bin/busybox"
  for applet in $("$d/root/bin/busybox" --list); do
    [[ $applet == busybox ]] || ln -s busybox "$d/root/bin/$applet"
  done
  chmod 1777 "$d/root/tmp"
  printf 'root:x:0:0:root:/root:/bin/sh\nnonroot:x:65532:65532:nonroot:/tmp:/bin/sh\n' >"$d/root/etc/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' >"$d/root/etc/group"
  tar -C "$d/root" -cf "$out" .
}

# base_image <name>: the tag of toolyard.local/<name>, a hash of its recipe; the archive is
# made once per recipe and cached.
base_image() {
  local name=$1 hash tar
  hash=$(declare -f "debootstrap_$name" | cat - <(echo "$NONROOT_HOOK ${SLIM_OPTS[*]} ${MIRROR[*]}") | sha256sum | cut -c1-12)
  tar=$IMAGES/base-$name-$hash.tar
  if [[ ! -s $tar ]]; then
    log "making the base image toolyard.local/$name from Debian packages (about a minute)"
    rm -f "$IMAGES"/base-"$name"-*.tar
    "debootstrap_$name" "$tar.part" >"$WORK/base-$name.log" 2>&1 || die "making base image $name failed: $(tail -n 5 "$WORK/base-$name.log")"
    mv "$tar.part" "$tar"
  fi
  if ! "$DOCKER" -H "unix://$SOCK" image inspect "toolyard.local/$name:$hash" >/dev/null 2>&1; then
    "$DOCKER" -H "unix://$SOCK" import "$tar" "toolyard.local/$name:$hash" >/dev/null
  fi
  echo "toolyard.local/$name:$hash"
}

# --- dockerd ----------------------------------------------------------------------------
# Its own network namespace (loopback only), mount namespace and cgroup; no bridge, no
# iptables rules.
start_in "$GROUP" "$WORK/dockerd.log" unshare --net --mount --propagation private -- \
  dockerd --data-root "$IMAGES/docker" --exec-root "$WORK/exec" --pidfile "$WORK/dockerd.pid" \
  -H "unix://$SOCK" --bridge=none --iptables=false --ip-forward=false --ip-masq=false \
  --storage-driver=overlay2 --log-level=warn >/dev/null
for _ in $(seq 150); do
  "$DOCKER" -H "unix://$SOCK" version >/dev/null 2>&1 && break
  sleep 0.2
done
"$DOCKER" -H "unix://$SOCK" version >/dev/null 2>&1 || die "dockerd did not start: $(tail -n 5 "$WORK/dockerd.log")"
export DOCKER_HOST=unix://$SOCK DOCKER_BUILDKIT=1

CC_IMAGE=$(base_image cc)
PYTHON_IMAGE=$(base_image python)
BUSYBOX_IMAGE=$(base_image busybox)

# --- 2. binaries ------------------------------------------------------------------------
log "building the statically linked runner"
RUSTFLAGS="-C target-feature=+crt-static" cargo build --quiet "${PROFILE_FLAG[@]}" -p toolyard-runner --target x86_64-unknown-linux-gnu \
  || die "building the static runner failed"
STAGE=$ROOT/.toolyard/image-bin
rm -rf "$STAGE"; mkdir -p "$STAGE/data/toolyard"
# Without debug information: the images hold what a release would run.
for b in "$TARGET/$PROFILE/toolyard-gateway" "$TARGET/$PROFILE/toolyard-controller" "$TARGET/$PROFILE/toolyard" \
         "$TARGET/x86_64-unknown-linux-gnu/$PROFILE/toolyard-runner" "$BIN/s3s-fs"; do
  objcopy --strip-debug "$b" "$STAGE/$(basename "$b")"
done

# The risk example's image pip-installs its requirements: the wheels for the image's Python
# (Debian bookworm's 3.11), and pip's own (the base image has no pip), are downloaded once with
# the test venv's pip into the cache, and given to the build, which has no network.
risk_wheels() {
  local python=${TOOLYARD_TEST_PYTHON:-$CACHE/venv/bin/python} reqs=$ROOT/examples/risk/requirements.txt key dir
  key=$(sha256sum "$reqs" | cut -c1-12)
  dir=$CACHE/images/risk-wheels-py311-$key
  if [[ ! -d $dir ]]; then
    rm -rf "$CACHE"/images/risk-wheels-py311-* && mkdir -p "$dir.tmp"
    "$python" -m pip download --quiet --disable-pip-version-check --only-binary=:all: \
      --python-version 3.11 --implementation cp --abi cp311 \
      --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
      --platform any -d "$dir.tmp" -r "$reqs" pip >&2 || die "downloading the risk example's wheels failed"
    mv "$dir.tmp" "$dir"
  fi
  echo "$dir"
}
mkdir -p "$ROOT/.toolyard"
rm -rf "$ROOT/.toolyard/risk-wheels" && cp -r "$(risk_wheels)" "$ROOT/.toolyard/risk-wheels"

# --- 3. images --------------------------------------------------------------------------
build() { # <tag> <docker build args...>
  local tag=$1
  shift
  "$DOCKER" build --quiet --network=none -t "$tag" "$@" >"$WORK/build.log" 2>&1 \
    || die "docker build of $tag failed: $(tail -n 20 "$WORK/build.log")"
}
ARGS=(--build-arg BINARIES=prebuilt --build-arg "VERSION=$VERSION" --build-arg "CC_IMAGE=$CC_IMAGE"
  --build-arg "PYTHON_IMAGE=$PYTHON_IMAGE" --build-arg "BUSYBOX_IMAGE=$BUSYBOX_IMAGE"
  --build-arg RISK_WHEELS=.toolyard/risk-wheels)
TAGS=()
for target in gateway controller runner agent pricing risk dev-s3; do
  log "image ghcr.io/toolyard/$target:$VERSION"
  build "ghcr.io/toolyard/$target:$VERSION" --target "$target" "${ARGS[@]}" "$ROOT"
  TAGS+=("ghcr.io/toolyard/$target:$VERSION")
done

# Test images, each from a small context of its own.
context() { local d; d=$(mktemp -d "$WORK/context-XXXXXX"); echo "$d"; }
c=$(context); cp "$BIN/pause" "$c/pause"
printf 'FROM scratch\nCOPY pause /pause\nUSER 65535:65535\nENTRYPOINT ["/pause"]\n' >"$c/Dockerfile"
build toolyard.local/pause:toolyard "$c"; TAGS+=(toolyard.local/pause:toolyard)

c=$(context); cp "$BIN/coredns" "$c/coredns"
printf 'FROM %s\nCOPY coredns /coredns\nENTRYPOINT ["/coredns"]\n' "$CC_IMAGE" >"$c/Dockerfile"
build "toolyard.local/coredns:$COREDNS_VERSION" "$c"; TAGS+=("toolyard.local/coredns:$COREDNS_VERSION")

# py311_site <name> <requirement...>: the packages of the requirements, as a site folder for the
# images' Python (Debian bookworm's 3.11): wheels downloaded once with the test venv's pip (the
# builds themselves have no network), unpacked, and cached by name and requirements.
py311_site() {
  local name=$1 python=${TOOLYARD_TEST_PYTHON:-$CACHE/venv/bin/python} key dir
  shift
  key=$(printf '%s\n' "$@" | sha256sum | cut -c1-12)
  dir=$CACHE/images/$name-py311-$key
  if [[ ! -d $dir/site ]]; then
    rm -rf "$dir.tmp" "$CACHE/images/$name"-py311-* && mkdir -p "$dir.tmp/wheels" "$dir.tmp/site"
    "$python" -m pip download --quiet --disable-pip-version-check --only-binary=:all: \
      --python-version 3.11 --implementation cp --abi cp311 \
      --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
      --platform manylinux_2_34_x86_64 --platform any -d "$dir.tmp/wheels" "$@" >&2 || die "downloading the wheels of $* failed"
    for wheel in "$dir.tmp/wheels"/*.whl; do
      "$python" -m zipfile -e "$wheel" "$dir.tmp/site" || die "unpacking $wheel failed"
    done
    rm -rf "$dir" && mv "$dir.tmp" "$dir"
  fi
  echo "$dir/site"
}

# The misbehaving tools' image also holds toolyard[tracing]'s packages (OpenTelemetry's SDK and
# OTLP exporter, the versions tests/python-requirements.txt pins), so the function's own span
# is tested on the node.
mapfile -t OTEL_REQS < <(grep '^opentelemetry-' "$ROOT/tests/python-requirements.txt")
c=$(context); cp "$ROOT/tests/fixtures/misbehaving/"{Dockerfile,misbehaving.py} "$c/"
cp -r "$(py311_site otel "${OTEL_REQS[@]}")" "$c/otel"
build "ghcr.io/toolyard/test-misbehaving:$VERSION" --build-arg "BASE=ghcr.io/toolyard/pricing:$VERSION" "$c"
TAGS+=("ghcr.io/toolyard/test-misbehaving:$VERSION")

# An MCP server Toolyard runs in the cluster: the official Python SDK (the version
# tests/python-requirements.txt pins) and the upstream fixture server, which speaks stdio.
MCP_SITE=$(py311_site mcp "$(grep '^mcp==' "$ROOT/tests/python-requirements.txt")")
c=$(context); cp -r "$MCP_SITE" "$c/site"
cp "$ROOT/tests/fixtures/python/upstream_server.py" "$c/"
printf 'FROM %s\nCOPY site /app/site\nCOPY upstream_server.py /app/\nENV PYTHONPATH=/app/site\nUSER 65532:65532\n' "$PYTHON_IMAGE" >"$c/Dockerfile"
build "toolyard.local/test-mcp-python:$VERSION" "$c"; TAGS+=("toolyard.local/test-mcp-python:$VERSION")

# The node_pool bench's comparison: the official Python SDK serving the pricing example's
# price_option in-process (tests/benches/python/pricing_server.py), on the pricing image.
c=$(context); cp -r "$MCP_SITE" "$c/site"; cp "$ROOT/tests/benches/python/pricing_server.py" "$c/"
printf 'FROM %s\nUSER 0:0\nCOPY site /opt/mcp\nCOPY pricing_server.py /opt/bench/\nRUN python3 -m compileall -q /opt/mcp /opt/bench\nENV PYTHONPATH=/app:/opt/mcp\nUSER 65532:65532\n' \
  "ghcr.io/toolyard/pricing:$VERSION" >"$c/Dockerfile"
build "toolyard.local/bench-sdk-pricing:$VERSION" "$c"; TAGS+=("toolyard.local/bench-sdk-pricing:$VERSION")

# One tool image of each kind the runner must run in: glibc only as a library and no shell
# (distroless), and no libc at all (busybox). Both hold the echo tool: a C program
# (dynamically linked: it needs the image's glibc) and a shell script.
c=$(context)
gcc -O2 -o "$c/echo-tool" "$ROOT/tests/fixtures/echo/echo.c" || die "compiling tests/fixtures/echo/echo.c failed"
printf 'FROM %s\nCOPY echo-tool /usr/local/bin/echo-tool\nUSER 65532:65532\n' "$CC_IMAGE" >"$c/Dockerfile"
build "toolyard.local/test-echo-distroless:$VERSION" "$c"; TAGS+=("toolyard.local/test-echo-distroless:$VERSION")
c=$(context); cp "$ROOT/tests/fixtures/echo/echo.sh" "$c/echo-tool"
printf 'FROM %s\nCOPY echo-tool /bin/echo-tool\nUSER 65532:65532\n' "$BUSYBOX_IMAGE" >"$c/Dockerfile"
build "toolyard.local/test-echo-busybox:$VERSION" "$c"; TAGS+=("toolyard.local/test-echo-busybox:$VERSION")

# --- 4. one archive ---------------------------------------------------------------------
log "saving ${#TAGS[@]} images"
"$DOCKER" save -o "$IMAGES/images.tar.part" "${TAGS[@]}" || die "docker save failed"
mv "$IMAGES/images.tar.part" "$IMAGES/images.tar"
printf '%s\n' "${TAGS[@]}" >"$IMAGES/images.list"
"$DOCKER" image prune --force >/dev/null 2>&1 || true
echo "$IMAGES/images.tar"
