#!/usr/bin/env bash
# The one command that runs every test of the repository:
#   Rust formatting and lints, Rust unit and integration tests (against a real kube-apiserver,
#   kube-controller-manager, a real node and an S3 server started here), Python tests, chart
#   checks.
#
# It installs what it needs (test cluster binaries, the S3 server, a Python venv, Node packages) into
# $HOME/.cache/toolyard (TOOLYARD_CACHE), skips what is already there, starts the test cluster
# and stops it on exit. Cargo output goes to $HOME/.cache/toolyard/target (CARGO_TARGET_DIR)
# so reruns are fast.
#
# Every suite runs even when an earlier one failed (a suite whose prerequisite failed is
# reported as not run); the command then fails with a summary naming each failed suite.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
export TOOLYARD_CACHE=${TOOLYARD_CACHE:-$HOME/.cache/toolyard}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$TOOLYARD_CACHE/target}
export TOOLYARD_CLUSTER_RUN=${TOOLYARD_CLUSTER_RUN:-$(mktemp -d "${TMPDIR:-/tmp}/toolyard-test-XXXXXX")}
export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}
LOGS=$(mktemp -d "${TMPDIR:-/tmp}/toolyard-run-logs-XXXXXX")
trap 'rm -rf "$LOGS"' EXIT

step() { printf '\n==> %s\n' "$*" >&2; }
fail() { echo "tests/run.sh: $*" >&2; exit 1; }

REPORT=()
FAILED=()
# suite <name> <command...>: runs the command in a subshell that stops at its first failing
# line, records the outcome and returns its status. Call it as a plain command (not after
# `if`, `!`, `&&` or `||`, where bash ignores `set -e` in everything it runs).
suite() {
  local name=$1 t0=$SECONDS rc
  shift
  step "$name"
  (set -e; "$@")
  rc=$?
  if ((rc == 0)); then
    REPORT+=("ok       $name ($((SECONDS - t0)) s)")
  else
    REPORT+=("FAILED   $name ($((SECONDS - t0)) s)")
    FAILED+=("$name")
  fi
  return $rc
}
# not_run <name> <why>: a suite that could not run counts as failed.
not_run() {
  REPORT+=("NOT RUN  $1: $2")
  FAILED+=("$1 (not run: $2)")
  step "$1: not run ($2)"
}

