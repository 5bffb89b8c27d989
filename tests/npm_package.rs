//! The npm distribution, end to end: `npm/pack.sh` packs the debug binary this test run built,
//! npm installs the two tarballs into a temporary prefix (offline, with an empty cache: nothing
//! comes from the registry), and the installed launcher is driven as a host drives it:
//!
//! - `--version` through the launcher, and `npx` from the same tarballs;
//! - an MCP `initialize` over the launcher's stdio, every stdout line JSON-RPC, exit 0 when stdin
//!   closes;
//! - SIGTERM sent to the launcher reaches the gateway (which exits 0 on it), and so do SIGQUIT and
//!   SIGUSR2; a gateway dead of SIGUSR1 does not make the launcher start Node's debugger; a
//!   non-zero exit code of the gateway comes back unchanged;
//! - with the platform package removed, the launcher exits non-zero naming the package, the
//!   platform and the fixes, with nothing on stdout.
//!
//! Also: the binary is linked at a fixed address (not position-independent) on Linux.
//!
//! Needs `node` and `npm` on `PATH`; fails saying so when they are missing.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{json, Value};

/// The wrapper package's name on the npm registry (and its main command).
const PACKAGE: &str = "opencode-mcp-gateway";
/// The bound on any single wait for the gateway (startup, an answer, an exit).
const TIMEOUT: Duration = Duration::from_secs(30);

/// A temp tree: `out/` (tarballs), `prefix/` (the npm install), `cache/` (npm's, empty), `home/`
/// with the XDG dirs, and `cwd/` (where the gateway runs: no repository `delegation.yaml`).
struct Tree {
    root: tempfile::TempDir,
}

impl Tree {
    fn new() -> Self {
        let root = tempfile::Builder::new()
            .prefix("opencode-mcp-npm-")
            .tempdir()
            .expect("create a temp dir");
        for sub in ["out", "prefix", "cache", "home", "cwd"] {
            std::fs::create_dir_all(root.path().join(sub)).expect("create a temp subdir");
        }
        Tree { root }
    }

    fn path(&self, sub: &str) -> PathBuf {
        self.root.path().join(sub)
    }

    /// `cmd` with only `PATH` inherited and everything npm or the gateway might read or write
    /// pointed into the tree.
    fn isolate<'a>(&self, cmd: &'a mut Command) -> &'a mut Command {
        let home = self.path("home");
        cmd.env_clear()
            // Under coverage (see CONTRIBUTING.md) the packaged binary writes its counts there.
            .envs(std::env::var_os("LLVM_PROFILE_FILE").map(|v| ("LLVM_PROFILE_FILE", v)))
            .current_dir(self.path("cwd"))
            .env("HOME", &home)
            .env("XDG_CONFIG_HOME", home.join(".config"))
            .env("XDG_STATE_HOME", home.join(".local/state"))
            .env("XDG_DATA_HOME", home.join(".local/share"))
            .env("XDG_CACHE_HOME", home.join(".cache"))
            .env("npm_config_cache", self.path("cache"))
            .env("npm_config_update_notifier", "false");
        if let Some(path) = std::env::var_os("PATH") {
            cmd.env("PATH", path);
        }
        cmd
    }

    /// The installed launcher (`node_modules/.bin/opencode-mcp-gateway`), isolated.
    fn launcher(&self) -> Command {
        let mut cmd = Command::new(self.path("prefix/node_modules/.bin").join(PACKAGE));
        self.isolate(&mut cmd);
        cmd
    }
}

fn run(cmd: &mut Command, what: &str) -> Output {
    cmd.stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Node's name for this machine (`linux-x64`, ...), which names the platform package. Fails
/// with how to get Node when it is missing.
fn node_platform() -> String {
    let out = Command::new("node")
        .args(["-p", "process.platform + '-' + process.arch"])
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run node ({e}): this test needs Node.js 18 or later with npm on PATH \
                 (your OS's nodejs and npm packages, or https://nodejs.org)"
            )
        });
    assert!(
        out.status.success(),
        "node -p failed: {}",
        text(&out.stderr)
    );
    text(&out.stdout).trim().to_owned()
}

