#!/usr/bin/env bash
# Builds the test cluster from package registries and caches it outside the clone:
#   control plane: kube-apiserver, kube-controller-manager  (Go module k8s.io/kubernetes,
#                  staging modules replaced), etcd (Go module go.etcd.io/etcd/server/v3)
#   the node:      kubelet, kube-scheduler, kube-proxy (the same k8s.io/kubernetes module),
#                  kube-router (NetworkPolicy enforcement, iptables + ipset), CoreDNS,
#                  the pause program (C, from the k8s.io/kubernetes module), and Debian's
#                  containerd, runc, CNI plugins, dockerd (image builds) and mmdebstrap
#   tools:         helm (go install helm.sh/helm/v3/cmd/helm),
#                  s3s-fs (cargo install s3s-fs, an S3-compatible server, Apache-2.0),
#                  Jaeger v2 (github.com/jaegertracing/jaeger/cmd/jaeger, the trace store the
#                  tracing tests send OTLP to and query; Apache-2.0), promtool
#                  (github.com/prometheus/prometheus/cmd/promtool: checks the chart's alerts)
# Every piece is skipped when its binary is already in the cache. Prints the bin dir last.
#
#   tests/cluster/build.sh [all|k8s|etcd|helm|s3s|jaeger|promtool|node|debs|path]
#
# Environment: TOOLYARD_CACHE (default $HOME/.cache/toolyard), K8S_VERSION, ETCD_VERSION,
# HELM_VERSION, S3S_VERSION, COREDNS_VERSION, KUBE_ROUTER_VERSION, JAEGER_VERSION, PROMTOOL_VERSION.
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-v1.34.4}
ETCD_VERSION=${ETCD_VERSION:-v3.6.14}
HELM_VERSION=${HELM_VERSION:-v3.19.5}
S3S_VERSION=${S3S_VERSION:-0.14.1}
COREDNS_VERSION=${COREDNS_VERSION:-v1.12.4}
# kube-network-policies (nftables + NFQUEUE) needs the kernel's nft queue expression, which
# the CI machines' kernels lack (CONFIG_NFT_QUEUE); kube-router's NetworkPolicy controller
# needs only iptables and ipset. v2.1.0 is the version the module proxy serves; its Go
# dependencies with reported flaws are raised to fixed versions when it is built.
KUBE_ROUTER_VERSION=${KUBE_ROUTER_VERSION:-v2.1.0}
# The Go module's v1.x tags carry the Jaeger v2 binary (cmd/jaeger, built on the
# OpenTelemetry Collector). Kept out of the folder name: a new version rebuilds only Jaeger.
JAEGER_VERSION=${JAEGER_VERSION:-v1.75.0}
# Prometheus 3.x is the Go module's v0.3xx line.
PROMTOOL_VERSION=${PROMTOOL_VERSION:-v0.316.0}
CACHE=${TOOLYARD_CACHE:-$HOME/.cache/toolyard}
BIN=$CACHE/cluster-bin/k8s-$K8S_VERSION-etcd-$ETCD_VERSION-helm-$HELM_VERSION-s3s-$S3S_VERSION-coredns-$COREDNS_VERSION-kr-$KUBE_ROUTER_VERSION
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

# Binaries of the k8s.io/kubernetes module that the test cluster runs.
K8S_CMDS=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy)

