//! Supervision of one managed `opencode serve` child process.
//!
//! Facts this rests on (design notes §4): the server prints `opencode server listening on
//! http://127.0.0.1:<port>` when ready, and requests sent before that line can hang forever, so
//! nothing is sent until it appears; `--port 0` prefers 4096 rather than a random port, so a free
//! port is picked here. The child runs in its own process group so that stopping it also stops
//! whatever it spawned, and (on Linux) dies with the gateway even if the gateway is SIGKILLed.

use std::collections::VecDeque;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;
use tokio::sync::watch;

use super::error::OpencodeError;
use crate::config::{OpenCodeConfig, PermissionPolicy};

/// How long a stopped server gets between SIGTERM and SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(3);
/// Lines of the child's output kept for error messages.
const OUTPUT_TAIL: usize = 20;

/// A running managed server.
#[derive(Debug)]
pub struct ManagedProcess {
    pub pid: u32,
    pub url: String,
    /// `None` while running; `Some(description)` once the process has exited.
    exited: watch::Receiver<Option<String>>,
}

/// What to start.
pub struct SpawnRequest<'a> {
    pub config: &'a OpenCodeConfig,
    pub port: u16,
    pub directory: &'a Path,
    pub password: &'a str,
    pub start_timeout: Duration,
}

impl ManagedProcess {
    /// Spawns `opencode serve` and waits for its `listening on` line.
    pub async fn spawn(req: SpawnRequest<'_>) -> Result<Self, OpencodeError> {
        let port = match req.port {
            0 => free_port(&req.config.hostname)?,
            p => p,
        };
        let mut cmd = Command::new(&req.config.command);
        cmd.arg("serve")
            .arg("--hostname")
            .arg(&req.config.hostname)
            .arg("--port")
            .arg(port.to_string())
            .current_dir(req.directory)
            .env("OPENCODE_SERVER_PASSWORD", req.password)
            .env(
                "OPENCODE_CONFIG_CONTENT",
                merged_config_content(
                    std::env::var("OPENCODE_CONFIG_CONTENT").ok().as_deref(),
                    req.config.permission,
                ),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .process_group(0);
        #[cfg(target_os = "linux")]
        // SAFETY: prctl is async-signal-safe and touches only the calling (child) process; it
        // makes the kernel SIGKILL the child if the gateway dies without stopping it.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                OpencodeError::Start(format!(
                    "the `{}` binary was not found: install it with `npm install -g opencode-ai` or set opencode.command in delegation.yaml to its path",
                    req.config.command
                ))
            } else {
                OpencodeError::Start(format!("spawning `{}` failed: {e}", req.config.command))
            }
        })?;
        let pid = child.id().unwrap_or(0);
        let tail = Arc::new(Mutex::new(VecDeque::new()));
        let (ready_tx, mut ready_rx) = tokio::sync::mpsc::channel::<String>(1);

        if let Some(stdout) = child.stdout.take() {
            let tail = tail.clone();
            tokio::spawn(async move {
                let mut lines = BufReader::new(stdout).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    if let Some(url) = parse_listening_line(&line) {
                        let _ = ready_tx.try_send(url);
                    }
                    tracing::debug!(target: "opencode", pid, "{line}");
                    push_tail(&tail, line);
                }
            });
        }
        if let Some(stderr) = child.stderr.take() {
            let tail = tail.clone();
            tokio::spawn(async move {
                let mut lines = BufReader::new(stderr).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    tracing::debug!(target: "opencode", pid, "{line}");
                    push_tail(&tail, line);
                }
            });
        }

        let (exit_tx, exit_rx) = watch::channel(None);
        tokio::spawn(async move {
            let description = match child.wait().await {
                Ok(status) => describe_exit(status),
                Err(e) => format!("waiting for it failed: {e}"),
            };
            let _ = exit_tx.send(Some(description));
        });

        let mut exited = exit_rx.clone();
        let url = tokio::select! {
            url = ready_rx.recv() => url,
            _ = exited.wait_for(|e| e.is_some()) => None,
            _ = tokio::time::sleep(req.start_timeout) => {
                kill_group(pid, libc::SIGKILL);
                return Err(OpencodeError::Start(format!(
                    "`{} serve` printed no `listening on` line within {:?} (timeouts.server_start){}",
                    req.config.command, req.start_timeout, tail_text(&tail)
                )));
            }
        };
        match url {
            Some(url) => Ok(Self {
                pid,
                url,
                exited: exit_rx,
            }),
            None => {
                let how = exit_rx.borrow().clone().unwrap_or_default();
                let tail = tail_text(&tail);
                let hint = if tail.contains("in use") || tail.contains("EADDRINUSE") {
                    format!(
                        " (port {port} is in use: pick another `port` or pass 0 for a free one)"
                    )
                } else {
                    String::new()
                };
                Err(OpencodeError::Start(format!(
                    "`{} serve` exited before it was ready: {how}{hint}{tail}",
                    req.config.command
                )))
            }
        }
    }

    /// `Some(description)` once the process has exited.
    pub fn exit_status(&self) -> Option<String> {
        self.exited.borrow().clone()
    }

    /// Resolves when the process exits, with how it exited.
    pub async fn wait_exit(&self) -> String {
        let mut rx = self.exited.clone();
        let how = match rx.wait_for(|e| e.is_some()).await {
            Ok(v) => v.clone().unwrap_or_default(),
            Err(_) => "unknown".into(),
        };
        how
    }

    /// SIGTERM to the process group, then SIGKILL after a grace period; waits for the exit.
    pub async fn stop(&self) -> String {
        if let Some(done) = self.exit_status() {
            return done;
        }
        kill_group(self.pid, libc::SIGTERM);
        match tokio::time::timeout(STOP_GRACE, self.wait_exit()).await {
            Ok(how) => {
                // Children of the server that ignored SIGTERM go too.
                kill_group(self.pid, libc::SIGKILL);
                how
            }
            Err(_) => {
                kill_group(self.pid, libc::SIGKILL);
                self.wait_exit().await
            }
        }
    }
}