/// Waits for `child` to exit, at most [`TIMEOUT`] (a thread waits, the channel bounds it).
fn wait_bounded(mut child: Child, what: &str) -> ExitStatus {
    let (tx, rx) = mpsc::channel();
    let pid = child.id();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait());
    });
    match rx.recv_timeout(TIMEOUT) {
        Ok(status) => status.unwrap_or_else(|e| panic!("waiting for {what}: {e}")),
        Err(_) => {
            // SAFETY: kill(2) on a child we spawned, so that a failed test leaves nothing behind.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            panic!("{what} did not exit within {TIMEOUT:?}")
        }
    }
}

/// The launcher started with piped stdio and `initialize` answered; stdin is kept open, so only
/// a signal ends the session.
fn initialized(tree: &Tree) -> (Child, std::process::ChildStdin, Lines) {
    let mut child = tree
        .launcher()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the launcher");
    let mut stdin = child.stdin.take().expect("stdin");
    let lines = Lines::new(child.stdout.take().expect("stdout"));
    writeln!(stdin, "{}", initialize_request()).expect("write initialize");
    stdin.flush().expect("flush");
    assert_initialize_result(&lines.next("answer to initialize").expect("stdout closed"));
    (child, stdin, lines)
}

/// [`wait_bounded`], with the child's stderr read to its end.
fn wait_output(mut child: Child, what: &str) -> Output {
    let mut stderr = child.stderr.take().expect("stderr piped");
    let reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = stderr.read_to_end(&mut buf);
        buf
    });
    let status = wait_bounded(child, what);
    let stderr = reader.join().unwrap_or_default();
    Output {
        status,
        stdout: Vec::new(),
        stderr,
    }
}

/// The one child process of `parent` (from `/proc`), if any.
fn child_of(parent: u32) -> Option<u32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let (_, rest) = stat.rsplit_once(") ")?;
        let ppid: u32 = rest.split_whitespace().nth(1)?.parse().ok()?;
        (ppid == parent).then_some(pid)
    })
}

/// The gateway's stdout, one line at a time, each wait bounded by [`TIMEOUT`].
struct Lines {
    rx: mpsc::Receiver<std::io::Result<String>>,
}

impl Lines {
    fn new(stdout: impl Read + Send + 'static) -> Self {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Lines { rx }
    }

    /// The next line, or `None` at end of file.
    fn next(&self, what: &str) -> Option<String> {
        match self.rx.recv_timeout(TIMEOUT) {
            Ok(line) => Some(line.unwrap_or_else(|e| panic!("reading {what}: {e}"))),
            Err(mpsc::RecvTimeoutError::Disconnected) => None,
            Err(mpsc::RecvTimeoutError::Timeout) => panic!("no {what} within {TIMEOUT:?}"),
        }
    }

    /// Every line up to end of file.
    fn rest(&self, what: &str) -> Vec<String> {
        std::iter::from_fn(|| self.next(what)).collect()
    }
}

fn initialize_request() -> String {
    json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "npm-test", "version": "0"}}})
    .to_string()
}

/// Asserts `line` is the answer to [`initialize_request`] from this gateway.
fn assert_initialize_result(line: &str) {
    let msg: Value = serde_json::from_str(line)
        .unwrap_or_else(|e| panic!("first stdout line is not JSON ({e}): {line}"));
    assert_eq!(msg["jsonrpc"], "2.0", "{line}");
    assert_eq!(msg["id"], 1, "{line}");
    assert_eq!(
        msg["result"]["serverInfo"]["name"], "opencode-mcp",
        "{line}"
    );
    assert_eq!(
        msg["result"]["serverInfo"]["version"],
        env!("CARGO_PKG_VERSION"),
        "{line}"
    );
}

/// Asserts every line is a JSON-RPC 2.0 response or notification.
fn assert_json_rpc(lines: &[String]) {
    for line in lines {
        let msg: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("stdout line is not JSON ({e}): {line}"));
        assert_eq!(msg["jsonrpc"], "2.0", "{line}");
        let response =
            msg.get("id").is_some() && (msg.get("result").is_some() != msg.get("error").is_some());
        assert!(
            response || msg.get("method").is_some(),
            "not JSON-RPC: {line}"
        );
    }
}

