#!/usr/bin/env bash
# Toolyard on a local Kubernetes cluster with no Docker, kind or registry: the cluster the
# tests use (a control plane and one real node: containerd with runc, kube-proxy, CoreDNS,
# kube-router enforcing NetworkPolicies), the images built from the Dockerfile, and the chart
# and the pricing example installed as in the kind walkthrough (scripts/install-example.sh).
#
#   sudo scripts/cluster.sh up      # build what is missing, start, install, price an option
#   sudo scripts/cluster.sh env     # the variables to use it: eval "$(sudo scripts/cluster.sh env)"
#   sudo scripts/cluster.sh down    # stop it; leaves no process, mount, link or cgroup behind
#
# Needs root (network namespaces, cgroups, containerd), Linux, Go, Rust, Python 3, and apt for
# Debian's containerd, runc and CNI plugins (installed when missing). Binaries and images are
# cached in $HOME/.cache/toolyard; the first `up` builds them (about 15 minutes on 2 cores).
# The cluster's state lives in .toolyard/cluster of this checkout; `down` removes it.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
export TOOLYARD_CACHE=${TOOLYARD_CACHE:-$HOME/.cache/toolyard}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$TOOLYARD_CACHE/target}
export TOOLYARD_CLUSTER_RUN=$ROOT/.toolyard/cluster
step() { printf '\n==> %s\n' "$*" >&2; }

case ${1:-} in
  up)
    if [[ -f $TOOLYARD_CLUSTER_RUN/env ]]; then
      echo "scripts/cluster.sh: a cluster is running ($TOOLYARD_CLUSTER_RUN); 'scripts/cluster.sh down' first" >&2
      exit 1
    fi
    step "cluster binaries (cached in $TOOLYARD_CACHE)"
    tests/cluster/build.sh all >/dev/null
    step "toolyard binaries"
    cargo build --quiet --workspace --bins
    step "images"
    tests/cluster/images.sh >/dev/null
    step "the cluster"
    tests/cluster/cluster.sh start
    # shellcheck disable=SC1091
    source "$TOOLYARD_CLUSTER_RUN/env"
    KUBECTL=$TOOLYARD_TEST_KUBECTL HELM=$TOOLYARD_TEST_BIN/helm scripts/install-example.sh
    cat <<TXT

Toolyard is installed (release toolyard in namespace toolyard; tools in team-a).
  eval "\$(sudo scripts/cluster.sh env)"     # KUBECONFIG, and kubectl and helm of the cluster's version
  kubectl -n toolyard port-forward service/toolyard-gateway 8443:443 &
  # https://localhost:8443/mcp, CA: kubectl -n toolyard get secret toolyard-gateway-tls -o jsonpath='{.data.tls\.crt}' | base64 -d
  # token: kubectl -n team-a create token quant --audience toolyard
TXT
    ;;
  env)
    [[ -f $TOOLYARD_CLUSTER_RUN/env ]] || { echo "scripts/cluster.sh: no cluster is running" >&2; exit 1; }
    # shellcheck disable=SC1091
    source "$TOOLYARD_CLUSTER_RUN/env"
    printf 'export KUBECONFIG=%q\n' "$KUBECONFIG"
    printf 'alias kubectl=%q helm=%q\n' "$TOOLYARD_TEST_KUBECTL" "$TOOLYARD_TEST_BIN/helm"
    ;;
  down)
    tests/cluster/cluster.sh stop
    rm -rf "$TOOLYARD_CLUSTER_RUN"
    ;;
  *)
    echo "usage: $0 up|env|down" >&2
    exit 2
    ;;
esac
