#!/usr/bin/env bash
# Refreshes openapi/ for another OpenCode release:
#
#   bash openapi/refresh.sh 1.18.34
#   bash openapi/refresh.sh --bin /path/to/opencode
#
# installs that `opencode-ai` with npm into a scratch directory (or takes the binary given),
# writes its spec to
# openapi/opencode.json (`opencode generate` prints it without starting a server), records the
# version in openapi/OPENCODE_VERSION, and prints what changed in the operations listed in
# openapi/operations.txt. Then: `cargo build` (build.rs regenerates the client; it fails with a
# JSON path if the new spec has a construct no normalisation rule handles) and `cargo test`
# (the integration tests install and drive the same version).
set -euo pipefail

usage="usage: bash openapi/refresh.sh <opencode-ai version, e.g. 1.18.34> | --bin <path to an opencode binary>"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT

case "${1:-}" in
  --bin)
    # A binary you already have, e.g. the platform package alone (`npm install
    # opencode-linux-x64@<version>`): the `opencode-ai` wrapper of an older release can fail to
    # install where its optional platform packages are gone.
    bin="${2:?$usage}"
    [ -x "$bin" ] || { echo "$bin is not an executable" >&2; exit 1; }
    version="$("$bin" --version)"
    echo "using $bin (OpenCode $version)" >&2
    ;;
  ""|-*)
    echo "$usage" >&2
    exit 2
    ;;
  *)
    version="$1"
    echo "installing opencode-ai@$version into $scratch ..." >&2
    npm install --prefix "$scratch" --no-audit --no-fund --loglevel=error "opencode-ai@$version" >&2
    bin="$scratch/node_modules/.bin/opencode"
    got="$("$bin" --version)"
    [ "$got" = "$version" ] || { echo "installed opencode reports $got, not $version" >&2; exit 1; }
    ;;
esac

# Isolate the run: no user config, no auto-update, no network install of plugins.
export HOME="$scratch/home" XDG_CONFIG_HOME="$scratch/config" XDG_DATA_HOME="$scratch/data" \
  XDG_CACHE_HOME="$scratch/cache" XDG_STATE_HOME="$scratch/state" \
  OPENCODE_DISABLE_AUTOUPDATE=1 OPENCODE_DISABLE_MODELS_FETCH=1 npm_config_registry=http://127.0.0.1:9
mkdir -p "$HOME"
"$bin" generate > "$scratch/opencode.json"
python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$scratch/opencode.json"

old="$here/opencode.json"
python3 - "$old" "$scratch/opencode.json" "$here/operations.txt" <<'PY'
import json, sys
old, new, ops_file = sys.argv[1:4]
ops = [l.strip() for l in open(ops_file) if l.strip() and not l.startswith("#")]
def index(path):
    try:
        spec = json.load(open(path))
    except FileNotFoundError:
        return {}
    out = {}
    for p, item in spec.get("paths", {}).items():
        for m, op in item.items():
            if isinstance(op, dict) and "operationId" in op:
                out[op["operationId"]] = (m.upper(), p, json.dumps(op, sort_keys=True))
    return out
a, b = index(old), index(new)
changed = False
for op in ops:
    if op not in b:
        print(f"REMOVED  {op} (build.rs will fail until it leaves operations.txt)"); changed = True
    elif op not in a:
        print(f"ADDED    {op} {b[op][0]} {b[op][1]}"); changed = True
    elif a[op] != b[op]:
        what = "path/method" if a[op][:2] != b[op][:2] else "parameters/bodies"
        print(f"CHANGED  {op} ({what}) {b[op][0]} {b[op][1]}"); changed = True
if not changed:
    print("no change in the operations we generate")
print(f"operations in the new spec: {len(b)} (was {len(a)})")
PY

cp "$scratch/opencode.json" "$old"
echo "$version" > "$here/OPENCODE_VERSION"
echo "openapi/ now describes opencode-ai $version; run cargo build && cargo test" >&2