/// `bash npm/pack.sh` with the debug binary; returns the tarballs it printed.
fn pack(tree: &Tree) -> Vec<PathBuf> {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = run(
        Command::new("bash")
            .arg(manifest.join("npm/pack.sh"))
            .env("OPENCODE_MCP_BIN", env!("CARGO_BIN_EXE_opencode-mcp"))
            .env("OPENCODE_MCP_NPM_OUT", tree.path("out"))
            .env("npm_config_cache", tree.path("cache"))
            .env_remove("OPENCODE_MCP_NPM_PLATFORM"),
        "bash npm/pack.sh",
    );
    assert!(
        out.status.success(),
        "npm/pack.sh failed ({}):\n{}",
        out.status,
        text(&out.stderr)
    );
    let tarballs: Vec<PathBuf> = text(&out.stdout).lines().map(PathBuf::from).collect();
    let version = env!("CARGO_PKG_VERSION");
    let platform = node_platform();
    assert_eq!(
        tarballs,
        [
            tree.path("out").join(format!("{PACKAGE}-{version}.tgz")),
            tree.path("out")
                .join(format!("{PACKAGE}-{platform}-{version}.tgz")),
        ],
        "npm/pack.sh's stdout"
    );
    for t in &tarballs {
        assert!(t.is_file(), "{} was not written", t.display());
    }
    tarballs
}