/// Signals the whole process group led by `pid` (the child was started as a group leader).
pub fn kill_group(pid: u32, signal: libc::c_int) {
    if pid == 0 {
        return;
    }
    let Ok(pgid) = libc::pid_t::try_from(pid) else {
        return;
    };
    // SAFETY: kill(2) with a negative pid signals a process group; no memory is touched.
    unsafe {
        libc::kill(-pgid, signal);
    }
}

fn push_tail(tail: &Mutex<VecDeque<String>>, line: String) {
    if let Ok(mut t) = tail.lock() {
        if t.len() == OUTPUT_TAIL {
            t.pop_front();
        }
        t.push_back(line);
    }
}

fn tail_text(tail: &Mutex<VecDeque<String>>) -> String {
    let lines: Vec<String> = tail
        .lock()
        .map(|t| t.iter().cloned().collect())
        .unwrap_or_default();
    if lines.is_empty() {
        String::new()
    } else {
        format!("; its last output:\n{}", lines.join("\n"))
    }
}

fn describe_exit(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with code {code}"),
        (None, Some(sig)) => format!("exited with signal {sig}"),
        _ => "exited".into(),
    }
}

/// `opencode server listening on http://127.0.0.1:4096` -> the URL.
pub fn parse_listening_line(line: &str) -> Option<String> {
    let (_, rest) = line.split_once("listening on ")?;
    let url = rest.split_whitespace().next()?;
    (url.starts_with("http://") || url.starts_with("https://"))
        .then(|| url.trim_end_matches('/').to_string())
}

/// Picks a free port on `hostname` by binding port 0 and releasing it.
fn free_port(hostname: &str) -> Result<u16, OpencodeError> {
    let host = if hostname == "localhost" {
        "127.0.0.1"
    } else {
        hostname
    };
    let listener = std::net::TcpListener::bind((host, 0))
        .map_err(|e| OpencodeError::Start(format!("cannot find a free port on {host}: {e}")))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| OpencodeError::Start(format!("cannot find a free port on {host}: {e}")))
}

/// The user's own `OPENCODE_CONFIG_CONTENT` with our permission policy added. The user's content
/// is never replaced: if it is not a JSON object it is passed through untouched, and a
/// `permission` the user set wins over the policy.
pub fn merged_config_content(existing: Option<&str>, policy: PermissionPolicy) -> String {
    let policy_value = match policy {
        PermissionPolicy::Allow => "allow",
        PermissionPolicy::Ask => "ask",
        PermissionPolicy::Deny => "deny",
    };
    let mut object = match existing.map(serde_json::from_str::<serde_json::Value>) {
        None => serde_json::Map::new(),
        Some(Ok(serde_json::Value::Object(map))) => map,
        Some(_) => {
            tracing::warn!("OPENCODE_CONFIG_CONTENT is not a JSON object; passing it through unchanged, without the permission policy");
            return existing.unwrap_or_default().to_string();
        }
    };
    object
        .entry("permission")
        .or_insert_with(|| serde_json::Value::String(policy_value.into()));
    serde_json::Value::Object(object).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listening_line_is_parsed() {
        assert_eq!(
            parse_listening_line("opencode server listening on http://127.0.0.1:4096"),
            Some("http://127.0.0.1:4096".into())
        );
        assert_eq!(parse_listening_line("Warning: something"), None);
        assert_eq!(parse_listening_line("listening on nowhere"), None);
    }

    #[test]
    fn permission_policy_merges_into_user_config() {
        let merged = merged_config_content(
            Some(r#"{"model":"fake/m","provider":{"x":{}}}"#),
            PermissionPolicy::Allow,
        );
        let v: serde_json::Value = serde_json::from_str(&merged).expect("json");
        assert_eq!(v["permission"], "allow");
        assert_eq!(v["model"], "fake/m");
        assert!(v["provider"]["x"].is_object());
    }

    #[test]
    fn users_own_permission_wins_and_garbage_passes_through() {
        let merged = merged_config_content(
            Some(r#"{"permission":{"bash":"ask"}}"#),
            PermissionPolicy::Allow,
        );
        let v: serde_json::Value = serde_json::from_str(&merged).expect("json");
        assert_eq!(v["permission"]["bash"], "ask");
        assert_eq!(
            merged_config_content(Some("not json"), PermissionPolicy::Deny),
            "not json"
        );
        let fresh: serde_json::Value =
            serde_json::from_str(&merged_config_content(None, PermissionPolicy::Ask))
                .expect("json");
        assert_eq!(fresh["permission"], "ask");
    }
}
