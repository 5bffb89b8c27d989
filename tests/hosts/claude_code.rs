//! Running the real Claude Code headless against the gateway, with every model API faked on
//! 127.0.0.1: Claude Code talks to a [`FakeAnthropic`] (scripted tool calls), and the OpenCode
//! behind the gateway to a [`FakeLlm`].
//!
//! Claude Code is the pinned npm `@anthropic-ai/claude-code`, installed under the target dir on
//! first use. The package ships its native executable in a per-platform optional dependency
//! (`@anthropic-ai/claude-code-<os>-<arch>[-musl]`, file `claude`); that is what runs, so that the
//! postinstall step (which only copies it over `bin/claude.exe`) does not matter.
//!
//! Isolation: Claude Code gets an empty environment plus a temp `HOME`/`CLAUDE_CONFIG_DIR`, the
//! fake's URL and a dummy key, its non-essential traffic, telemetry, error reporting and
//! auto-updater switched off, the official plugin marketplace not installed, and a proxy on a
//! closed 127.0.0.1 port for anything that would still try to leave the machine. Every run's
//! debug log is checked for the traces of an attempt that bypasses the proxy ([`stayed_local`]).
//! The gateway it starts gets the [`OpenCodeEnv`] isolation.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};

use crate::support::fake_anthropic::FakeAnthropic;
use crate::support::npm::Install;
use crate::support::tmux::Tmux;
use crate::support::{opencode_bin, procs, FakeLlm, OpenCodeEnv};

/// The API key Claude Code sends the fake API (and approves in an interactive run's config).
const API_KEY: &str = "test";

/// The Claude Code release of the `initialize` era the suite is pinned to.
pub const CLAUDE_CODE: &str = "2.1.197";

/// The Claude Code release of the protocol 2026-07-28 era (`server/discover`, per-request
/// `_meta`, `subscriptions/listen`, native MCP tasks) the suite is pinned to; npm's latest on
/// 2026-12-01.
pub const CLAUDE_CODE_2026: &str = "2.1.332";

/// Names another Claude Code release to run the 2026-07-28-era tests against (installed under
/// the target dir on first use like the pinned one), e.g. the one npm serves today.
pub const VERSION_VAR: &str = "TEST_CLAUDE_CODE_VERSION";

/// The release the 2026-07-28-era tests run: [`VERSION_VAR`] if set, else [`CLAUDE_CODE_2026`].
pub fn current_release() -> String {
    std::env::var(VERSION_VAR)
        .ok()
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| CLAUDE_CODE_2026.to_string())
}

/// The MCP server name in the generated `--mcp-config`: Claude Code names the tools
/// `mcp__opencode__<tool>`.
pub const SERVER: &str = "opencode";

/// Tool `name` of the gateway as Claude Code's model sees it.
pub fn tool(name: &str) -> String {
    format!("mcp__{SERVER}__{name}")
}

/// The executable of Claude Code `version`, installed on first use.
pub fn claude_bin(version: &str) -> PathBuf {
    Install {
        package: "@anthropic-ai/claude-code",
        version,
        dir_name: &format!("claude-code-{version}"),
        skip_hint: &format!(
            "install it there yourself: npm install --prefix <target dir>/claude-code-{version} \
             @anthropic-ai/claude-code@{version} (the per-platform optional dependency must \
             not be omitted)"
        ),
    }
    .ensure(|dir| {
        let bin = native_binary(dir)?;
        let output = Command::new(&bin)
            .arg("--version")
            .env_clear()
            .env("HOME", dir)
            .env("DISABLE_AUTOUPDATER", "1")
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run {}: {e}", bin.display()))?;
        let printed = String::from_utf8_lossy(&output.stdout);
        if printed.trim_start().starts_with(version) {
            Ok(bin)
        } else {
            Err(format!("{} --version printed {printed:?}", bin.display()))
        }
    })
}

/// `node_modules/@anthropic-ai/claude-code-<platform>/claude` for this machine.
fn native_binary(dir: &Path) -> Result<PathBuf, String> {
    let os = match std::env::consts::OS {
        "macos" => "darwin",
        other => other,
    };
    let arch = match std::env::consts::ARCH {
        "x86_64" => "x64",
        "aarch64" => "arm64",
        other => other,
    };
    let scope = dir.join("node_modules/@anthropic-ai");
    let base = format!("claude-code-{os}-{arch}");
    for name in [base.clone(), format!("{base}-musl")] {
        let bin = scope.join(&name).join("claude");
        if bin.is_file() {
            return Ok(bin);
        }
    }
    Err(format!(
        "no {}/{base}[-musl]/claude: npm did not install the platform package",
        scope.display()
    ))
}

