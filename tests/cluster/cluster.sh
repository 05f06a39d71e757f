#!/usr/bin/env bash
# Starts and stops the test cluster: a control plane (etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler), one real node (containerd with runc, the bridge
# CNI plugin, kubelet, kube-proxy, kube-router enforcing NetworkPolicies, CoreDNS) and the
# s3s-fs S3 server, with static-token users.
#
#   tests/cluster/cluster.sh start   # builds nothing: run tests/cluster/build.sh and
#                                    # tests/cluster/images.sh first
#   tests/cluster/cluster.sh stop
#
# Addresses. The node lives in a network namespace of its own, joined to this host by a veth
# pair in a 10.N.0.0/16 that no route of the host uses: the host end is 10.N.0.1 (the
# apiserver listens there, and so may test servers that pods must reach), the node end
# 10.N.0.2; pods get 10.N.1.0/24 on the node's bridge, Services 10.N.2.0/24 (DNS 10.N.2.10).
# The node's namespace has no other route, so nothing in it can send anywhere else. etcd and
# S3 listen on 127.0.0.1.
#
# Cleanup. Every process runs in one cgroup (the kubelet's cgroupRoot is inside it, so pods
# are too); the node's mounts are in a mount namespace of its own. `stop` kills the cgroup,
# deletes the network namespace (its bridge, veths and iptables rules go with it), and checks
# that no process, mount, link or cgroup is left. A start that fails stops what it started.
#
# Writes $RUN/env (shell `export` lines, also read by the Rust test support crate) and one
# kubeconfig per user. Users (token file): admin (system:masters), alice (groups quants,
# viewers), bob (group ops), toolyard-controller, toolyard-gateway; the node's own
# components have their own users.
#
# Environment: TOOLYARD_CLUSTER_RUN (default ${TMPDIR:-/tmp}/toolyard-cluster), TOOLYARD_CACHE,
# TOOLYARD_IMAGES (the image archive to load; default: the one tests/cluster/images.sh made).
set -Eeuo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tests/cluster/lib.sh
source "$HERE/lib.sh"
RUN=${TOOLYARD_CLUSTER_RUN:-${TMPDIR:-/tmp}/toolyard-cluster}
CACHE=${TOOLYARD_CACHE:-$HOME/.cache/toolyard}
IMAGES=${TOOLYARD_IMAGES:-$CACHE/images/images.tar}
K8S_VERSION=${K8S_VERSION:-v1.34.4}
NODE=toolyard-node

bin_dir() { "$HERE/build.sh" path; }

kubectl_bin() {
  local k
  for k in kubectl.1.34 kubectl.1.33 /usr/lib/google-cloud-sdk/bin/kubectl.1.33; do
    if command -v "$k" >/dev/null 2>&1; then command -v "$k"; return; fi
  done
  command -v kubectl || die "kubectl not found (kubectl.1.33 or newer is expected on the machine)"
}

freeport() {
  python3 -c 'import socket,sys;s=socket.socket();s.bind((sys.argv[1],0));print(s.getsockname()[1]);s.close()' "${1:-127.0.0.1}"
}

wait_for() { # <description> <seconds> <pid-name> <command...>
  local desc=$1 secs=$2 name=$3 i pid
  shift 3
  pid=$(cat "$RUN/pids/$name")
  for ((i = 0; i < secs * 5; i++)); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    if ! kill -0 "$pid" 2>/dev/null; then
      log "$name exited while starting; last lines of $RUN/logs/$name.log:"
      tail -n 20 "$RUN/logs/$name.log" >&2 || true
      return 1
    fi
    sleep 0.2
  done
  log "timed out after ${secs}s waiting for $desc; last lines of $RUN/logs/$name.log:"
  tail -n 20 "$RUN/logs/$name.log" >&2 || true
  return 1
}