summary() {
  printf '\n==> summary (%d s)\n' "$SECONDS" >&2
  printf '    %s\n' "${REPORT[@]}" >&2
  if ((${#FAILED[@]})); then
    printf '\ntests/run.sh: %d suite(s) failed:\n' "${#FAILED[@]}" >&2
    printf '    %s\n' "${FAILED[@]}" >&2
    return 1
  fi
  printf '\n==> all tests passed\n' >&2
}

for tool in cargo python3 go openssl curl npm; do
  command -v "$tool" >/dev/null 2>&1 || fail "$tool is required (see docs/testing.md: Prerequisites)"
done

# --- tools ------------------------------------------------------------------------------
tools_cluster() { tests/cluster/build.sh all >/dev/null; }
suite "tools: test cluster binaries (cached in $TOOLYARD_CACHE)" tools_cluster
TOOLS_OK=$?

VENV=$TOOLYARD_CACHE/venv
tools_venv() {
  local reqs=tests/python-requirements.txt
  if [[ ! -x $VENV/bin/python || ! -f $VENV/.stamp || $(cat "$VENV/.stamp") != $(sha256sum "$reqs" | cut -c1-64) ]]; then
    rm -rf "$VENV"
    python3 -m venv "$VENV" || fail "python3 -m venv failed (Debian: apt install python3-venv)"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check -r "$reqs" || fail "pip install -r $reqs failed"
    sha256sum "$reqs" | cut -c1-64 >"$VENV/.stamp"
  fi
}
suite "tools: Python venv with test dependencies" tools_venv
VENV_OK=$?
export TOOLYARD_TEST_PYTHON=$VENV/bin/python

# Node 22 and the MCP servers and suites from npm (tests/node/package-lock.json).
NODE_DIR=$TOOLYARD_CACHE/node
tools_node() {
  local lock=tests/node/package-lock.json
  if [[ ! -d $NODE_DIR/node_modules || ! -f $NODE_DIR/.stamp || $(cat "$NODE_DIR/.stamp") != $(sha256sum "$lock" | cut -c1-64) ]]; then
    rm -rf "$NODE_DIR"
    mkdir -p "$NODE_DIR"
    cp tests/node/package.json "$lock" "$NODE_DIR/"
    (cd "$NODE_DIR" && npm ci --no-audit --no-fund --loglevel=error) || fail "npm ci of tests/node failed"
    sha256sum "$lock" | cut -c1-64 >"$NODE_DIR/.stamp"
  fi
}
suite "tools: Node 22 and MCP servers from npm" tools_node
export TOOLYARD_TEST_NODE_MODULES=$NODE_DIR/node_modules

# --- Rust build -------------------------------------------------------------------------
cargo_cache() {
  # Cargo never removes older builds from the target folder (each change of a dependency or
  # of a crate's features adds new ones), so it only grows: above TOOLYARD_CACHE_MAX_GB it is
  # emptied, and this build is cold.
  local max_gb=${TOOLYARD_CACHE_MAX_GB:-50} used_gb stamp members
  [[ $max_gb =~ ^[0-9]+$ ]] || fail "TOOLYARD_CACHE_MAX_GB must be a whole number of GB, not '$max_gb'"
  if [[ -d $CARGO_TARGET_DIR ]]; then
    used_gb=$(($(du -sk "$CARGO_TARGET_DIR" | cut -f1) / 1024 / 1024))
    if ((used_gb > max_gb)); then
      echo "it holds $used_gb GB, more than TOOLYARD_CACHE_MAX_GB=$max_gb: emptying it (this build is cold)" >&2
      rm -rf "$CARGO_TARGET_DIR"
    fi
  fi
  # Every crate of Cargo.lock, for every platform: the licence check reads them all, and the
  # later steps need no network.
  cargo fetch --locked --quiet
  # Cargo judges the workspace's own crates fresh by file times, whatever checkout built
  # them: after a build from another checkout, this checkout's crates are built again.
  stamp=$CARGO_TARGET_DIR/.toolyard-checkout
  if [[ -f $stamp && $(cat "$stamp") != "$ROOT" ]]; then
    echo "last built from $(cat "$stamp"): building this checkout's crates again" >&2
    mapfile -t members < <(cargo metadata --no-deps --format-version 1 --offline |
      python3 -c 'import json, sys; print("\n".join(p["name"] for p in json.load(sys.stdin)["packages"]))')
    ((${#members[@]})) || fail "cargo metadata listed no workspace crates"
    cargo clean --quiet "${members[@]/#/--package=}"
  fi
  mkdir -p "$CARGO_TARGET_DIR"
  echo "$ROOT" >"$stamp"
}
# CI builds its clone once: it writes no incremental data.
[[ ${CI:-} == true ]] && export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}
suite "crates: download and build cache in $CARGO_TARGET_DIR" cargo_cache
CRATES_OK=$?

if ((CRATES_OK == 0)); then
  suite "formatting (cargo fmt --check)" cargo fmt --all --check
  suite "lints (cargo clippy -D warnings)" cargo clippy --workspace --all-targets --quiet -- -D warnings
  build() {
    cargo build --workspace --bins --quiet
    cargo test --workspace --no-run --quiet
  }
  suite "build" build
  BUILD_OK=$?
else
  not_run "formatting, lints and build" "the crates could not be downloaded"
  BUILD_OK=1
fi

# --- images, the test cluster and the Rust tests ----------------------------------------
# The Dockerfile's images and the test images, built from the binaries above (the node
# imports them; no registry is involved).
IMAGES_OK=1
if ((TOOLS_OK != 0)); then
  not_run "images" "the test cluster binaries could not be built"
elif ((BUILD_OK != 0)); then
  not_run "images" "the build failed"
else
  suite "images (Dockerfile and test images)" tests/cluster/images.sh
  IMAGES_OK=$?
fi

CLUSTER_OK=1
if ((IMAGES_OK != 0)); then
  not_run "test cluster: start" "the images could not be built"
else
  # Also on an interrupted run; after the "stop" suite below it finds nothing to stop.
  trap 'tests/cluster/cluster.sh stop; rm -rf "$TOOLYARD_CLUSTER_RUN" "$LOGS"' EXIT
  suite "test cluster: start (in $TOOLYARD_CLUSTER_RUN)" tests/cluster/cluster.sh start
  CLUSTER_OK=$?
fi

rust_tests() {
  # --no-fail-fast runs every test target; the failed ones are named in the summary. Three
  # tests at a time on 2 CPUs: most integration tests wait on the cluster, and those that
  # fill the node wait for it (toolyard_tests::claim_node) without holding up the others.
  cargo test --workspace --quiet --no-fail-fast -- --test-threads=3 2>&1 | tee "$LOGS/cargo-test.log"
}
if ((BUILD_OK != 0)); then
  not_run "Rust tests" "the build failed"
elif ((CLUSTER_OK != 0)); then
  not_run "Rust tests" "the test cluster did not start"
else
  suite "Rust tests" rust_tests
  # cargo lists the failed targets after "error: N targets failed:"; libtest names each failed
  # test in the indented list that follows its last "failures:" line.
  while read -r target; do
    FAILED+=("    Rust test target $target")
  done < <(sed -n '/targets\{0,1\} failed:/,$p' "$LOGS/cargo-test.log" | grep -o '`[^`]*`' | tr -d '`')
  while read -r test; do
    FAILED+=("      $test")
  done < <(awk '/^failures:$/ {listed = 1; next} listed && /^    [^ ]+$/ {print $1; next} {listed = 0}' "$LOGS/cargo-test.log")
fi

if [[ -f $TOOLYARD_CLUSTER_RUN/cgroup ]]; then
  # Fails when any process, cgroup, network link or mount of the cluster is left behind.
  suite "test cluster: stop, nothing left behind" tests/cluster/cluster.sh stop
fi

# --- Python and chart -------------------------------------------------------------------
if ((VENV_OK == 0)); then
  suite "Python tests" "$VENV/bin/python" -m pytest -q worker-image/python/tests examples/pricing/tests examples/risk/tests
else
  not_run "Python tests" "the Python venv could not be made"
fi

chart_checks() {
  local helm values
  helm=$(tests/cluster/build.sh path)/helm
  "$helm" lint --strict charts/toolyard --kube-version 1.34.4
  for values in charts/toolyard/ci/*.yaml; do
    "$helm" lint --strict charts/toolyard --kube-version 1.34.4 -f "$values"
  done
}
if ((TOOLS_OK == 0)); then
  suite "chart checks (helm lint)" chart_checks
else
  not_run "chart checks (helm lint)" "helm could not be built"
fi

summary