/// What one headless run left behind.
pub struct Run {
    pub output: Output,
    pub elapsed: Duration,
    /// Claude Code's `--debug-file` (MCP traffic and errors, the gateway's stderr).
    pub debug_log: String,
    /// The gateway's stderr (its log; `OPENCODE_MCP_LOG` sets the level).
    pub gateway_log: String,
    /// Every live process seen during the run whose `HOME` was the gateway's isolated home (the
    /// gateway and the OpenCode it started).
    pub seen_pids: BTreeSet<u32>,
}

impl Run {
    /// With `CLAUDE_CODE_DUMP_DIR` set, writes Claude Code's debug log, the gateway's log, stdout
    /// and every request the fake API received there (for studying the traffic; the temp homes
    /// are gone after the test).
    pub fn dump_if_asked(&self, api: &FakeAnthropic) {
        let Some(dir) = std::env::var_os("CLAUDE_CODE_DUMP_DIR") else {
            return;
        };
        let dir = PathBuf::from(dir);
        let requests: Vec<Value> = api
            .requests()
            .iter()
            .map(|r| json!({"summary": r.summary(), "headers": r.headers, "body": r.body}))
            .collect();
        let files = [
            ("claude-debug.log", self.debug_log.clone()),
            ("gateway.log", self.gateway_log.clone()),
            ("stdout.txt", self.stdout()),
            (
                "requests.json",
                serde_json::to_string_pretty(&requests).unwrap_or_default(),
            ),
        ];
        std::fs::create_dir_all(&dir).expect("create CLAUDE_CODE_DUMP_DIR");
        for (name, text) in files {
            std::fs::write(dir.join(name), text).expect("write to CLAUDE_CODE_DUMP_DIR");
        }
    }

    /// Claude Code's JSON result, once it has run the whole script: it exited 0, and the fake
    /// API could answer every step. Panics with the run's output otherwise.
    pub fn summary(&self, api: &FakeAnthropic) -> Value {
        assert!(self.output.status.success(), "{}", self.describe());
        assert_eq!(
            api.script_failures(),
            Vec::<String>::new(),
            "{}",
            self.describe()
        );
        serde_json::from_str(self.stdout().trim())
            .unwrap_or_else(|e| panic!("not Claude Code's JSON result ({e}): {}", self.describe()))
    }

    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.output.stdout).into_owned()
    }

    /// stdout, stderr and the tail of the debug log, for failure messages.
    pub fn describe(&self) -> String {
        let tail = tail(&self.debug_log, 6000);
        format!(
            "status {} after {:?}\nstdout:\n{}\nstderr:\n{}\ndebug log (tail):\n{tail}",
            self.output.status,
            self.elapsed,
            self.stdout(),
            String::from_utf8_lossy(&self.output.stderr)
        )
    }
}

/// One isolated Claude Code with the gateway as its only MCP server.
pub struct ClaudeCode {
    /// Claude Code's own temp home (config, sessions, debug log, MCP config).
    home: tempfile::TempDir,
    /// The gateway's environment: the OpenCode isolation plus the OpenCode binary and `extra`.
    gateway_env: Map<String, Value>,
    /// The directory `claude` (and so the gateway) runs in.
    cwd: PathBuf,
    /// The gateway's isolated `HOME`, to find its processes by.
    gateway_home: String,
    /// More environment for `claude` itself (e.g. `MCP_TOOL_TIMEOUT`).
    pub claude_env: Vec<(String, String)>,
    /// The Claude Code release that runs.
    pub version: String,
}

impl ClaudeCode {
    /// Prepares a home for Claude Code and the gateway's environment (extra `OPENCODE_MCP_*`
    /// settings in `extra`). Both run in `env`'s work dir.
    pub fn new(env: &OpenCodeEnv, fake_llm: &FakeLlm, extra: &[(&str, &str)]) -> Self {
        let home = tempfile::Builder::new()
            .prefix("claude-home-")
            .tempdir()
            .expect("create a temp home for Claude Code");
        let mut gateway_env: Map<String, Value> = env
            .vars(&fake_llm.url())
            .into_iter()
            .map(|(k, v)| (k, Value::String(v)))
            .collect();
        gateway_env.insert(
            "OPENCODE_MCP_OPENCODE__COMMAND".into(),
            Value::String(opencode_bin().display().to_string()),
        );
        for (k, v) in extra {
            gateway_env.insert((*k).into(), Value::String((*v).into()));
        }
        ClaudeCode {
            home,
            gateway_env,
            cwd: env.work_dir(),
            gateway_home: env.home_dir().display().to_string(),
            claude_env: Vec::new(),
            version: CLAUDE_CODE.to_string(),
        }
    }

