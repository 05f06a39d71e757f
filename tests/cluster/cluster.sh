#!/usr/bin/env bash
# Starts and stops the test control plane: etcd, kube-apiserver, kube-controller-manager
# and the s3s-fs S3 server, all on random loopback ports, with static-token users.
#
#   tests/cluster/cluster.sh start   # builds nothing; run tests/cluster/build.sh first
#   tests/cluster/cluster.sh stop
#
# Writes $RUN/env (shell `export` lines, also read by the Rust test support crate) and one
# kubeconfig per user. Stops only the processes it started, by PID. A failed start stops
# whatever it had started.
#
# Users (token file): admin (system:masters), alice (groups quants, viewers), bob (group ops),
# toolyard-controller, toolyard-gateway, system:kube-controller-manager.
#
# Environment: TOOLYARD_CLUSTER_RUN (default ${TMPDIR:-/tmp}/toolyard-cluster), TOOLYARD_CACHE.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
RUN=${TOOLYARD_CLUSTER_RUN:-${TMPDIR:-/tmp}/toolyard-cluster}
K8S_VERSION=${K8S_VERSION:-v1.34.4}

die() { echo "tests/cluster/cluster.sh: $*" >&2; exit 1; }
log() { echo "tests/cluster/cluster.sh: $*" >&2; }

bin_dir() {
  # The same path build.sh prints; computed without building anything.
  local d
  d=$(TOOLYARD_BUILD_DRY_RUN=1 "$HERE/build.sh" path)
  echo "$d"
}

kubectl_bin() {
  local k
  for k in kubectl.1.34 kubectl.1.33 /usr/lib/google-cloud-sdk/bin/kubectl.1.33; do
    if command -v "$k" >/dev/null 2>&1; then command -v "$k"; return; fi
  done
  command -v kubectl || die "kubectl not found (kubectl.1.33 or newer is expected on the machine)"
}

freeport() {
  python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1]);s.close()'
}

port_free() {
  python3 -c 'import socket,sys;s=socket.socket();s.bind(("127.0.0.1",int(sys.argv[1])));s.close()' "$1" 2>/dev/null
}

