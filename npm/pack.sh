#!/usr/bin/env bash
# Packs opencode-mcp for npm, as tarballs `npm publish` takes:
#
#   bash npm/pack.sh
#
# writes to target/npm/ (under $CARGO_TARGET_DIR when set)
#   opencode-mcp-gateway-<version>.tgz             the wrapper: bin/ launcher, one optional
#                                                  dependency per platform in npm/platforms.json
#   opencode-mcp-gateway-<platform>-<version>.tgz  the binary for one platform
# and prints their paths on stdout, wrapper first. The version is Cargo.toml's.
#
# By default it builds this machine's binary (`cargo build --release`; on Linux with glibc, the
# static build of npm/static-rustflags, as the release workflow makes it). Environment:
#   OPENCODE_MCP_BIN=path         pack this binary instead of building one (tests pass the debug
#                                 binary cargo test built; CI passes a --target build)
#   OPENCODE_MCP_NPM_PLATFORM=p   the platform that binary is for, a key of npm/platforms.json
#                                 (default: this machine's, as Node names it: linux-x64, ...)
#   OPENCODE_MCP_NPM_OUT=dir      where the tarballs go (default: target/npm)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
cd "$root"

die() { echo "npm/pack.sh: $*" >&2; exit 1; }

command -v node >/dev/null && command -v npm >/dev/null \
  || die "needs node and npm on PATH (install Node.js 18 or later, which ships npm)"

# The version: the first `version = "..."` of Cargo.toml's [package] table.
version="$(awk '
  /^\[/ { in_package = ($0 == "[package]") }
  in_package && /^version[ \t]*=/ { gsub(/^version[ \t]*=[ \t]*"|".*$/, ""); print; exit }
' Cargo.toml)"
[[ "$version" =~ ^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]] \
  || die "cannot read a version from Cargo.toml's [package] table (got '${version}')"

host_platform="$(node -p 'process.platform + "-" + process.arch')"
platform="${OPENCODE_MCP_NPM_PLATFORM:-$host_platform}"
node -e '
  const platforms = require(process.argv[1]);
  if (!(process.argv[2] in platforms)) {
    console.error(`npm/pack.sh: no npm package is defined for ${process.argv[2]}; ` +
      `npm/platforms.json has: ${Object.keys(platforms).join(", ")}` +
      (process.argv[2].startsWith("win32") ? " (Windows is unsupported: the gateway supervises " +
        "OpenCode with Unix process groups and signals)" : ""));
    process.exit(1);
  }' "$here/platforms.json" "$platform"

target_dir="${CARGO_TARGET_DIR:-target}"
[[ "$target_dir" = /* ]] || target_dir="$root/$target_dir"
out="${OPENCODE_MCP_NPM_OUT:-$target_dir/npm}"

if [[ -n "${OPENCODE_MCP_BIN:-}" ]]; then
  bin="$OPENCODE_MCP_BIN"
else
  [[ "$platform" = "$host_platform" ]] \
    || die "OPENCODE_MCP_NPM_PLATFORM=$platform is not this machine ($host_platform): build for it and pass OPENCODE_MCP_BIN"
  host_triple="$(rustc -vV | sed -n 's/^host: //p')"
  if [[ "$host_triple" = *-linux-gnu ]]; then
    # Linked statically, as the release workflow builds it (see the README's "Platforms"): no
    # dynamic loader at start, and no minimum glibc on the user's machine. Built for an explicit
    # --target, so that the flags reach only the binary and its dependencies, not the build
    # scripts and proc macros cargo runs here.
    echo "building the static release binary for $host_triple ..." >&2
    RUSTFLAGS="${RUSTFLAGS:-} $(sed '/^#/d' "$here/static-rustflags")" \
      cargo build --release --locked --bin opencode-mcp --target "$host_triple" >&2
    bin="$target_dir/$host_triple/release/opencode-mcp"
  else
    echo "building the release binary (cargo build --release) ..." >&2
    cargo build --release --locked --bin opencode-mcp >&2
    bin="$target_dir/release/opencode-mcp"
  fi
fi
[[ -f "$bin" && -x "$bin" ]] || die "OPENCODE_MCP_BIN=$bin is not an executable file"

# A binary for this machine must be the version being packed (a stale build would be
# published under the wrong version); one for another platform cannot be run here.
if [[ "$platform" = "$host_platform" ]]; then
  reported="$("$bin" --version)" || die "$bin --version failed"
  [[ "$reported" = "opencode-mcp $version "* ]] \
    || die "$bin reports '$reported', but Cargo.toml is at $version: rebuild it"
fi

stage="$out/stage"
rm -rf "$stage"
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/wrapper/bin" "$stage/platform/bin"

# The wrapper: the launcher, the README, and package.json with this version pinned on every
# platform package.
cp "$here/wrapper/bin/opencode-mcp-gateway.js" "$stage/wrapper/bin/"
chmod 755 "$stage/wrapper/bin/opencode-mcp-gateway.js"
cp "$here/wrapper/README.md" "$stage/wrapper/"
# The platform package: the binary, and package.json restricted to its os/cpu (and libc), so
# that npm installs it only where it runs.
cp "$bin" "$stage/platform/bin/opencode-mcp"
chmod 755 "$stage/platform/bin/opencode-mcp"
sed "s/PLATFORM/$platform/g" "$here/platform/README.md" > "$stage/platform/README.md"

node -e '
  const fs = require("node:fs");
  const [here, stage, version, platform] = process.argv.slice(1);
  const platforms = require(`${here}/platforms.json`);
  const read = (p) => JSON.parse(fs.readFileSync(p, "utf8"));
  const write = (p, v) => fs.writeFileSync(p, JSON.stringify(v, null, 2) + "\n");

  const wrapper = read(`${here}/wrapper/package.json`);
  wrapper.version = version;
  wrapper.optionalDependencies = {};
  for (const p of Object.keys(platforms)) wrapper.optionalDependencies[`${wrapper.name}-${p}`] = version;
  write(`${stage}/wrapper/package.json`, wrapper);

  const spec = platforms[platform];
  const pkg = JSON.parse(fs.readFileSync(`${here}/platform/package.json`, "utf8").replaceAll("PLATFORM", platform));
  pkg.version = version;
  pkg.os = [spec.os];
  pkg.cpu = [spec.cpu];
  if (spec.libc) pkg.libc = [spec.libc];
  write(`${stage}/platform/package.json`, pkg);
' "$here" "$stage" "$version" "$platform"

mkdir -p "$out"
for dir in wrapper platform; do
  name="$(node -p 'require(process.argv[1]).name' "$stage/$dir/package.json")"
  (cd "$stage/$dir" && npm pack --silent --pack-destination "$out" >/dev/null) \
    || die "npm pack failed in $stage/$dir"
  tarball="$out/$name-$version.tgz"
  [[ -f "$tarball" ]] || die "npm pack did not write $tarball"
  echo "$tarball"
done
