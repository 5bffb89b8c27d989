#!/usr/bin/env node
// Launcher for the native opencode-mcp binary, which npm installs as the optional dependency
// matching this machine (opencode-mcp-gateway-<platform>-<arch>), the pattern esbuild and biome
// use. It runs the binary with stdio inherited untouched (stdout is the MCP channel: this file
// never writes to it), forwards termination signals, and exits as the binary did.
"use strict";

const { spawn } = require("node:child_process");
const os = require("node:os");
const path = require("node:path");

const manifest = require("../package.json");
const WRAPPER = manifest.name;
// The platforms published, from the optional dependencies npm/pack.sh wrote (one per entry of
// npm/platforms.json): `opencode-mcp-gateway-linux-x64` -> `linux-x64`.
const PLATFORMS = Object.keys(manifest.optionalDependencies || {}).map((name) =>
  name.slice(WRAPPER.length + 1),
);

function fail(lines) {
  process.stderr.write(lines.map((l) => `${WRAPPER}: ${l}\n`).join(""));
  process.exit(1);
}

/** Whether Node runs on glibc (its diagnostic report names the glibc version when it does). */
function glibc() {
  try {
    return Boolean(process.report.getReport().header.glibcVersionRuntime);
  } catch (e) {
    return true; // Cannot tell: do not send a glibc user down the musl path.
  }
}

const platform = `${process.platform}-${process.arch}`;
const pkg = `${WRAPPER}-${platform}`;

if (!PLATFORMS.includes(platform)) {
  fail([
    `no opencode-mcp binary is published for ${platform}.`,
    `Published: ${PLATFORMS.join(", ")}.` +
      (process.platform === "win32"
        ? " Windows is not supported: the gateway supervises OpenCode with Unix process groups" +
          " and signals. Use WSL, where the linux package applies."
        : " Build it from source with Rust: `cargo install --locked --path .` in a clone of the" +
          " opencode-mcp repository."),
  ]);
}

let bin;
try {
  bin = path.join(path.dirname(require.resolve(`${pkg}/package.json`)), "bin", "opencode-mcp");
} catch (e) {
  // The linux packages are glibc builds (`"libc": ["glibc"]`), so npm skips them on musl
  // systems such as Alpine: say that rather than blame omitted optional dependencies.
  if (process.platform === "linux" && !glibc()) {
    fail([
      `the package ${pkg} is not installed: its binary needs glibc 2.35 or later, and this`,
      `system's C library is not glibc (musl?). Build the binary from source with Rust:`,
      `\`cargo install --locked --path .\` in a clone of the opencode-mcp repository.`,
    ]);
  }
  fail([
    `the package ${pkg}, which holds the opencode-mcp binary for ${platform}, is not installed.`,
    `npm installs it as an optional dependency of ${WRAPPER}; it is missing when optional`,
    `dependencies were omitted (--omit=optional, --no-optional, or npm_config_omit=optional)`,
    `or the install was copied from another platform.`,
    `Fix: reinstall without omitting optional dependencies (npm install ${WRAPPER}),`,
    `or install the binary with Rust: \`cargo install --locked --path .\` in a clone of the`,
    `opencode-mcp repository.`,
  ]);
}

const child = spawn(bin, process.argv.slice(2), { stdio: "inherit" });

// A host stops a server with SIGTERM (or SIGINT/SIGHUP) sent to the process it started, which
// is this launcher: pass it on so the gateway shuts its OpenCode servers down itself. SIGQUIT and
// SIGUSR2 would end the launcher alone and leave the gateway running until stdin closed: they
// are passed on too. (SIGUSR1 is Node's own: it starts the debugger.)
const forwarded = ["SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR2"];
const forward = (signal) => {
  if (child.exitCode === null && child.signalCode === null) child.kill(signal);
};
for (const signal of forwarded) process.on(signal, forward);

child.on("error", (e) => {
  fail([`cannot run ${bin}: ${e.message}`, `Reinstall ${WRAPPER} (and ${pkg}).`]);
});

child.on("exit", (code, signal) => {
  if (signal) {
    // Die of the same signal, so the host sees what it would have seen without the launcher;
    // but never raise a signal Node acts on itself: SIGUSR1 starts its debugger listener (on
    // 127.0.0.1:9229) instead of ending the process, and SIGPIPE is ignored.
    if (signal !== "SIGUSR1" && signal !== "SIGPIPE") {
      for (const s of forwarded) process.removeListener(s, forward);
      process.kill(process.pid, signal);
    }
    // Reached for those, and for any other signal whose default action is not to terminate.
    process.exit(128 + (os.constants.signals[signal] || 0));
  }
  process.exit(code === null ? 1 : code);
});
