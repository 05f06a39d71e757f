#!/usr/bin/env bash
# Builds the test control plane from package registries and caches it outside the clone:
#   kube-apiserver, kube-controller-manager  (Go module k8s.io/kubernetes, staging modules replaced)
#   etcd                                     (Go module go.etcd.io/etcd/server/v3)
#   helm                                     (go install helm.sh/helm/v3/cmd/helm)
#   s3s-fs                                   (cargo install s3s-fs, an S3-compatible server, Apache-2.0)
# Every piece is skipped when its binary is already in the cache. Prints the bin dir last.
#
# Environment: TOOLYARD_CACHE (default $HOME/.cache/toolyard), K8S_VERSION, ETCD_VERSION,
# HELM_VERSION, S3S_VERSION.
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-v1.34.4}
ETCD_VERSION=${ETCD_VERSION:-v3.6.14}
HELM_VERSION=${HELM_VERSION:-v3.19.5}
S3S_VERSION=${S3S_VERSION:-0.14.1}
CACHE=${TOOLYARD_CACHE:-$HOME/.cache/toolyard}
BIN=$CACHE/cluster-bin/k8s-$K8S_VERSION-etcd-$ETCD_VERSION-helm-$HELM_VERSION-s3s-$S3S_VERSION
WORK=$CACHE/cluster-work

die() { echo "tests/cluster/build.sh: $*" >&2; exit 1; }
log() { echo "tests/cluster/build.sh: $*" >&2; }

have() { [[ -x $BIN/$1 ]]; }

mkdir -p "$BIN" "$WORK"

need_go() {
  command -v go >/dev/null 2>&1 || die "Go is not installed; it is needed to build the test control plane (https://go.dev/dl, Go >= 1.24)"
  local v
  v=$(go env GOVERSION 2>/dev/null) || die "'go env' failed; is the Go installation broken?"
  case $v in go1.2[4-9]*|go1.[3-9][0-9]*) ;; *) die "Go >= 1.24 is needed (found $v)";; esac
}

# go_proxy_check <module@version>: fail early with a clear message when the module proxy is unreachable.
go_proxy_check() {
  if ! go mod download -json "$1" >"$WORK/probe.json" 2>"$WORK/probe.err"; then
    die "cannot download $1 from the Go module proxy ($(go env GOPROXY)): $(tail -n 3 "$WORK/probe.err")"
  fi
}

build_k8s() {
  have kube-apiserver && have kube-controller-manager && return 0
  need_go
  log "building kube-apiserver and kube-controller-manager $K8S_VERSION (cold build: 10-20 minutes on 2 cores)"
  local d=$WORK/k8s minor staging gomod kgo kdbg mods ldf
  rm -rf "$d"; mkdir -p "$d"; cd "$d"
  go mod init toolyard.invalid/k8s-bins >/dev/null 2>&1
  go_proxy_check "k8s.io/kubernetes@$K8S_VERSION"
  gomod=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["GoMod"])' "$WORK/probe.json")
  kgo=$(sed -n 's/^go \([0-9.]*\).*/\1/p' "$gomod" | head -n1)
  kdbg=$(sed -n 's/^godebug default=\(go[0-9.]*\).*/\1/p' "$gomod" | head -n1)
  go mod edit -go="$kgo"
  [[ -n $kdbg ]] && go mod edit -godebug="default=$kdbg"
  minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
  staging=v0.${K8S_VERSION#v1.}
  # Every `k8s.io/X => ./staging/src/k8s.io/X` replace of upstream's go.mod is ignored in a
  # dependency: point each at the published k8s.io/X of the matching staging version.
  mods=$(sed -nE 's#^[[:space:]]*(replace[[:space:]]+)?(k8s\.io/[A-Za-z0-9._-]+)[[:space:]]*=>[[:space:]]*\./staging/.*#\2#p' "$gomod" | sort -u)
  [[ -n $mods ]] || die "no staging replaces found in $gomod"
  for m in $mods; do go mod edit -replace="$m=$m@$staging"; done
  go mod edit -require="k8s.io/kubernetes@$K8S_VERSION"
  cat > tools.go <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
)
GO
  go mod tidy >"$WORK/k8s-tidy.log" 2>&1 || die "go mod tidy for k8s.io/kubernetes failed: $(tail -n 5 "$WORK/k8s-tidy.log")"
  ldf="-s -w"
  for kv in "gitVersion=$K8S_VERSION" "gitMajor=1" "gitMinor=$minor" "gitTreeState=clean" \
            "gitCommit=0000000000000000000000000000000000000000" "buildDate=2000-01-01T00:00:00Z"; do
    ldf+=" -X k8s.io/component-base/version.$kv -X k8s.io/client-go/pkg/version.$kv"
  done
  CGO_ENABLED=0 go build -trimpath -tags selinux,notest,grpcnotrace -ldflags "$ldf" -o "$d/out/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    || die "go build of kube-apiserver/kube-controller-manager failed"
  mv "$d/out/kube-apiserver" "$d/out/kube-controller-manager" "$BIN/"
}

build_etcd() {
  have etcd && return 0
  need_go
  log "building etcd $ETCD_VERSION"
  local d=$WORK/etcd
  rm -rf "$d"; mkdir -p "$d"; cd "$d"
  go mod init toolyard.invalid/etcd-bin >/dev/null 2>&1
  go_proxy_check "go.etcd.io/etcd/server/v3@$ETCD_VERSION"
  go mod edit -require="go.etcd.io/etcd/server/v3@$ETCD_VERSION"
  cat > tools.go <<'GO'
//go:build tools

package tools

import _ "go.etcd.io/etcd/server/v3"
GO
  go mod tidy >"$WORK/etcd-tidy.log" 2>&1 || die "go mod tidy for etcd failed: $(tail -n 5 "$WORK/etcd-tidy.log")"
  CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$d/etcd" go.etcd.io/etcd/server/v3 || die "go build of etcd failed"
  mv "$d/etcd" "$BIN/etcd"
}

build_helm() {
  have helm && return 0
  need_go
  log "installing helm $HELM_VERSION"
  local minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
  local hl="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
  hl+=" -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$minor"
  hl+=" -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$minor"
  CGO_ENABLED=0 GOBIN=$WORK/helm-bin go install -trimpath -ldflags "$hl" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" \
    || die "go install helm.sh/helm/v3/cmd/helm@$HELM_VERSION failed"
  mv "$WORK/helm-bin/helm" "$BIN/helm"
}

build_s3s() {
  have s3s-fs && return 0
  command -v cargo >/dev/null 2>&1 || die "cargo is not installed; it is needed to install the S3 test server"
  log "installing s3s-fs $S3S_VERSION"
  CARGO_TARGET_DIR=$WORK/s3s-target cargo install s3s-fs --version "$S3S_VERSION" --features binary --locked \
    --root "$WORK/s3s-root" >"$WORK/s3s-install.log" 2>&1 \
    || die "cargo install s3s-fs $S3S_VERSION failed: $(tail -n 5 "$WORK/s3s-install.log")"
  mv "$WORK/s3s-root/bin/s3s-fs" "$BIN/s3s-fs"
  rm -rf "$WORK/s3s-target"
}

only=${1:-all}
case $only in
  path) echo "$BIN"; exit 0 ;;
  all) build_etcd; build_helm; build_s3s; build_k8s ;;
  k8s) build_k8s ;; etcd) build_etcd ;; helm) build_helm ;; s3s) build_s3s ;;
  *) die "usage: $0 [all|k8s|etcd|helm|s3s]" ;;
esac
echo "$BIN"