    /// The same, running Claude Code `version`.
    pub fn with_version(mut self, version: &str) -> Self {
        self.version = version.to_string();
        self
    }

    /// Runs `claude -p <prompt> --output-format json` against `api` with the gateway as its only
    /// MCP server, and waits for it to exit (at most `within`; then it is killed and the test
    /// fails).
    pub fn run(&self, api: &FakeAnthropic, prompt: &str, within: Duration) -> Run {
        let gateway_log = self.gateway_log_file();
        // Claude Code keeps only the first burst of a server's stderr in its debug log, so the
        // gateway's stderr goes to a file: `sh` redirects it and `exec`s the gateway, which so
        // stays the very process Claude Code started (same pid, same signals).
        let server = self.gateway_server(&gateway_log);
        let mut run = self.run_with_server(api, prompt, within, &server);
        run.gateway_log = std::fs::read_to_string(&gateway_log).unwrap_or_default();
        run
    }

    /// The gateway as Claude Code's MCP server: `sh` sends its stderr to `log` and `exec`s it.
    fn gateway_server(&self, log: &Path) -> Value {
        json!({
            "type": "stdio",
            "command": "/bin/sh",
            "args": [
                "-c",
                "exec \"$0\" 2>>\"$1\"",
                env!("CARGO_BIN_EXE_opencode-mcp"),
                log,
            ],
            "env": self.gateway_env,
        })
    }

    /// `claude` with its isolated environment, the MCP config holding `server`, and the debug
    /// log at [`Self::debug_file`]; the caller adds how it runs (headless or interactive).
    fn command(&self, api: &FakeAnthropic, server: &Value) -> Command {
        let bin = claude_bin(&self.version);
        let home = self.home.path();
        let config_dir = home.join(".claude");
        std::fs::create_dir_all(&config_dir).expect("create CLAUDE_CONFIG_DIR");
        let mcp_config = home.join("mcp.json");
        let config = json!({"mcpServers": {SERVER: server}});
        std::fs::write(&mcp_config, config.to_string()).expect("write the MCP config");
        let mut cmd = Command::new(&bin);
        cmd.env_clear();
        if let Some(path) = std::env::var_os("PATH") {
            cmd.env("PATH", path);
        }
        cmd.envs([
            ("HOME", home.display().to_string()),
            ("CLAUDE_CONFIG_DIR", config_dir.display().to_string()),
            ("TMPDIR", home.display().to_string()),
            ("ANTHROPIC_BASE_URL", api.url()),
            ("ANTHROPIC_API_KEY", API_KEY.into()),
            ("DISABLE_TELEMETRY", "1".into()),
            ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1".into()),
            ("DISABLE_AUTOUPDATER", "1".into()),
            ("DISABLE_ERROR_REPORTING", "1".into()),
            // The 2026 releases otherwise install the official plugin marketplace at start: an
            // `ssh git@github.com` probe (which no proxy setting stops) and then a `git clone`.
            (
                "CLAUDE_CODE_DISABLE_OFFICIAL_MARKETPLACE_AUTOINSTALL",
                "1".into(),
            ),
            // Anything that still tries to leave the machine meets a closed port.
            ("HTTPS_PROXY", "http://127.0.0.1:9".into()),
            ("HTTP_PROXY", "http://127.0.0.1:9".into()),
            ("https_proxy", "http://127.0.0.1:9".into()),
            ("http_proxy", "http://127.0.0.1:9".into()),
            ("NO_PROXY", "127.0.0.1,localhost".into()),
            ("no_proxy", "127.0.0.1,localhost".into()),
        ]);
        if self.version == CLAUDE_CODE {
            // The 2025-era release is tested as it was pinned, every tool in every request. The
            // 2026-era releases run with their own defaults, tool search included: the gateway's
            // delegation tools must reach the model as installed (`anthropic/alwaysLoad`).
            cmd.env("ENABLE_TOOL_SEARCH", "false");
        }
        cmd.envs(self.claude_env.iter().map(|(k, v)| (k, v)));
        cmd.arg("--mcp-config")
            .arg(&mcp_config)
            .arg("--strict-mcp-config")
            .args(["--allowedTools", &format!("mcp__{SERVER}")])
            .arg("--debug-file")
            .arg(self.debug_file())
            .current_dir(&self.cwd);
        cmd
    }