#[test]
fn npm_package_installs_offline_and_serves_mcp_through_the_launcher() {
    let platform = node_platform();
    let tree = Tree::new();
    let tarballs = pack(&tree);

    // Install from the tarballs alone: `--offline` with an empty cache fails on anything that
    // would need the registry (the other platforms' optional packages are skipped).
    let mut install = Command::new("npm");
    tree.isolate(&mut install)
        .arg("install")
        .arg("--prefix")
        .arg(tree.path("prefix"))
        .args(["--offline", "--no-audit", "--no-fund"])
        .args(&tarballs);
    let out = run(&mut install, "npm install");
    assert!(
        out.status.success(),
        "npm install --offline of the tarballs failed ({}):\n{}\n{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );

    // 1. --version through the launcher.
    let expected_version = format!(
        "opencode-mcp {} (OpenCode API {})",
        env!("CARGO_PKG_VERSION"),
        opencode_mcp::OPENCODE_API_VERSION
    );
    let out = run(tree.launcher().arg("--version"), "the launcher");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim_end(), expected_version);

    // ... and through npx, as `npx -y opencode-mcp-gateway` runs it.
    let mut npx = Command::new("npx");
    tree.isolate(&mut npx)
        .args(["-y", "--offline"])
        .arg("--package")
        .arg(&tarballs[0])
        .arg("--package")
        .arg(&tarballs[1])
        .args(["--", PACKAGE, "--version"]);
    let out = run(&mut npx, "npx");
    assert!(out.status.success(), "npx: {}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim_end(), expected_version);

    // 2. MCP over the launcher's stdio; stdout carries JSON-RPC and nothing else.
    let (child, mut stdin, lines) = initialized(&tree);
    for msg in [
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
    ] {
        writeln!(stdin, "{msg}").expect("write a request");
    }
    drop(stdin);
    let rest = lines.rest("stdout after initialize");
    assert_json_rpc(&rest);
    assert!(
        rest.iter().any(|l| l.contains("\"id\":2")),
        "no tools/list answer: {rest:?}"
    );
    let out = wait_output(child, "the launcher after stdin closed");
    assert_eq!(out.status.code(), Some(0), "stderr:\n{}", text(&out.stderr));

    // 3. SIGTERM to the launcher reaches the gateway. stdin stays open, so only the signal can
    // end the session; the gateway exits 0 on it, and the launcher with the gateway's code. A
    // launcher that did not forward would die of the signal itself and leave the gateway
    // holding stdout open.
    let (child, stdin, lines) = initialized(&tree);
    // SAFETY: kill(2) on our own child's pid with a valid signal.
    let sent = unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    assert_eq!(sent, 0, "kill(SIGTERM)");
    assert_json_rpc(&lines.rest("stdout after SIGTERM"));
    let status = wait_output(child, "the launcher after SIGTERM").status;
    assert_eq!(status.code(), Some(0), "launcher status after SIGTERM");
    drop(stdin);

    // 3b. SIGQUIT and SIGUSR2 to the launcher reach the gateway too (neither is one it
    // handles: it dies of it, and the launcher of the same). A launcher that did not forward
    // them died alone and left the gateway holding stdout until stdin closed.
    for (signal, name) in [(libc::SIGQUIT, "SIGQUIT"), (libc::SIGUSR2, "SIGUSR2")] {
        let (child, stdin, lines) = initialized(&tree);
        // SAFETY: kill(2) on our own child's pid with a valid signal.
        let sent = unsafe { libc::kill(child.id() as libc::pid_t, signal) };
        assert_eq!(sent, 0, "kill({name})");
        // End of file on stdout while stdin is still open: the gateway is gone too.
        assert_json_rpc(&lines.rest(&format!("stdout after {name}")));
        let status = wait_output(child, &format!("the launcher after {name}")).status;
        assert_eq!(
            status.signal(),
            Some(signal),
            "launcher status after {name}"
        );
        drop(stdin);
    }

    // 3c. A gateway that dies of SIGUSR1 (which Node reserves for its debugger) ends the
    // launcher with 128 + 10, without raising SIGUSR1 at itself: that started Node's debugger
    // listener on 127.0.0.1:9229 before the launcher exited.
    let (child, stdin, lines) = initialized(&tree);
    let gateway = child_of(child.id()).expect("the launcher runs the gateway");
    // SAFETY: kill(2) on the gateway the launcher spawned for this test.
    let sent = unsafe { libc::kill(gateway as libc::pid_t, libc::SIGUSR1) };
    assert_eq!(sent, 0, "kill(SIGUSR1)");
    assert_json_rpc(&lines.rest("stdout after SIGUSR1"));
    let output = wait_output(child, "the launcher after its gateway's SIGUSR1");
    let err = text(&output.stderr);
    assert_eq!(output.status.code(), Some(128 + libc::SIGUSR1), "{err}");
    assert!(!err.contains("Debugger listening"), "{err}");
    drop(stdin);

    // 4. The gateway's own exit code comes back unchanged (clap's 2 for a bad flag, which the
    // launcher's own failures never use).
    let out = run(tree.launcher().arg("--no-such-flag"), "the launcher");
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("--no-such-flag"));

    // 5. Without the platform package: a clear message, non-zero, nothing on stdout.
    let platform_package = format!("{PACKAGE}-{platform}");
    let installed = tree.path("prefix/node_modules").join(&platform_package);
    assert!(installed.is_dir(), "{} not installed", installed.display());
    std::fs::remove_dir_all(&installed).expect("remove the platform package");
    let out = run(tree.launcher().arg("--version"), "the launcher");
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(out.stdout.is_empty(), "stdout: {}", text(&out.stdout));
    for fragment in [
        platform_package.as_str(),
        platform.as_str(),
        "is not installed",
        "--omit=optional",
        "npm install opencode-mcp-gateway",
        "cargo install",
    ] {
        assert!(err.contains(fragment), "stderr lacks {fragment:?}:\n{err}");
    }
}

/// The binary npm ships is the one `build.rs` links at a fixed address on Linux (`-no-pie`):
/// a position-independent one would make the dynamic loader write every page of its
/// `.data.rel.ro` at each start (see `link_fixed_address` in build.rs). ELF's `e_type`, at byte
/// 16, is 2 (`ET_EXEC`) for a fixed-address executable and 3 (`ET_DYN`) for a
/// position-independent one.
#[test]
#[cfg(target_os = "linux")]
fn the_binary_is_linked_at_a_fixed_address() {
    let bin = env!("CARGO_BIN_EXE_opencode-mcp");
    let bytes = std::fs::read(bin).unwrap_or_else(|e| panic!("cannot read {bin}: {e}"));
    assert_eq!(&bytes[..4], b"\x7fELF", "{bin} is not an ELF file");
    let e_type = u16::from_le_bytes([bytes[16], bytes[17]]);
    assert_eq!(
        e_type, 2,
        "{bin} has ELF type {e_type}: not a fixed-address executable (3 is position-independent)"
    );
}