# start_bg <name> <command...>: a host process in the cluster's cgroup.
start_bg() {
  local name=$1
  shift
  start_in "$GROUP" "$RUN/logs/$name.log" "$@" >"$RUN/pids/$name"
}

# start_node <name> <command...>: a process in the node's network and mount namespaces.
start_node() {
  local name=$1
  shift
  start_bg "$name" nsenter --target "$(cat "$RUN/pids/node-ns")" --mount --net -- "$@"
}

# in_node <command...>: runs a command in the node's namespaces, in the foreground.
in_node() { nsenter --target "$(cat "$RUN/pids/node-ns")" --mount --net -- "$@"; }

# host_rules: the host's own iptables rules and ipsets (without counters). Everything the
# cluster adds lives in the node's network namespace; `stop` checks that these are as before.
host_rules() {
  # Rules, user chains, non-default policies and sets only: a table the kernel loads empty
  # while the cluster runs (its header, COMMIT, built-in chains with policy ACCEPT) is no
  # change. On a machine with no table loaded yet, grep finds no line, which is no failure.
  { iptables-save; ip6tables-save; ipset list -n; } 2>/dev/null | sed -e 's/\[[0-9]*:[0-9]*\]//' |
    { grep -Ev '^(#|\*|COMMIT$|:[A-Z]+ ACCEPT *$)' || true; } | sort
}