# k8s_module: a throwaway Go module in $WORK/k8s that requires k8s.io/kubernetes and builds
# the commands above. `go install k8s.io/kubernetes/...@v` is refused (its go.mod has
# replace directives), so every `k8s.io/X => ./staging/src/k8s.io/X` replace of upstream's
# go.mod is pointed at the published k8s.io/X of the matching staging version.
k8s_module() {
  local d=$WORK/k8s gomod kgo kdbg mods m staging tools
  tools=$(printf '//go:build tools\n\npackage tools\n\nimport (\n'; printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' "${K8S_CMDS[@]}"; printf ')\n')
  if [[ -f $d/go.sum && -f $d/tools.go && $(cat "$d/tools.go") == "$tools" ]] &&
     grep -q "k8s.io/kubernetes $K8S_VERSION\$" "$d/go.mod"; then
    return 0
  fi
  need_go
  rm -rf "$d"; mkdir -p "$d"; cd "$d"
  go mod init toolyard.invalid/k8s-bins >/dev/null 2>&1
  go_proxy_check "k8s.io/kubernetes@$K8S_VERSION"
  gomod=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["GoMod"])' "$WORK/probe.json")
  kgo=$(sed -n 's/^go \([0-9.]*\).*/\1/p' "$gomod" | head -n1)
  kdbg=$(sed -n 's/^godebug default=\(go[0-9.]*\).*/\1/p' "$gomod" | head -n1)
  go mod edit -go="$kgo"
  [[ -n $kdbg ]] && go mod edit -godebug="default=$kdbg"
  staging=v0.${K8S_VERSION#v1.}
  mods=$(sed -nE 's#^[[:space:]]*(replace[[:space:]]+)?(k8s\.io/[A-Za-z0-9._-]+)[[:space:]]*=>[[:space:]]*\./staging/.*#\2#p' "$gomod" | sort -u)
  [[ -n $mods ]] || die "no staging replaces found in $gomod"
  for m in $mods; do go mod edit -replace="$m=$m@$staging"; done
  go mod edit -require="k8s.io/kubernetes@$K8S_VERSION"
  printf '%s\n' "$tools" >tools.go
  go mod tidy >"$WORK/k8s-tidy.log" 2>&1 || die "go mod tidy for k8s.io/kubernetes failed: $(tail -n 5 "$WORK/k8s-tidy.log")"
}

