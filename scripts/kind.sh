#!/usr/bin/env bash
# Toolyard on a local kind cluster, end to end: builds the images (Dockerfile), loads them
# into kind, then installs the chart and the pricing example and prices an option
# (scripts/install-example.sh). For a machine with Docker, kind and a registry to pull base
# images from; without them, scripts/cluster.sh does the same on the test harness's cluster.
#
# Needs docker, kind, kubectl and helm. Usage:
#   scripts/kind.sh            # everything (creates the kind cluster `toolyard` if missing)
#   KIND_CLUSTER=dev scripts/kind.sh
#   SKIP_BUILD=1 scripts/kind.sh   # reuse images already built
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
CLUSTER=${KIND_CLUSTER:-toolyard}
VERSION=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' charts/toolyard/Chart.yaml)
IMAGES=(gateway controller runner agent pricing dev-s3)

for tool in docker kind kubectl helm curl; do
  command -v "$tool" >/dev/null 2>&1 || { echo "scripts/kind.sh: $tool is required" >&2; exit 1; }
done
step() { printf '\n==> %s\n' "$*" >&2; }

if [[ -z ${SKIP_BUILD:-} ]]; then
  for target in "${IMAGES[@]}"; do
    step "docker build --target $target (ghcr.io/toolyard/$target:$VERSION)"
    DOCKER_BUILDKIT=1 docker build --target "$target" --build-arg VERSION="$VERSION" -t "ghcr.io/toolyard/$target:$VERSION" .
  done
fi

if ! kind get clusters | grep -qx "$CLUSTER"; then
  step "kind create cluster --name $CLUSTER"
  kind create cluster --name "$CLUSTER"
fi
kubectl config use-context "kind-$CLUSTER" >/dev/null

step "kind load docker-image"
for target in "${IMAGES[@]}"; do
  kind load docker-image --name "$CLUSTER" "ghcr.io/toolyard/$target:$VERSION"
done

exec scripts/install-example.sh