wait_for() { # <description> <seconds> <pid-name> <command...>
  local desc=$1 secs=$2 name=$3; shift 3
  local i pid
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

start_bg() { # <name> <command...>
  local name=$1; shift
  "$@" >"$RUN/logs/$name.log" 2>&1 &
  echo $! >"$RUN/pids/$name"
}

make_pki() {
  local P=$RUN/pki
  mkdir -p "$P"
  openssl req -x509 -newkey rsa:2048 -nodes -keyout "$P/ca.key" -out "$P/ca.crt" -days 3650 \
    -subj "/CN=toolyard-test-ca" -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -keyout "$P/apiserver.key" -out "$P/apiserver.csr" \
    -subj "/CN=kube-apiserver" 2>/dev/null
  cat >"$P/apiserver.ext" <<EXT
subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
EXT
  openssl x509 -req -in "$P/apiserver.csr" -CA "$P/ca.crt" -CAkey "$P/ca.key" -CAcreateserial \
    -days 3650 -out "$P/apiserver.crt" -extfile "$P/apiserver.ext" 2>/dev/null
  openssl genrsa -out "$P/sa.key" 2048 2>/dev/null
  openssl rsa -in "$P/sa.key" -pubout -out "$P/sa.pub" 2>/dev/null
}

declare -A TOKEN
make_tokens() {
  local u
  for u in admin kcm alice bob controller gateway; do TOKEN[$u]=$(openssl rand -hex 24); done
  cat >"$RUN/tokens.csv" <<CSV
${TOKEN[admin]},admin,uid-admin,"system:masters"
${TOKEN[kcm]},system:kube-controller-manager,uid-kcm
${TOKEN[alice]},alice,uid-alice,"quants,viewers"
${TOKEN[bob]},bob,uid-bob,"ops"
${TOKEN[controller]},toolyard-controller,uid-toolyard-controller
${TOKEN[gateway]},toolyard-gateway,uid-toolyard-gateway
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
    server: https://127.0.0.1:$API_PORT
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

start() {
  if [[ -d $RUN/pids ]] && compgen -G "$RUN/pids/*" >/dev/null; then
    die "$RUN is in use by a running test cluster; run '$0 stop' first"
  fi
  local BIN KUBECTL
  BIN=$(bin_dir)
  for b in etcd kube-apiserver kube-controller-manager s3s-fs; do
    [[ -x $BIN/$b ]] || die "$BIN/$b is missing; run tests/cluster/build.sh first"
  done
  command -v openssl >/dev/null || die "openssl is needed to make the test PKI"
  command -v curl >/dev/null || die "curl is needed to wait for the servers"
  KUBECTL=$(kubectl_bin)
  rm -rf "$RUN"; mkdir -p "$RUN"/{logs,pids,s3/toolyard}
  trap 'log "start failed; stopping what was started"; stop' ERR

  make_pki
  make_tokens
  ETCD_PORT=$(freeport); ETCD_PEER_PORT=$(freeport); API_PORT=$(freeport); S3_PORT=$(freeport)
  for p in $ETCD_PORT $ETCD_PEER_PORT $API_PORT $S3_PORT; do
    port_free "$p" || die "port $p on 127.0.0.1 is not available"
  done

  start_bg etcd "$BIN/etcd" --name toolyard-test --data-dir "$RUN/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "toolyard-test=http://127.0.0.1:$ETCD_PEER_PORT" \
    --unsafe-no-fsync --log-level warn --quota-backend-bytes=$((2 * 1024 * 1024 * 1024))
  wait_for etcd 30 etcd curl -fsS "http://127.0.0.1:$ETCD_PORT/health"

  start_bg kube-apiserver "$BIN/kube-apiserver" \
    --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
    --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$API_PORT" \
    --endpoint-reconciler-type=none \
    --tls-cert-file="$RUN/pki/apiserver.crt" --tls-private-key-file="$RUN/pki/apiserver.key" \
    --client-ca-file="$RUN/pki/ca.crt" --cert-dir="$RUN/pki/generated" \
    --service-account-issuer="https://127.0.0.1:$API_PORT" \
    --service-account-key-file="$RUN/pki/sa.pub" \
    --service-account-signing-key-file="$RUN/pki/sa.key" \
    --api-audiences="https://127.0.0.1:$API_PORT,toolyard" \
    --token-auth-file="$RUN/tokens.csv" \
    --authorization-mode=RBAC \
    --service-cluster-ip-range=10.0.0.0/24 \
    --allow-privileged=true --profiling=false --v=1
  wait_for kube-apiserver 120 kube-apiserver curl -fsS --cacert "$RUN/pki/ca.crt" \
    -H "Authorization: Bearer ${TOKEN[admin]}" "https://127.0.0.1:$API_PORT/readyz"

  write_kubeconfig "$RUN/admin.kubeconfig" admin "${TOKEN[admin]}"
  write_kubeconfig "$RUN/kcm.kubeconfig" system:kube-controller-manager "${TOKEN[kcm]}"
  write_kubeconfig "$RUN/alice.kubeconfig" alice "${TOKEN[alice]}"
  write_kubeconfig "$RUN/bob.kubeconfig" bob "${TOKEN[bob]}"
  write_kubeconfig "$RUN/controller.kubeconfig" toolyard-controller "${TOKEN[controller]}"
  write_kubeconfig "$RUN/gateway.kubeconfig" toolyard-gateway "${TOKEN[gateway]}"
  wait_for "the default namespace" 30 kube-apiserver "$KUBECTL" --kubeconfig "$RUN/admin.kubeconfig" get namespace default

  start_bg kube-controller-manager "$BIN/kube-controller-manager" \
    --kubeconfig="$RUN/kcm.kubeconfig" --leader-elect=false --secure-port=0 \
    --use-service-account-credentials=true \
    --service-account-private-key-file="$RUN/pki/sa.key" --root-ca-file="$RUN/pki/ca.crt" \
    --cluster-signing-cert-file="$RUN/pki/ca.crt" --cluster-signing-key-file="$RUN/pki/ca.key" \
    --concurrent-job-syncs=20 --v=1
  wait_for "kube-controller-manager to create the default ServiceAccount" 60 kube-controller-manager \
    "$KUBECTL" --kubeconfig "$RUN/admin.kubeconfig" -n default get serviceaccount default

  S3_ACCESS_KEY=toolyard-test-$(openssl rand -hex 4)
  S3_SECRET_KEY=$(openssl rand -hex 20)
  start_bg s3s-fs "$BIN/s3s-fs" --host 127.0.0.1 --port "$S3_PORT" \
    --access-key "$S3_ACCESS_KEY" --secret-key "$S3_SECRET_KEY" "$RUN/s3"
  wait_for s3s-fs 30 s3s-fs curl -s -o /dev/null "http://127.0.0.1:$S3_PORT/"

  cat >"$RUN/env" <<ENV
export TOOLYARD_TEST_RUN=$RUN
export TOOLYARD_TEST_BIN=$BIN
export TOOLYARD_TEST_KUBECTL=$KUBECTL
export TOOLYARD_TEST_API=https://127.0.0.1:$API_PORT
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
export KUBECONFIG=$RUN/admin.kubeconfig
ENV
  trap - ERR
  log "up: kube-apiserver https://127.0.0.1:$API_PORT, s3 http://127.0.0.1:$S3_PORT; source $RUN/env"
}

stop() {
  [[ -d $RUN/pids ]] || return 0
  local name pid
  for name in s3s-fs kube-controller-manager kube-apiserver etcd; do
    [[ -f $RUN/pids/$name ]] || continue
    pid=$(cat "$RUN/pids/$name")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$RUN/pids/$name"
  done
  rm -rf "$RUN/etcd"
}

case ${1:-} in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
