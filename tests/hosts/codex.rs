//! The OpenAI Codex CLI as a host: the pinned npm package, an isolated `CODEX_HOME` whose only
//! model provider is a [`FakeResponses`] on 127.0.0.1 and whose one MCP server is the gateway,
//! and `codex exec --json` runs with a bound.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::fake_responses::{Call, FakeResponses};
use crate::support::npm::Install;
use crate::support::{opencode_bin, procs, OpenCodeEnv};

/// The Codex CLI release the suite is pinned to.
pub const CODEX_VERSION: &str = "0.171.0";
/// The Responses `namespace` under which Codex offers the tools of `[mcp_servers.opencode]`.
pub const NAMESPACE: &str = "mcp__opencode";
/// The model slug Codex asks the fake for (any name works with a custom provider; Codex warns
/// that it has no metadata for it and uses its fallback metadata).
pub const MODEL: &str = "fake-codex";
/// The env var holding the dummy API key of the fake provider.
const KEY_VAR: &str = "FAKE_RESPONSES_API_KEY";
/// Where every proxy setting points: a 127.0.0.1 port nothing listens on, so a request that
/// tries to leave the machine fails at once instead of leaving.
const DEAD_PROXY: &str = "http://127.0.0.1:9";

/// A call of one of the gateway's tools, as Codex's model makes it.
pub fn tool(name: &str, arguments: Value) -> Call {
    Call::new(Some(NAMESPACE), name, arguments)
}

/// A call of one of the gateway's tools whose arguments depend on earlier outputs.
pub fn tool_with(
    name: &str,
    arguments: impl Fn(&[crate::support::fake_responses::ToolOutput]) -> Result<Value, String>
        + Send
        + Sync
        + 'static,
) -> Call {
    Call::with(Some(NAMESPACE), name, arguments)
}

/// The native `codex` executable of the pinned npm package, installed under the target dir on
/// first use. The package's `bin/codex.js` only finds and execs this binary, which comes in a
/// per-platform optional dependency (`@openai/codex-<platform>`); running it directly keeps
/// node out of the process tree the test inspects.
pub fn codex_bin() -> PathBuf {
    static BIN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BIN.get_or_init(install).clone()
}

fn install() -> PathBuf {
    let (platform, triple) = platform();
    Install {
        package: "@openai/codex",
        version: CODEX_VERSION,
        dir_name: &format!("codex-{CODEX_VERSION}"),
        skip_hint: "install it there yourself with npm (the native binary comes in the optional \
                    dependency @openai/codex-<platform>, so do not pass --omit=optional)",
    }
    .ensure(|dir| {
        let bin = dir
            .join("node_modules/@openai")
            .join(format!("codex-{platform}"))
            .join("vendor")
            .join(triple)
            .join("bin/codex");
        if !bin.is_file() {
            return Err(format!("{} is missing", bin.display()));
        }
        let out = Command::new(&bin)
            .arg("--version")
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("{} does not run: {e}", bin.display()))?;
        let text = String::from_utf8_lossy(&out.stdout);
        if text.trim() == format!("codex-cli {CODEX_VERSION}") {
            Ok(bin)
        } else {
            Err(format!("{} says {:?}", bin.display(), text.trim()))
        }
    })
}

/// The npm platform suffix and Rust target triple of this machine's Codex build.
fn platform() -> (&'static str, &'static str) {
    match (std::env::consts::OS, std::env::consts::ARCH) {
        ("linux", "x86_64") => ("linux-x64", "x86_64-unknown-linux-musl"),
        ("linux", "aarch64") => ("linux-arm64", "aarch64-unknown-linux-musl"),
        ("macos", "x86_64") => ("darwin-x64", "x86_64-apple-darwin"),
        ("macos", "aarch64") => ("darwin-arm64", "aarch64-apple-darwin"),
        (os, arch) => panic!("no Codex build for {os}/{arch} in @openai/codex"),
    }
}

/// How the `[mcp_servers.opencode]` entry is configured.
#[derive(Default)]
pub struct ServerOptions {
    /// `default_tools_approval_mode`, or none to leave Codex's default.
    pub approval_mode: Option<&'static str>,
    /// A file the gateway's stderr is appended to (Codex keeps an MCP server's stderr to
    /// itself): the gateway runs under `sh`, which redirects it and `exec`s the gateway.
    pub gateway_log: Option<PathBuf>,
}

