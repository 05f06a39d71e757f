#!/usr/bin/env bash
# Builds the gateway, the runner and the `toolyard` command, then starts Toolyard's embedded local mode: the tools of
# a folder of McpTool manifests served on http://127.0.0.1:8787/mcp, calls run as local processes.
#
# Usage: scripts/local.sh [DIR] [FLAGS...]     DIR defaults to examples/pricing
#        PROFILE=release scripts/local.sh      optimized build (slower to build, faster calls)
# FLAGS go to `toolyard-gateway local` (see `--help`): --listen, --token-file, --data-dir, --policy, ...
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PROFILE=${PROFILE:-debug}
build_flags=()
[[ $PROFILE == release ]] && build_flags=(--release)

dir=$ROOT/examples/pricing
if [[ $# -gt 0 && $1 != -* ]]; then
  dir=$1
  shift
fi

cargo build --quiet --manifest-path "$ROOT/Cargo.toml" -p toolyard-gateway -p toolyard-runner -p toolyard-cli "${build_flags[@]}"
# Bytecode for the bundled package and the examples (what `pip install` does for an installed
# package): with PYTHONDONTWRITEBYTECODE set, every call would compile them again.
python3 -m compileall -q "$ROOT/worker-image/python/toolyard" "$ROOT/examples" >/dev/null || true
bin=${CARGO_TARGET_DIR:-$ROOT/target}/$PROFILE
exec "$bin/toolyard-gateway" local "$dir" --runner "$bin/toolyard-runner" "$@"