    /// Claude Code's debug log (MCP traffic and errors).
    pub fn debug_file(&self) -> PathBuf {
        self.home.path().join("debug.log")
    }

    /// The gateway's stderr, for runs that send it to a file.
    pub fn gateway_log_file(&self) -> PathBuf {
        self.home.path().join("gateway.log")
    }

    /// Starts the interactive CLI in a terminal (tmux) with the gateway as its MCP server, its
    /// first-run screens (theme, API key, folder trust) already answered in its config, as a
    /// user who has run it before. Nothing is typed yet: see [`Interactive`].
    pub fn interactive(&self, api: &FakeAnthropic) -> Interactive {
        let home = self.home.path();
        let config_dir = home.join(".claude");
        std::fs::create_dir_all(&config_dir).expect("create CLAUDE_CONFIG_DIR");
        let cwd = self.cwd.display().to_string();
        let seen = json!({
            "hasCompletedOnboarding": true,
            "lastOnboardingVersion": self.version,
            "theme": "dark",
            "customApiKeyResponses": {"approved": [API_KEY], "rejected": []},
            "projects": {cwd: {
                "hasTrustDialogAccepted": true,
                "hasCompletedProjectOnboarding": true,
                "allowedTools": [],
            }},
        });
        std::fs::write(config_dir.join(".claude.json"), seen.to_string())
            .expect("write Claude Code's config");
        let server = self.gateway_server(&self.gateway_log_file());
        let cmd = self.command(api, &server);
        Interactive {
            tmux: Tmux::start(&cmd),
            debug_file: self.debug_file(),
            gateway_log: self.gateway_log_file(),
        }
    }

