#!/usr/bin/env bash
# Toolyard on a local kind cluster, end to end: builds the images (Dockerfile), loads them
# into kind, starts the development S3 server, installs the chart with
# examples/kind/values.yaml, registers the pricing tools in namespace team-a and prices an
# option through the gateway as a ServiceAccount bound to the chart's tool-caller role.
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
PORT=${PORT:-8443}

for tool in docker kind kubectl helm curl; do
  command -v "$tool" >/dev/null 2>&1 || { echo "scripts/kind.sh: $tool is required" >&2; exit 1; }
done
step() { printf '\n==> %s\n' "$*" >&2; }

if [[ -z ${SKIP_BUILD:-} ]]; then
  for target in "${IMAGES[@]}"; do
    step "docker build --target $target (ghcr.io/toolyard/$target:$VERSION)"
    docker build --target "$target" --build-arg VERSION="$VERSION" -t "ghcr.io/toolyard/$target:$VERSION" .
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

step "namespaces, development S3 server"
for ns in toolyard team-a; do
  kubectl create namespace "$ns" --dry-run=client -o yaml | kubectl apply -f -
  kubectl label namespace "$ns" pod-security.kubernetes.io/enforce=restricted --overwrite
done
kubectl apply -f examples/kind/s3.yaml
kubectl -n toolyard rollout status deployment/toolyard-s3 --timeout=120s

step "helm install toolyard"
helm upgrade --install toolyard charts/toolyard -n toolyard -f examples/kind/values.yaml --wait --timeout 5m

step "the pricing tools in team-a"
kubectl -n team-a apply -f examples/pricing/tools.yaml
kubectl -n team-a wait --for=condition=Ready mcptools --all --timeout=120s

step "a caller: ServiceAccount team-a/quant with the chart's tool-caller role"
kubectl -n team-a create serviceaccount quant --dry-run=client -o yaml | kubectl apply -f -
kubectl -n team-a create rolebinding quant-tool-caller --clusterrole=toolyard-tool-caller \
  --serviceaccount=team-a:quant --dry-run=client -o yaml | kubectl apply -f -
TOKEN=$(kubectl -n team-a create token quant --audience toolyard)
CA=$(mktemp)
kubectl -n toolyard get secret toolyard-gateway-tls -o jsonpath='{.data.tls\.crt}' | base64 -d >"$CA"

step "price_option through https://localhost:$PORT/mcp"
kubectl -n toolyard port-forward service/toolyard-gateway "$PORT:443" >/dev/null &
FORWARD=$!
trap 'kill $FORWARD 2>/dev/null || true; rm -f "$CA"' EXIT
for _ in $(seq 50); do
  curl -s --cacert "$CA" -o /dev/null "https://localhost:$PORT/mcp" && break
  sleep 0.2
done
curl -sS --cacert "$CA" "https://localhost:$PORT/mcp" \
  -H "Authorization: Bearer $TOKEN" \
  -H 'Content-Type: application/json' -H 'Accept: application/json, text/event-stream' \
  -H 'MCP-Protocol-Version: 2025-11-25' \
  -d '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"price_option",
       "arguments":{"spot":100,"strike":100,"time_to_expiry":1,"volatility":0.2,"rate":0.05}}}'
echo
