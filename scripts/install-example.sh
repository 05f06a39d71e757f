#!/usr/bin/env bash
# Installs Toolyard and the pricing example into the cluster of the current kubeconfig, as
# the README's local-cluster walkthrough does, and prices an option through the gateway:
#   1. namespaces toolyard and team-a (restricted Pod Security enforced);
#   2. the development S3 server (examples/kind/s3.yaml);
#   3. `helm install toolyard charts/toolyard -n toolyard -f examples/kind/values.yaml`;
#   4. the pricing tools and prompts in team-a, and a caller: ServiceAccount team-a/quant with the chart's
#      tool-caller role;
#   5. price_option through https://localhost:$PORT/mcp (kubectl port-forward), with the
#      gateway's self-signed certificate and a token of that ServiceAccount.
#
# Used by scripts/cluster.sh (no Docker) and scripts/kind.sh (Docker and kind), once the images
# are in the cluster. Environment: KUBECTL and HELM (default: from PATH), PORT (default 8443).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
KUBECTL=${KUBECTL:-kubectl}
HELM=${HELM:-helm}
PORT=${PORT:-8443}
step() { printf '\n==> %s\n' "$*" >&2; }

step "namespaces, development S3 server"
for ns in toolyard team-a; do
  "$KUBECTL" create namespace "$ns" --dry-run=client -o yaml | "$KUBECTL" apply -f - >/dev/null
  "$KUBECTL" label namespace "$ns" pod-security.kubernetes.io/enforce=restricted --overwrite >/dev/null
done
"$KUBECTL" apply -f examples/kind/s3.yaml >/dev/null
"$KUBECTL" -n toolyard rollout status deployment/toolyard-s3 --timeout=120s

step "helm install toolyard"
"$HELM" upgrade --install toolyard charts/toolyard -n toolyard -f examples/kind/values.yaml --wait --timeout 5m

step "the pricing tools in team-a"
"$KUBECTL" -n team-a apply -f examples/pricing/tools.yaml -f examples/pricing/prompts.yaml
"$KUBECTL" -n team-a wait --for=condition=Ready mcptools --all --timeout=180s

step "a caller: ServiceAccount team-a/quant with the chart's tool-caller role"
"$KUBECTL" -n team-a create serviceaccount quant --dry-run=client -o yaml | "$KUBECTL" apply -f - >/dev/null
"$KUBECTL" -n team-a create rolebinding quant-tool-caller --clusterrole=toolyard-tool-caller \
  --serviceaccount=team-a:quant --dry-run=client -o yaml | "$KUBECTL" apply -f - >/dev/null
TOKEN=$("$KUBECTL" -n team-a create token quant --audience toolyard)
CA=$(mktemp)
"$KUBECTL" -n toolyard get secret toolyard-gateway-tls -o jsonpath='{.data.tls\.crt}' | base64 -d >"$CA"

step "price_option through https://localhost:$PORT/mcp"
"$KUBECTL" -n toolyard port-forward service/toolyard-gateway "$PORT:443" >/dev/null &
FORWARD=$!
trap 'kill $FORWARD 2>/dev/null || true; rm -f "$CA"' EXIT
for _ in $(seq 50); do
  curl -s --cacert "$CA" -o /dev/null "https://localhost:$PORT/mcp" && break
  sleep 0.2
done
# The token goes in a header file, not on the command line, where `ps` would show it.
curl -sS --cacert "$CA" "https://localhost:$PORT/mcp" \
  -H @<(printf 'Authorization: Bearer %s\n' "$TOKEN") \
  -H 'Content-Type: application/json' -H 'Accept: application/json, text/event-stream' \
  -H 'MCP-Protocol-Version: 2025-11-25' \
  -d '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"price_option",
       "arguments":{"spot":100,"strike":100,"time_to_expiry":1,"volatility":0.2,"rate":0.05}}}'
echo