    /// [`Self::run`] with another MCP server config (named [`SERVER`]) in place of the gateway.
    pub fn run_with_server(
        &self,
        api: &FakeAnthropic,
        prompt: &str,
        within: Duration,
        server: &Value,
    ) -> Run {
        let bin = claude_bin(&self.version);
        let debug_file = self.debug_file();
        let mut cmd = self.command(api, server);
        cmd.arg("-p")
            .arg(prompt)
            .args(["--output-format", "json"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let started = Instant::now();
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", bin.display()));
        let pid = child.id();
        let (done_tx, done_rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = done_tx.send(child.wait_with_output());
        });
        // While it runs, note the gateway's processes (found by their isolated HOME), so that the
        // test can check they are gone afterwards and that there were some.
        let mut seen_pids = BTreeSet::new();
        let output = loop {
            seen_pids.extend(self.gateway_processes());
            match done_rx.recv_timeout(Duration::from_millis(100)) {
                Ok(result) => break result.expect("wait for claude"),
                Err(mpsc::RecvTimeoutError::Timeout) if started.elapsed() < within => {}
                Err(_) => {
                    let _ = Command::new("kill")
                        .arg("-KILL")
                        .arg(pid.to_string())
                        .status();
                    let log = std::fs::read_to_string(&debug_file).unwrap_or_default();
                    panic!(
                        "claude did not exit within {within:?}; debug log tail:\n{}",
                        tail(&log, 8000)
                    );
                }
            }
        };
        let debug_log = std::fs::read_to_string(&debug_file).unwrap_or_default();
        if let Err(e) = stayed_local(&debug_log) {
            panic!("{e}");
        }
        Run {
            output,
            elapsed: started.elapsed(),
            debug_log,
            gateway_log: String::new(),
            seen_pids,
        }
    }

    /// Live processes whose `HOME` is the gateway's isolated home.
    pub fn gateway_processes(&self) -> BTreeSet<u32> {
        procs::all()
            .into_iter()
            .filter(|p| p.is_live())
            .filter(|p| {
                procs::env_var(p.pid, "HOME").as_deref() == Some(self.gateway_home.as_str())
            })
            .map(|p| p.pid)
            .collect()
    }

    /// Polls (bounded) until none of the gateway's processes is alive; returns the survivors.
    pub fn wait_gateway_gone(&self, within: Duration) -> Result<Duration, BTreeSet<u32>> {
        let start = Instant::now();
        loop {
            let live = self.gateway_processes();
            if live.is_empty() {
                return Ok(start.elapsed());
            }
            if start.elapsed() > within {
                return Err(live);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// What Claude Code logs (at debug level) when it reaches for an address off this machine by a
/// way that the dead proxy does not stop: `ssh git@github.com` to choose how to clone a plugin
/// marketplace, and the clone itself. A test must not talk to anything off the machine, so a run
/// whose log holds one of these fails, naming the line, rather than passing because the machine
/// happened to have no network.
const LEFT_THE_MACHINE: [&str; 3] = [
    "SSH config check",
    "Marketplace checkout probe",
    "Attempting to auto-install official marketplace",
];

/// `Err` naming the first line of `debug_log` that shows an attempt to leave the machine.
pub fn stayed_local(debug_log: &str) -> Result<(), String> {
    match debug_log
        .lines()
        .find(|line| LEFT_THE_MACHINE.iter().any(|trace| line.contains(trace)))
    {
        None => Ok(()),
        Some(line) => Err(format!(
            "Claude Code tried to reach an address off this machine (a test must not); its \
             debug log says: {line}\nIts environment needs another switch for this (see \
             `ClaudeCode::command`)."
        )),
    }
}

/// The last `n` bytes of `s` (at a char boundary).
pub fn tail(s: &str, n: usize) -> &str {
    let mut start = s.len().saturating_sub(n);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

/// The id Claude Code gave a backgrounded MCP task, from the tool result it showed its model
/// (`… use TaskStop with task_id "k8czo58ex" …`); empty if there is none.
pub fn background_id(tool_result: &str) -> String {
    tool_result
        .split("task_id \"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap_or_default()
        .to_string()
}

/// An interactive Claude Code in a terminal. When it is dropped at the end of a test that has
/// not already failed, its debug log is checked as a headless run's is ([`stayed_local`]).
pub struct Interactive {
    pub tmux: Tmux,
    debug_file: PathBuf,
    gateway_log: PathBuf,
}

impl Drop for Interactive {
    fn drop(&mut self) {
        if std::thread::panicking() {
            return;
        }
        if let Err(e) = stayed_local(&self.debug_log()) {
            panic!("{e}");
        }
    }
}

impl Interactive {
    /// Claude Code's debug log so far.
    pub fn debug_log(&self) -> String {
        std::fs::read_to_string(&self.debug_file).unwrap_or_default()
    }

    /// The gateway's stderr so far.
    pub fn gateway_log(&self) -> String {
        std::fs::read_to_string(&self.gateway_log).unwrap_or_default()
    }

    /// Polls the debug log (bounded) until a line holds `needle`.
    pub fn wait_for_log(&self, within: Duration, needle: &str) -> Result<(), String> {
        let start = Instant::now();
        while start.elapsed() < within {
            if self.debug_log().contains(needle) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(format!(
            "no `{needle}` in Claude Code's debug log within {within:?}; screen:\n{}\nlog tail:\n{}",
            self.tmux.pane(),
            tail(&self.debug_log(), 6000)
        ))
    }

    /// Waits until Claude Code holds the gateway's tools in its state, so that the next prompt
    /// goes out with them.
    ///
    /// Neither "Successfully connected" (logged before `tools/list` is even sent) nor the
    /// gateway's answer to `tools/list` is enough: Claude Code still has to read that answer and
    /// store it, and on a loaded machine (CI under coverage) a prompt typed in that gap went out
    /// without the gateway's tools, so the scripted model took it for a side request. Claude
    /// Code stores a connected server's tools and then, in the same step, decides on its
    /// channel notifications and logs `MCP server "<name>": Channel notifications registered`
    /// or `… skipped` — the first line that comes after the tools are in its state.
    pub fn wait_until_tools_listed(&self, within: Duration) -> Result<(), String> {
        self.wait_for_log(
            within,
            &format!("MCP server \"{SERVER}\": Channel notifications"),
        )
    }

    /// Types `text` at the prompt and sends it.
    pub fn say(&self, text: &str) {
        self.tmux.type_text(text);
        // The TUI takes the typed text in before Enter submits it.
        let typed = self
            .tmux
            .wait_for(Duration::from_secs(10), |pane| pane.contains(text));
        assert!(
            typed.is_ok(),
            "the text did not reach the prompt: {typed:?}"
        );
        self.tmux.press("Enter");
    }
}
