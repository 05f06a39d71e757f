#!/usr/bin/env bash
# The one command that runs every test of the repository:
#   Rust formatting and lints, Rust unit and integration tests (against a real kube-apiserver,
#   kube-controller-manager and S3 server started here), Python tests, chart checks.
#
# It installs what it needs (test control plane binaries, the S3 server, a Python venv) into
# $HOME/.cache/toolyard (TOOLYARD_CACHE), skips what is already there, starts the test cluster
# on random loopback ports and stops it on exit. Cargo output goes to
# $HOME/.cache/toolyard/target (CARGO_TARGET_DIR) so reruns are fast.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
export TOOLYARD_CACHE=${TOOLYARD_CACHE:-$HOME/.cache/toolyard}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$TOOLYARD_CACHE/target}
export TOOLYARD_CLUSTER_RUN=${TOOLYARD_CLUSTER_RUN:-$(mktemp -d "${TMPDIR:-/tmp}/toolyard-test-XXXXXX")}
export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}

step() { printf '\n==> %s\n' "$*" >&2; }
fail() { echo "tests/run.sh: $*" >&2; exit 1; }

for tool in cargo python3 go openssl curl; do
  command -v "$tool" >/dev/null 2>&1 || fail "$tool is required (see README: Prerequisites)"
done

step "test control plane binaries (cached in $TOOLYARD_CACHE)"
tests/cluster/build.sh all

step "Python venv with test dependencies"
VENV=$TOOLYARD_CACHE/venv
REQS=tests/python-requirements.txt
if [[ ! -x $VENV/bin/python || ! -f $VENV/.stamp || $(cat "$VENV/.stamp") != $(sha256sum "$REQS" | cut -c1-64) ]]; then
  rm -rf "$VENV"
  python3 -m venv "$VENV" || fail "python3 -m venv failed (Debian: apt install python3-venv)"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check -r "$REQS" || fail "pip install -r $REQS failed"
  sha256sum "$REQS" | cut -c1-64 >"$VENV/.stamp"
fi
export TOOLYARD_TEST_PYTHON=$VENV/bin/python

step "build cache in $CARGO_TARGET_DIR"
# Cargo never removes older builds from the target folder (each change of a dependency or of
# a crate's features adds new ones), so it only grows: above TOOLYARD_CACHE_MAX_GB it is
# emptied, and this build is cold. CI builds its clone once: it writes no incremental data.
MAX_GB=${TOOLYARD_CACHE_MAX_GB:-50}
[[ $MAX_GB =~ ^[0-9]+$ ]] || fail "TOOLYARD_CACHE_MAX_GB must be a whole number of GB, not '$MAX_GB'"
if [[ -d $CARGO_TARGET_DIR ]]; then
  USED_GB=$(($(du -sk "$CARGO_TARGET_DIR" | cut -f1) / 1024 / 1024))
  if ((USED_GB > MAX_GB)); then
    echo "it holds $USED_GB GB, more than TOOLYARD_CACHE_MAX_GB=$MAX_GB: emptying it (this build is cold)" >&2
    rm -rf "$CARGO_TARGET_DIR"
  fi
fi
if [[ ${CI:-} == true ]]; then
  export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}
fi
# Cargo judges the workspace's own crates fresh by file times, whatever checkout built them:
# a checkout whose files are older than another checkout's build would test that build's code
# (with that checkout's paths compiled in). After a build from another checkout, this
# checkout's crates are built again; dependencies stay.
STAMP=$CARGO_TARGET_DIR/.toolyard-checkout
if [[ -f $STAMP && $(cat "$STAMP") != "$ROOT" ]]; then
  echo "last built from $(cat "$STAMP"): building this checkout's crates again" >&2
  mapfile -t MEMBERS < <(cargo metadata --no-deps --format-version 1 --offline |
    python3 -c 'import json, sys; print("\n".join(p["name"] for p in json.load(sys.stdin)["packages"]))')
  ((${#MEMBERS[@]})) || fail "cargo metadata listed no workspace crates"
  cargo clean --quiet "${MEMBERS[@]/#/--package=}"
fi
mkdir -p "$CARGO_TARGET_DIR"
echo "$ROOT" >"$STAMP"

step "formatting and lints"
cargo fmt --all --check
cargo clippy --workspace --all-targets --quiet -- -D warnings

step "building"
cargo build --workspace --bins --quiet
cargo test --workspace --no-run --quiet

step "starting the test cluster in $TOOLYARD_CLUSTER_RUN"
trap 'tests/cluster/cluster.sh stop; rm -rf "$TOOLYARD_CLUSTER_RUN"' EXIT
tests/cluster/cluster.sh start

step "Rust tests"
cargo test --workspace --quiet --no-fail-fast

step "Python tests"
"$VENV/bin/python" -m pytest -q worker-image/python/tests examples/pricing/tests

if [[ -d charts/toolyard ]]; then
  step "chart checks"
  HELM=$(tests/cluster/build.sh path)/helm
  "$HELM" lint --strict charts/toolyard --kube-version 1.34.4
  for values in charts/toolyard/ci/*.yaml; do
    "$HELM" lint --strict charts/toolyard --kube-version 1.34.4 -f "$values"
  done
fi

step "all tests passed"