build_k8s() {
  local missing=() c minor ldf
  for c in "${K8S_CMDS[@]}"; do have "$c" || missing+=("$c"); done
  ((${#missing[@]})) || return 0
  need_go
  log "building ${missing[*]} $K8S_VERSION (cold build of the control plane: 10-20 minutes on 2 cores)"
  k8s_module
  cd "$WORK/k8s"
  minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
  ldf="-s -w"
  for kv in "gitVersion=$K8S_VERSION" "gitMajor=1" "gitMinor=$minor" "gitTreeState=clean" \
            "gitCommit=0000000000000000000000000000000000000000" "buildDate=2000-01-01T00:00:00Z"; do
    ldf+=" -X k8s.io/component-base/version.$kv -X k8s.io/client-go/pkg/version.$kv"
  done
  rm -rf out; mkdir out
  CGO_ENABLED=0 go build -trimpath -tags selinux,notest,grpcnotrace -ldflags "$ldf" -o out/ \
    "${missing[@]/#/k8s.io/kubernetes/cmd/}" || die "go build of ${missing[*]} failed"
  for c in "${missing[@]}"; do mv "out/$c" "$BIN/"; done
}

# The pause program every pod sandbox runs, compiled statically from the C source in the
# k8s.io/kubernetes module (build/pause/linux/pause.c); images.sh makes it an image.
build_pause() {
  have pause && return 0
  command -v gcc >/dev/null 2>&1 || die "gcc is needed to compile the pause program (Debian: apt install gcc libc6-dev)"
  need_go
  local src
  go_proxy_check "k8s.io/kubernetes@$K8S_VERSION"
  src=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["Dir"])' "$WORK/probe.json")/build/pause/linux/pause.c
  [[ -f $src ]] || die "$src is missing from the k8s.io/kubernetes module"
  gcc -Os -static -DVERSION=toolyard -o "$WORK/pause" "$src" || die "compiling $src failed (is libc6-dev installed?)"
  strip "$WORK/pause"
  mv "$WORK/pause" "$BIN/pause"
}

build_coredns() {
  have coredns && return 0
  need_go
  log "installing coredns $COREDNS_VERSION (about 3 minutes on 2 cores)"
  CGO_ENABLED=0 GOBIN=$WORK/coredns-bin go install -trimpath -ldflags "-s -w" "github.com/coredns/coredns@$COREDNS_VERSION" \
    || die "go install github.com/coredns/coredns@$COREDNS_VERSION failed"
  mv "$WORK/coredns-bin/coredns" "$BIN/coredns"
}

build_kube_router() {
  have kube-router && return 0
  need_go
  log "building kube-router $KUBE_ROUTER_VERSION"
  local d=$WORK/kube-router
  rm -rf "$d"; mkdir -p "$d"; cd "$d"
  go mod init toolyard.invalid/kube-router-bin >/dev/null 2>&1
  go_proxy_check "github.com/cloudnativelabs/kube-router/v2@$KUBE_ROUTER_VERSION"
  go mod edit -require="github.com/cloudnativelabs/kube-router/v2@$KUBE_ROUTER_VERSION"
  cat > tools.go <<'GO'
//go:build tools

package tools

import _ "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router"
GO
  go mod tidy >"$WORK/kube-router-tidy.log" 2>&1 || die "go mod tidy for kube-router failed: $(tail -n 5 "$WORK/kube-router-tidy.log")"
  # Its golang.org/x modules with reported flaws, raised to the newest the proxy serves.
  go get golang.org/x/net@latest golang.org/x/crypto@latest golang.org/x/sys@latest golang.org/x/text@latest \
    >"$WORK/kube-router-get.log" 2>&1 || die "raising kube-router's golang.org/x modules failed: $(tail -n 5 "$WORK/kube-router-get.log")"
  go mod tidy >>"$WORK/kube-router-tidy.log" 2>&1 || die "go mod tidy for kube-router failed: $(tail -n 5 "$WORK/kube-router-tidy.log")"
  CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$d/kube-router" github.com/cloudnativelabs/kube-router/v2/cmd/kube-router \
    || die "go build of kube-router failed"
  mv "$d/kube-router" "$BIN/kube-router"
}

# Debian packages of the node and of the image builds. Installed with apt-get when missing
# (as root); otherwise the message says what to install.
DEBS=(containerd runc containernetworking-plugins iptables ipset iproute2 docker.io mmdebstrap)
debs() {
  local missing=() p
  for p in "${DEBS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  ((${#missing[@]})) || return 0
  command -v apt-get >/dev/null 2>&1 || die "the real test node needs ${missing[*]} (Debian packages); install them"
  ((EUID == 0)) || die "the real test node needs the Debian packages ${missing[*]}: run 'sudo apt-get install --no-install-recommends ${missing[*]}'"
  log "installing Debian packages: ${missing[*]}"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"; } \
    >"$WORK/apt.log" 2>&1 || die "apt-get install ${missing[*]} failed: $(tail -n 5 "$WORK/apt.log")"
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

# go_tool <name> <module> <version> <package> <why> [<build tags>]: builds a Go program of the
# test harness into $BIN/<name> (with <name>.version), unless that version is there already.
go_tool() {
  local name=$1 module=$2 version=$3 package=$4 why=$5 tags=${6:-} d=$WORK/$1
  [[ -x $BIN/$name && $(cat "$BIN/$name.version" 2>/dev/null) == "$version" ]] && return 0
  need_go
  log "building $name $version ($why)"
  rm -rf "$d"; mkdir -p "$d"; cd "$d"
  go mod init "toolyard.invalid/$name-bin" >/dev/null 2>&1
  go_proxy_check "$module@$version"
  go get -tool "$package@$version" >"$WORK/$name-get.log" 2>&1 \
    || die "go get -tool $package@$version failed: $(tail -n 5 "$WORK/$name-get.log")"
  CGO_ENABLED=0 go build -trimpath -tags "$tags" -ldflags "-s -w" -o "$d/$name" "$package" || die "go build of $name failed"
  mv "$d/$name" "$BIN/$name"
  echo "$version" >"$BIN/$name.version"
}

build_jaeger() {
  go_tool jaeger github.com/jaegertracing/jaeger "$JAEGER_VERSION" github.com/jaegertracing/jaeger/cmd/jaeger \
    "the trace store of the tracing tests"
}

# Without Prometheus's service discoveries (`remove_all_sd`): `check rules` needs none of them, and
# a cold build takes half the time (2 against 4.5 minutes on 2 cores).
build_promtool() {
  go_tool promtool github.com/prometheus/prometheus "$PROMTOOL_VERSION" github.com/prometheus/prometheus/cmd/promtool \
    "checks the chart's alerts" remove_all_sd
}

only=${1:-all}
case $only in
  path) echo "$BIN"; exit 0 ;;
  all) debs; build_etcd; build_helm; build_s3s; build_jaeger; build_promtool; build_k8s; build_pause; build_coredns; build_kube_router ;;
  k8s) build_k8s ;; etcd) build_etcd ;; helm) build_helm ;; s3s) build_s3s ;; jaeger) build_jaeger ;; promtool) build_promtool ;;
  node) debs; build_k8s; build_pause; build_coredns; build_kube_router ;;
  debs) debs ;;
  *) die "usage: $0 [all|k8s|etcd|helm|s3s|jaeger|promtool|node|debs|path]" ;;
esac
echo "$BIN"