/// An isolated Codex home: `CODEX_HOME` (the config and everything Codex writes) and `HOME`.
pub struct CodexHome {
    dir: tempfile::TempDir,
}

impl CodexHome {
    /// Writes `config.toml`: the fake as the only model provider, nothing networked, and the
    /// gateway as MCP server `opencode` with `gateway_env` as its environment (Codex passes an
    /// MCP server only a few variables of its own, so the env table must hold all of them).
    /// Plugins and apps are off: at startup Codex 0.171.0 otherwise syncs a curated plugin
    /// repository from the network (refused here by the dead proxy, but logged as failures).
    /// Retries are off so that a bad answer of the fake fails the run at once.
    pub fn new(
        fake: &FakeResponses,
        gateway_env: &[(String, String)],
        opts: ServerOptions,
    ) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("codex-home-")
            .tempdir()
            .expect("create a temp CODEX_HOME");
        std::fs::create_dir_all(dir.path().join("home")).expect("create the temp HOME");
        let s = |v: &str| Value::String(v.to_owned()).to_string(); // a TOML basic string
        let mut toml = String::new();
        toml.push_str(&format!(
            "model = {model}\nmodel_provider = \"fake\"\napproval_policy = \"never\"\n\
             sandbox_mode = \"read-only\"\ncheck_for_update_on_startup = false\n\n\
             [analytics]\nenabled = false\n\n[feedback]\nenabled = false\n\n\
             [features]\nplugins = false\nremote_plugin = false\napps = false\n\n\
             [model_providers.fake]\nname = \"Fake Responses\"\nbase_url = {url}\n\
             wire_api = \"responses\"\nenv_key = {key}\nrequest_max_retries = 0\n\
             stream_max_retries = 0\n\n",
            model = s(MODEL),
            url = s(&fake.url()),
            key = s(KEY_VAR),
        ));
        let gateway = env!("CARGO_BIN_EXE_opencode-mcp");
        match &opts.gateway_log {
            None => toml.push_str(&format!(
                "[mcp_servers.opencode]\ncommand = {}\n",
                s(gateway)
            )),
            Some(log) => toml.push_str(&format!(
                "[mcp_servers.opencode]\ncommand = \"/bin/sh\"\nargs = [{}, {}, {}, {}]\n",
                s("-c"),
                s("exec \"$0\" 2>>\"$1\""),
                s(gateway),
                s(&log.display().to_string())
            )),
        }
        if let Some(mode) = opts.approval_mode {
            toml.push_str(&format!("default_tools_approval_mode = {}\n", s(mode)));
        }
        toml.push_str("\n[mcp_servers.opencode.env]\n");
        for (k, v) in gateway_env {
            toml.push_str(&format!("{} = {}\n", s(k), s(v)));
        }
        std::fs::write(dir.path().join("config.toml"), toml).expect("write config.toml");
        CodexHome { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// The gateway's environment under Codex: the OpenCode isolation of `env` (the fake LLM as the
/// only provider), the pinned OpenCode binary, and `PATH`.
pub fn gateway_env(env: &OpenCodeEnv, fake_llm_url: &str) -> Vec<(String, String)> {
    let mut vars = env.vars(fake_llm_url);
    vars.push((
        "OPENCODE_MCP_OPENCODE__COMMAND".into(),
        opencode_bin().display().to_string(),
    ));
    if let Ok(path) = std::env::var("PATH") {
        vars.push(("PATH".into(), path));
    }
    vars
}

/// What one `codex exec` run left.
pub struct ExecRun {
    pub status: std::process::ExitStatus,
    /// The `--json` events (one JSON object a line).
    pub events: Vec<Value>,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

impl ExecRun {
    /// A failure message with everything Codex said.
    pub fn describe(&self) -> String {
        format!(
            "codex exec ended {} after {:?}\n--- stdout\n{}\n--- stderr\n{}",
            self.status, self.elapsed, self.stdout, self.stderr
        )
    }

    /// Codex exited 0 and the fake API could compute every step's arguments; `context` is what a
    /// failure shows besides the errors.
    pub fn assert_scripted(&self, fake: &FakeResponses, context: &str) {
        assert!(self.status.success(), "{context}");
        assert!(
            fake.script_errors().is_empty(),
            "{:?}\n{context}",
            fake.script_errors()
        );
    }
}

/// Runs `codex exec --json <prompt>` in `work_dir` with only the variables it needs (no inherited
/// credentials, every proxy pointing at a dead 127.0.0.1 port), and waits at most `within`;
/// past that Codex is killed and the test fails.
pub fn exec(home: &CodexHome, work_dir: &Path, prompt: &str, within: Duration) -> ExecRun {
    let mut cmd = Command::new(codex_bin());
    cmd.env_clear();
    if let Some(path) = std::env::var_os("PATH") {
        cmd.env("PATH", path);
    }
    cmd.env("HOME", home.path().join("home"))
        .env("CODEX_HOME", home.path())
        .env(KEY_VAR, "dummy-key")
        .env("RUST_LOG", "warn");
    for var in [
        "HTTPS_PROXY",
        "HTTP_PROXY",
        "ALL_PROXY",
        "https_proxy",
        "http_proxy",
        "all_proxy",
    ] {
        cmd.env(var, DEAD_PROXY);
    }
    cmd.env("NO_PROXY", "127.0.0.1,localhost")
        .env("no_proxy", "127.0.0.1,localhost");
    cmd.args([
        "exec",
        "--json",
        "--skip-git-repo-check",
        "--color",
        "never",
    ])
    .arg(prompt)
    .current_dir(work_dir)
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let start = Instant::now();
    let child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", codex_bin().display()));
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let output = match rx.recv_timeout(within) {
        Ok(output) => output.expect("wait for codex"),
        Err(_) => {
            // Kill it (by pid: the waiting thread owns the Child) and report what it printed.
            let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
            let output = rx
                .recv_timeout(Duration::from_secs(10))
                .expect("codex did not end after SIGKILL")
                .expect("wait for codex");
            panic!(
                "codex exec did not finish within {within:?}; killed.\n--- stdout\n{}\n--- stderr\n{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
        }
    };
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let events = stdout
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    ExecRun {
        status: output.status,
        events,
        stdout,
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        elapsed: start.elapsed(),
    }
}

/// Live processes whose `XDG_DATA_HOME` is `data_home`. Under an [`OpenCodeEnv`] that is the
/// gateway and the OpenCode it started (the gateway passes its environment on), and nothing
/// else on the machine.
pub fn processes_with_data_home(data_home: &str) -> BTreeSet<u32> {
    procs::all()
        .into_iter()
        .filter(|p| p.is_live())
        .filter(|p| procs::env_var(p.pid, "XDG_DATA_HOME").as_deref() == Some(data_home))
        .map(|p| p.pid)
        .collect()
}

/// The `XDG_DATA_HOME` that [`OpenCodeEnv::vars`] sets.
pub fn data_home(env: &OpenCodeEnv) -> String {
    env.root().join("data").display().to_string()
}

/// Polls (bounded) until no process of `env` is left; returns how long that took, or the
/// survivors. There is no event for the exit of a process that is not our child.
pub fn wait_none_left(env: &OpenCodeEnv, within: Duration) -> Result<Duration, BTreeSet<u32>> {
    let data_home = data_home(env);
    let start = Instant::now();
    loop {
        let left = processes_with_data_home(&data_home);
        if left.is_empty() {
            return Ok(start.elapsed());
        }
        if start.elapsed() > within {
            return Err(left);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The text Codex put in front of its model for a tool result, without the `Wall time: …
/// Output:` header Codex puts before it. Codex sends a plain string for a result with
/// `structuredContent` and a list of `input_text` items (header first) for one without.
pub fn shown_text(output: &crate::support::fake_responses::ToolOutput) -> String {
    let strip = |text: &str| -> Option<String> {
        let rest = text.strip_prefix("Wall time: ")?;
        let (_, after) = rest.split_once("\nOutput:")?;
        Some(after.strip_prefix('\n').unwrap_or(after).to_owned())
    };
    match &output.output {
        Value::String(text) => strip(text).unwrap_or_else(|| text.clone()),
        Value::Array(items) => {
            let texts: Vec<&str> = items
                .iter()
                .filter_map(|i| i.get("text").and_then(Value::as_str))
                .collect();
            match texts.split_first() {
                Some((first, rest)) if strip(first).is_some_and(|s| s.is_empty()) => {
                    rest.join("\n")
                }
                _ => texts.join("\n"),
            }
        }
        _ => output.text(),
    }
}

/// Parses a shown tool result as JSON, or says what it was.
pub fn shown_json(output: &crate::support::fake_responses::ToolOutput) -> Result<Value, String> {
    let text = shown_text(output);
    serde_json::from_str(&text)
        .map_err(|e| format!("{} output is not JSON ({e}): {text}", output.name))
}