# --- prerequisites ----------------------------------------------------------------------
preflight() {
  local b missing=()
  ((EUID == 0)) || die "the test node needs root (network namespaces, cgroups, containerd): run as root"
  for b in containerd containerd-shim-runc-v2 runc ip iptables ipset nsenter unshare openssl curl; do
    command -v "$b" >/dev/null 2>&1 || missing+=("$b")
  done
  ((${#missing[@]} == 0)) || die "missing on this machine: ${missing[*]}; run tests/cluster/build.sh debs (Debian packages)"
  for b in bridge host-local loopback portmap; do
    [[ -x /usr/lib/cni/$b ]] || die "the CNI plugin /usr/lib/cni/$b is missing; run tests/cluster/build.sh debs (containernetworking-plugins)"
  done
  grep -qw overlay /proc/filesystems || die "the kernel has no overlay filesystem (containerd's overlayfs snapshotter needs it)"
  [[ -e /proc/sys/net/bridge/bridge-nf-call-iptables ]] ||
    die "the kernel has no br_netfilter (/proc/sys/net/bridge missing): NetworkPolicies on the node's bridge need it; run 'modprobe br_netfilter'"
  ipset list -n >/dev/null 2>&1 || die "ipset does not work here (the kernel needs ip_set): kube-router enforces NetworkPolicies with it"
  iptables -L -n >/dev/null 2>&1 || die "iptables does not work here (the kernel needs netfilter)"
  [[ -n $(cgroup_mounts) ]] || die "no cgroup hierarchy is mounted"
  ip netns list >/dev/null 2>&1 || die "'ip netns' does not work (network namespaces)"
  # The node unpacks the images and runs its pods under $RUN; a nearly full disk makes the
  # kubelet evict every pod (DiskPressure), which shows up much later as unschedulable pods.
  local parent free_kib
  parent=$(dirname "$RUN")
  mkdir -p "$parent"
  free_kib=$(df -Pk "$parent" | awk 'NR == 2 {print $4}')
  ((free_kib >= 3 * 1024 * 1024)) ||
    die "only $((free_kib / 1024)) MiB free on the filesystem of $parent: the test node needs about 3 GiB (images, pods); free some space first"
}

# pick_net: N in 10.N.0.0/16, used by no route or address of the host nor by another run.
pick_net() {
  local n used
  used=$(ip -4 route show table all; ip -4 addr show)
  for n in $(shuf -i 200-250); do
    grep -q "10\.$n\." <<<"$used" && continue
    echo "$n"
    return
  done
  die "no free 10.N.0.0/16 (N in 200-250) for the test node's addresses"
}

# --- PKI, users, kubeconfigs ------------------------------------------------------------
make_pki() {
  local P=$RUN/pki
  mkdir -p "$P"
  openssl req -x509 -newkey rsa:2048 -nodes -keyout "$P/ca.key" -out "$P/ca.crt" -days 3650 \
    -subj "/CN=toolyard-test-ca" -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
  # cert <name> <subject> <extensions>
  cert() {
    openssl req -newkey rsa:2048 -nodes -keyout "$P/$1.key" -out "$P/$1.csr" -subj "$2" 2>/dev/null
    printf '%b' "$3" >"$P/$1.ext"
    openssl x509 -req -in "$P/$1.csr" -CA "$P/ca.crt" -CAkey "$P/ca.key" -CAcreateserial \
      -days 3650 -out "$P/$1.crt" -extfile "$P/$1.ext" 2>/dev/null
  }
  cert apiserver /CN=kube-apiserver "subjectAltName=IP:127.0.0.1,IP:$HOST_IP,IP:$SVC_PREFIX.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\nbasicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
  # The apiserver's client certificate towards the kubelet (logs, exec, port-forward).
  cert kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" \
    "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n"
  openssl genrsa -out "$P/sa.key" 2048 2>/dev/null
  openssl rsa -in "$P/sa.key" -pubout -out "$P/sa.pub" 2>/dev/null
}

declare -A TOKEN
make_tokens() {
  local u
  for u in admin kcm alice bob controller gateway node proxy scheduler router; do TOKEN[$u]=$(openssl rand -hex 24); done
  cat >"$RUN/tokens.csv" <<CSV
${TOKEN[admin]},admin,uid-admin,"system:masters"
${TOKEN[kcm]},system:kube-controller-manager,uid-kcm
${TOKEN[alice]},alice,uid-alice,"quants,viewers"
${TOKEN[bob]},bob,uid-bob,"ops"
${TOKEN[controller]},toolyard-controller,uid-toolyard-controller
${TOKEN[gateway]},toolyard-gateway,uid-toolyard-gateway
${TOKEN[node]},system:node:$NODE,uid-node,"system:nodes"
${TOKEN[proxy]},system:kube-proxy,uid-kube-proxy
${TOKEN[scheduler]},system:kube-scheduler,uid-kube-scheduler
${TOKEN[router]},toolyard-test-kube-router,uid-kube-router
CSV
  chmod 600 "$RUN/tokens.csv"
}

write_kubeconfig() { # <file> <user> <token>
  cat >"$1" <<KC
apiVersion: v1
kind: Config
clusters:
- name: toolyard-test
  cluster:
    server: https://$HOST_IP:$API_PORT
    certificate-authority: $RUN/pki/ca.crt
users:
- name: $2
  user:
    token: $3
contexts:
- name: toolyard-test
  context:
    cluster: toolyard-test
    user: $2
    namespace: default
current-context: toolyard-test
KC
  chmod 600 "$1"
}

# --- the node ---------------------------------------------------------------------------
node_network() {
  local netns=toolyard-$ID
  echo "$netns" >"$RUN/netns"
  ip netns add "$netns"
  ip link add "ty$ID-h" type veth peer name "ty$ID-n"
  ip link set "ty$ID-n" netns "$netns"
  ip addr add "$HOST_IP/30" dev "ty$ID-h"
  ip link set "ty$ID-h" up
  ip -n "$netns" addr add "$NODE_IP/30" dev "ty$ID-n"
  ip -n "$netns" link set "ty$ID-n" up
  ip -n "$netns" link set lo up
  # The host reaches pods and Services through the node (kube-proxy's rules apply there).
  ip route add "$POD_CIDR" via "$NODE_IP" dev "ty$ID-h"
  ip route add "$SVC_CIDR" via "$NODE_IP" dev "ty$ID-h"
  nsenter --net="/run/netns/$netns" sysctl -q -w net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1 \
    net.ipv4.conf.all.route_localnet=1
  # The namespace holder: a process whose network namespace is the node's, and whose mount
  # namespace is private (the node's mounts die with it). /run and /var/log are the node's own
  # there: containerd's shim sockets, the iptables lock and the kubelet's container log links
  # never reach the host's.
  # (Not `ip netns exec`: it remounts /sys, and the kubelet needs the cgroup mounts under it.)
  start_bg node-ns nsenter --net="/run/netns/$netns" unshare --mount --propagation slave -- \
    sh -c 'mount -t tmpfs -o mode=755 tmpfs /run && mount -t tmpfs -o mode=755 tmpfs /var/log && exec sleep infinity'
  for _ in $(seq 50); do
    [[ $(readlink "/proc/$(cat "$RUN/pids/node-ns")/ns/mnt") != $(readlink /proc/self/ns/mnt) ]] &&
      in_node test -d /var/log 2>/dev/null && in_node sh -c 'mountpoint -q /var/log' && break
    sleep 0.1
  done
  in_node sh -c 'mountpoint -q /var/log' || die "the node's mount namespace did not come up: $(cat "$RUN/logs/node-ns.log")"
}

node_containerd() {
  local N=$RUN/node
  mkdir -p "$N/cni" "$N/ipam"
  cat >"$N/cni/10-toolyard.conflist" <<JSON
{
  "cniVersion": "0.4.0",
  "name": "toolyard",
  "plugins": [
    {
      "type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
      "ipam": {
        "type": "host-local", "dataDir": "$N/ipam",
        "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$POD_PREFIX.1"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
JSON
  cat >"$N/containerd.toml" <<TOML
version = 2
root = "$N/containerd/root"
state = "$N/containerd/state"
oom_score = 0
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "$N/containerd.sock"

[plugins."io.containerd.internal.v1.opt"]
  path = "$N/containerd/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "toolyard.local/pause:toolyard"
  # This kind of VM lacks CAP_SYS_RESOURCE for lowering OOM scores.
  restrict_oom_score_adj = true
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$N/cni"
    max_conf_num = 1
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
TOML
  start_node containerd containerd --config "$N/containerd.toml"
  wait_for containerd 30 containerd in_node ctr --address "$N/containerd.sock" version
}

node_images() {
  [[ -s $IMAGES ]] || die "$IMAGES is missing: run tests/cluster/images.sh first"
  in_node ctr --address "$RUN/node/containerd.sock" --namespace k8s.io images import --no-unpack "$IMAGES" \
    >"$RUN/logs/images.log" 2>&1 || die "importing $IMAGES into containerd failed: $(tail -n 5 "$RUN/logs/images.log")"
}

node_components() {
  local N=$RUN/node BIN=$1
  echo "nameserver $HOST_IP" >"$N/resolv.conf"
  cat >"$N/kubelet.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix://$N/containerd.sock
cgroupDriver: cgroupfs
cgroupRoot: /$GROUP
cgroupsPerQOS: true
failCgroupV1: false
failSwapOn: false
# This kind of VM lacks CAP_SYS_RESOURCE for lowering OOM scores.
oomScoreAdj: 0
address: $NODE_IP
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $RUN/pki/ca.crt}
authorization: {mode: Webhook}
clusterDomain: cluster.local
clusterDNS: ["$SVC_PREFIX.10"]
resolvConf: $N/resolv.conf
podLogsDir: $N/pod-logs
serializeImagePulls: false
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
maxPods: 250
YAML
  write_kubeconfig "$N/kubelet.kubeconfig" "system:node:$NODE" "${TOKEN[node]}"
  write_kubeconfig "$N/proxy.kubeconfig" system:kube-proxy "${TOKEN[proxy]}"
  write_kubeconfig "$N/scheduler.kubeconfig" system:kube-scheduler "${TOKEN[scheduler]}"
  write_kubeconfig "$N/router.kubeconfig" toolyard-test-kube-router "${TOKEN[router]}"

  start_bg kube-scheduler "$BIN/kube-scheduler" --kubeconfig="$N/scheduler.kubeconfig" \
    --leader-elect=false --secure-port=0 --v=1
  start_node kubelet "$BIN/kubelet" --config="$N/kubelet.yaml" --kubeconfig="$N/kubelet.kubeconfig" \
    --root-dir="$N/kubelet" --hostname-override="$NODE" --node-ip="$NODE_IP" --v=1

  cat >"$N/kube-proxy.yaml" <<YAML
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection: {kubeconfig: $N/proxy.kubeconfig}
clusterCIDR: $POD_CIDR
hostnameOverride: $NODE
bindAddress: $NODE_IP
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
# conntrack limits are the host's: leave them alone.
conntrack: {maxPerCore: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
iptables: {localhostNodePorts: false}
YAML
  start_node kube-proxy "$BIN/kube-proxy" --config="$N/kube-proxy.yaml" --v=1
  # kube-router finds its node by name: the kubelet registers it.
  wait_for "the node to be Ready" 60 kubelet "$KUBECTL" --kubeconfig "$RUN/admin.kubeconfig" \
    wait --for=condition=Ready "node/$NODE" --timeout=1s
  "$KUBECTL" --kubeconfig "$RUN/admin.kubeconfig" apply -f - >/dev/null <<YAML
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: toolyard-test-kube-router}
rules:
  - apiGroups: [""]
    resources: [namespaces, pods, services, endpoints, nodes]
    verbs: [get, list, watch]
  - apiGroups: [networking.k8s.io]
    resources: [networkpolicies]
    verbs: [get, list, watch]
  - apiGroups: [discovery.k8s.io]
    resources: [endpointslices]
    verbs: [get, list, watch]
  - apiGroups: [""]
    resources: [events]
    verbs: [create, patch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: toolyard-test-kube-router}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: toolyard-test-kube-router}
subjects: [{kind: User, name: toolyard-test-kube-router}]
YAML
  start_node kube-router "$BIN/kube-router" --kubeconfig="$N/router.kubeconfig" --hostname-override="$NODE" \
    --run-firewall=true --run-router=false --run-service-proxy=false --enable-cni=false \
    --enable-pod-egress=false --service-cluster-ip-range="$SVC_CIDR" --health-port=20244 --metrics-port=0 --v=1
  # (Its health port, in the node's network namespace: with none, v2.1.0 crashes.)
  wait_for "kube-router to be healthy" 60 kube-router in_node curl -fsS http://127.0.0.1:20244/healthz

}

node_dns() {
  local version
  version=$(basename "$(bin_dir)" | sed -n 's/.*-coredns-\([^-]*\)-.*/\1/p')
  sed -e "s/@DNS_IP@/$SVC_PREFIX.10/" -e "s/@VERSION@/$version/" "$HERE/coredns.yaml" |
    "$KUBECTL" --kubeconfig "$RUN/admin.kubeconfig" apply -f - >/dev/null
  wait_for "CoreDNS to be available" 60 kubelet "$KUBECTL" --kubeconfig "$RUN/admin.kubeconfig" \
    -n kube-system wait --for=condition=Available deployment/coredns --timeout=1s
}

# start_jaeger <bin>: the trace store of the tracing tests (Jaeger v2, traces in memory). OTLP
# over HTTP and the query API listen on the host's end of the node link, which host processes
# and pods both reach.
start_jaeger() {
  local otlp query query_grpc
  otlp=$(freeport "$HOST_IP"); query=$(freeport "$HOST_IP"); query_grpc=$(freeport 127.0.0.1)
  cat >"$RUN/jaeger.yaml" <<YAML
service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
extensions:
  jaeger_storage:
    backends:
      memory_store:
        memory:
          max_traces: 100000
  jaeger_query:
    storage:
      traces: memory_store
    http:
      endpoint: $HOST_IP:$query
    grpc:
      endpoint: 127.0.0.1:$query_grpc
receivers:
  otlp:
    protocols:
      http:
        endpoint: $HOST_IP:$otlp
exporters:
  jaeger_storage_exporter:
    trace_storage: memory_store
YAML
  start_bg jaeger "$1/jaeger" --config "$RUN/jaeger.yaml"
  wait_for jaeger 30 jaeger curl -sf -o /dev/null "http://$HOST_IP:$query/api/services"
  JAEGER_OTLP=http://$HOST_IP:$otlp JAEGER_QUERY=http://$HOST_IP:$query
}

start() {
  if [[ -d $RUN/pids ]] && compgen -G "$RUN/pids/*" >/dev/null; then
    die "$RUN is in use by a running test cluster; run '$0 stop' first"
  fi
  local BIN b
  BIN=$(bin_dir)
  for b in etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kube-router s3s-fs jaeger; do
    [[ -x $BIN/$b ]] || die "$BIN/$b is missing; run tests/cluster/build.sh first"
  done
  KUBECTL=$(kubectl_bin)
  preflight
  rm -rf "$RUN"; mkdir -p "$RUN"/{logs,pids,s3/toolyard}
  ID=$(openssl rand -hex 3)
  GROUP=toolyard-test-$ID
  echo "$GROUP" >"$RUN/cgroup"
  trap 'log "start failed; stopping what was started"; stop' ERR
  host_rules >"$RUN/host-rules.before"
  cgroup_create "$GROUP"

  local N
  N=$(pick_net)
  HOST_IP=10.$N.0.1 NODE_IP=10.$N.0.2 POD_PREFIX=10.$N.1 SVC_PREFIX=10.$N.2
  POD_CIDR=$POD_PREFIX.0/24 SVC_CIDR=$SVC_PREFIX.0/24
  node_network

  make_pki
  make_tokens
  local ETCD_PORT ETCD_PEER_PORT S3_PORT
  ETCD_PORT=$(freeport); ETCD_PEER_PORT=$(freeport); API_PORT=$(freeport "$HOST_IP"); S3_PORT=$(freeport)

  start_bg etcd "$BIN/etcd" --name toolyard-test --data-dir "$RUN/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "toolyard-test=http://127.0.0.1:$ETCD_PEER_PORT" \
    --unsafe-no-fsync --log-level warn --quota-backend-bytes=$((2 * 1024 * 1024 * 1024))
  wait_for etcd 30 etcd curl -fsS "http://127.0.0.1:$ETCD_PORT/health"

  start_bg kube-apiserver "$BIN/kube-apiserver" \
    --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
    --bind-address="$HOST_IP" --advertise-address="$HOST_IP" --secure-port="$API_PORT" \
    --endpoint-reconciler-type=lease \
    --tls-cert-file="$RUN/pki/apiserver.crt" --tls-private-key-file="$RUN/pki/apiserver.key" \
    --client-ca-file="$RUN/pki/ca.crt" --cert-dir="$RUN/pki/generated" \
    --kubelet-client-certificate="$RUN/pki/kubelet-client.crt" --kubelet-client-key="$RUN/pki/kubelet-client.key" \
    --kubelet-preferred-address-types=InternalIP \
    --service-account-issuer="https://$HOST_IP:$API_PORT" \
    --service-account-key-file="$RUN/pki/sa.pub" \
    --service-account-signing-key-file="$RUN/pki/sa.key" \
    --api-audiences="https://$HOST_IP:$API_PORT,toolyard" \
    --token-auth-file="$RUN/tokens.csv" \
    --authorization-mode=Node,RBAC \
    --service-cluster-ip-range="$SVC_CIDR" \
    --allow-privileged=true --profiling=false --v=1 \
    --feature-gates=MutatingAdmissionPolicy=true --runtime-config=admissionregistration.k8s.io/v1beta1=true
  wait_for kube-apiserver 120 kube-apiserver curl -fsS --cacert "$RUN/pki/ca.crt" \
    -H "Authorization: Bearer ${TOKEN[admin]}" "https://$HOST_IP:$API_PORT/readyz"

  write_kubeconfig "$RUN/admin.kubeconfig" admin "${TOKEN[admin]}"
  write_kubeconfig "$RUN/kcm.kubeconfig" system:kube-controller-manager "${TOKEN[kcm]}"
  write_kubeconfig "$RUN/alice.kubeconfig" alice "${TOKEN[alice]}"
  write_kubeconfig "$RUN/bob.kubeconfig" bob "${TOKEN[bob]}"
  write_kubeconfig "$RUN/controller.kubeconfig" toolyard-controller "${TOKEN[controller]}"
  write_kubeconfig "$RUN/gateway.kubeconfig" toolyard-gateway "${TOKEN[gateway]}"
  wait_for "the default namespace" 30 kube-apiserver "$KUBECTL" --kubeconfig "$RUN/admin.kubeconfig" get namespace default

  # Pods of namespaces labelled toolyard.dev/test-pods=unscheduled name a scheduler that does
  # not exist: no scheduler binds them and no kubelet runs them, so their status is what a
  # test sets (the controller's logic tests report pod outcomes that way).
  "$KUBECTL" --kubeconfig "$RUN/admin.kubeconfig" apply -f "$HERE/unscheduled-pods.yaml" >/dev/null

  # Each of its controllers' clients may send 200 requests a second (default 20): a Job costs
  # the Job controller about five (pod, finalizer, status), so the default held a stream of
  # runs to about 4 a second (tests/benches/run_stream.rs); large clusters raise it likewise.
  start_bg kube-controller-manager "$BIN/kube-controller-manager" \
    --kube-api-qps=200 --kube-api-burst=300 \
    --kubeconfig="$RUN/kcm.kubeconfig" --leader-elect=false --secure-port=0 \
    --use-service-account-credentials=true \
    --service-account-private-key-file="$RUN/pki/sa.key" --root-ca-file="$RUN/pki/ca.crt" \
    --cluster-signing-cert-file="$RUN/pki/ca.crt" --cluster-signing-key-file="$RUN/pki/ca.key" \
    --allocate-node-cidrs=true --cluster-cidr="$POD_CIDR" --node-cidr-mask-size=24 \
    --service-cluster-ip-range="$SVC_CIDR" --configure-cloud-routes=false \
    --concurrent-job-syncs=20 --v=1
  wait_for "kube-controller-manager to create the default ServiceAccount" 60 kube-controller-manager \
    "$KUBECTL" --kubeconfig "$RUN/admin.kubeconfig" -n default get serviceaccount default

  S3_ACCESS_KEY=toolyard-test-$(openssl rand -hex 4)
  S3_SECRET_KEY=$(openssl rand -hex 20)
  start_bg s3s-fs "$BIN/s3s-fs" --host 127.0.0.1 --port "$S3_PORT" \
    --access-key "$S3_ACCESS_KEY" --secret-key "$S3_SECRET_KEY" "$RUN/s3"
  wait_for s3s-fs 30 s3s-fs curl -s -o /dev/null "http://127.0.0.1:$S3_PORT/"
  start_jaeger "$BIN"

  node_containerd
  node_images
  node_components "$BIN"
  node_dns
  local pid
  for pid in "$RUN"/pids/*; do
    kill -0 "$(cat "$pid")" 2>/dev/null || die "${pid##*/} exited while the cluster started: $(tail -n 5 "$RUN/logs/${pid##*/}.log")"
  done

  cat >"$RUN/env" <<ENV
export TOOLYARD_TEST_RUN=$RUN
export TOOLYARD_TEST_BIN=$BIN
export TOOLYARD_TEST_KUBECTL=$KUBECTL
export TOOLYARD_TEST_API=https://$HOST_IP:$API_PORT
export TOOLYARD_TEST_CA=$RUN/pki/ca.crt
export TOOLYARD_TEST_SA_KEY=$RUN/pki/sa.key
export TOOLYARD_TEST_TOKEN_ADMIN=${TOKEN[admin]}
export TOOLYARD_TEST_TOKEN_ALICE=${TOKEN[alice]}
export TOOLYARD_TEST_TOKEN_BOB=${TOKEN[bob]}
export TOOLYARD_TEST_TOKEN_CONTROLLER=${TOKEN[controller]}
export TOOLYARD_TEST_TOKEN_GATEWAY=${TOKEN[gateway]}
export TOOLYARD_TEST_S3_ENDPOINT=http://127.0.0.1:$S3_PORT
export TOOLYARD_TEST_S3_ACCESS_KEY=$S3_ACCESS_KEY
export TOOLYARD_TEST_S3_SECRET_KEY=$S3_SECRET_KEY
export TOOLYARD_TEST_S3_REGION=us-east-1
export TOOLYARD_TEST_S3_BUCKET=toolyard
export TOOLYARD_TEST_OTLP_ENDPOINT=$JAEGER_OTLP
export TOOLYARD_TEST_TRACES_URL=$JAEGER_QUERY
export TOOLYARD_TEST_NODE=$NODE
export TOOLYARD_TEST_HOST_IP=$HOST_IP
export TOOLYARD_TEST_POD_CIDR=$POD_CIDR
export TOOLYARD_TEST_SERVICE_CIDR=$SVC_CIDR
export TOOLYARD_TEST_NETNS=$(cat "$RUN/netns")
export KUBECONFIG=$RUN/admin.kubeconfig
ENV
  trap - ERR
  log "up: kube-apiserver https://$HOST_IP:$API_PORT, node $NODE ($NODE_IP, pods $POD_CIDR), s3 http://127.0.0.1:$S3_PORT; source $RUN/env"
}

stop() {
  [[ -f $RUN/cgroup ]] || return 0
  local group netns left=0 m
  group=$(cat "$RUN/cgroup")
  # The control plane first, gently (etcd writes its data), then everything at once.
  for name in kube-apiserver etcd; do
    [[ -f $RUN/pids/$name ]] && kill "$(cat "$RUN/pids/$name")" 2>/dev/null || true
  done
  sleep 0.5
  cgroup_kill "$group" || left=1
  if [[ -f $RUN/netns ]]; then
    netns=$(cat "$RUN/netns")
    ip netns del "$netns" 2>/dev/null || true
    # The kernel tears a namespace down asynchronously: its links go a moment later.
    for _ in $(seq 50); do ip link show "ty${netns#toolyard-}-h" >/dev/null 2>&1 || break; sleep 0.1; done
    ip netns list | grep -qw "$netns" && { log "the network namespace $netns is left"; left=1; }
    ip link show "ty${netns#toolyard-}-h" >/dev/null 2>&1 && { log "the link ty${netns#toolyard-}-h is left"; left=1; }
  fi
  if [[ -f $RUN/host-rules.before ]] && ! diff -u "$RUN/host-rules.before" <(host_rules) >"$RUN/host-rules.diff"; then
    log "the host's iptables rules or ipsets changed while the cluster ran:"
    cat "$RUN/host-rules.diff" >&2
    left=1
  fi
  m=$(awk -v run="$RUN" 'index($5, run) == 1 { print $5 }' /proc/self/mountinfo)
  [[ -z $m ]] || { log "mounts left under $RUN: $m"; left=1; }
  rm -rf "$RUN/pids" "$RUN/etcd" "$RUN/cgroup" "$RUN/netns" "$RUN/node" "$RUN/host-rules.before"
  ((left == 0)) || die "stopped, but something was left behind (see above)"
}

case ${1:-} in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
