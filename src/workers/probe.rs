//! What a worker offers, read in one `ssh` round trip: whether `ssh` reaches it without a
//! prompt, its git, its OpenCode (against the release this gateway speaks to), and whether its
//! root directory can be written.

use std::time::{Duration, Instant};

use serde::Serialize;

use super::ssh::SshError;
use super::Worker;

/// The fixed script run on the worker: `$1` is the OpenCode command, `$2` the root directory
/// (both quoted as one word each by [`Ssh`]). It prints one `key=value` line per finding and
/// fails on nothing, so every finding comes back in one round trip.
const SCRIPT: &str = r#"printf 'git=%s\n' "$(git --version 2>/dev/null | head -n 1)"
printf 'opencode=%s\n' "$("$1" --version 2>/dev/null | tail -n 1)"
if mkdir -p -- "$2" 2>/dev/null && test -w "$2"; then printf 'root=writable\n'; else printf 'root=unwritable\n'; fi"#;

/// How long a probe may take: the connection (`ConnectTimeout=10`) and three quick commands.
pub const PROBE_LIMIT: Duration = Duration::from_secs(20);

/// What a probe of one worker found.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Health {
    pub worker: String,
    /// `false` when `ssh` could not connect or authenticate without a prompt.
    pub reachable: bool,
    /// Why it could not be reached (ssh's own words), when it could not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// `git --version` there, if git runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub git: Option<String>,
    /// The OpenCode release there (`<command> --version`), if the command runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub opencode: Option<String>,
    /// Whether the root directory exists (or could be made) and can be written.
    pub root_writable: bool,
    /// Whether bubblewrap runs there: `ok <path>`, `missing`, or `broken <why>`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bwrap: Option<String>,
    /// Whether its tasks would run confined: the user's file wants it and bubblewrap runs.
    pub confined: bool,
    /// The user's file wants its tasks confined, and bubblewrap does not run there.
    #[serde(skip)]
    unconfinable: bool,
    /// The round trip, in milliseconds.
    pub took_ms: u64,
}

impl Health {
    /// Ready for tasks: reachable, git and OpenCode run there, the root can be written, and its
    /// tasks can run as the user's file wants them (confined, unless it says otherwise).
    pub fn ready(&self) -> bool {
        self.reachable
            && self.git.is_some()
            && self.opencode.is_some()
            && self.root_writable
            && !self.unconfinable
    }

    /// The problems found, each with what to do about it; empty when ready.
    pub fn problems(&self, worker: &Worker) -> Vec<(String, String)> {
        let Some(remote) = worker.remote.as_ref() else {
            return Vec::new();
        };
        let destination = remote.ssh.destination();
        if !self.reachable {
            return vec![(
                format!(
                    "ssh cannot reach {destination} without a prompt: {}",
                    self.error.as_deref().unwrap_or("no reason given")
                ),
                format!(
                    "make `ssh -o BatchMode=yes {destination} true` succeed (a key without a \
                     passphrase or one in your agent, and the host key in known_hosts)"
                ),
            )];
        }
        let mut out = Vec::new();
        if self.git.is_none() {
            out.push((
                "git does not run there".to_string(),
                format!("install git on {destination}"),
            ));
        }
        if self.opencode.is_none() {
            out.push((
                format!("`{}` does not run there", remote.opencode),
                format!(
                    "install OpenCode on {destination} (npm i -g opencode-ai@{}), or set \
                     workers.{}.opencode to its path",
                    crate::OPENCODE_API_VERSION,
                    worker.name
                ),
            ));
        }
        if self.unconfinable {
            out.push((
                format!(
                    "its tasks run confined (workers.{}.sandbox / sandbox.mode), but bubblewrap {}",
                    worker.name,
                    match self.bwrap.as_deref() {
                        Some(b) if b.starts_with("broken") => format!(
                            "does not run there ({})",
                            b.trim_start_matches("broken").trim()
                        ),
                        _ => "is not installed there".to_string(),
                    }
                ),
                format!(
                    "install bubblewrap on {destination} (`apt-get install bubblewrap`; \
                     unprivileged user namespaces allowed), or set `workers.{}.sandbox: off` in \
                     your own delegation.yaml to let its agents run unconfined as its ssh user",
                    worker.name
                ),
            ));
        }
        if !self.root_writable {
            out.push((
                format!("its root directory {} cannot be written", remote.root),
                format!(
                    "set workers.{}.root to a directory the ssh user may write",
                    worker.name
                ),
            ));
        }
        out
    }
}

/// Probes `worker` (a remote one; the local machine needs no probe).
pub async fn probe(worker: &Worker) -> Health {
    let started = Instant::now();
    let mut health = Health {
        worker: worker.name.clone(),
        reachable: true,
        error: None,
        git: None,
        opencode: None,
        root_writable: true,
        bwrap: None,
        confined: false,
        unconfinable: false,
        took_ms: 0,
    };
    let Some(remote) = worker.remote.as_ref() else {
        return health;
    };
    let script = format!("{SCRIPT}\n{}", super::sandbox::PROBE);
    let argv = ["sh", "-c", &script, "sh", &remote.opencode, &remote.root];
    match remote.ssh.run(&argv, None, PROBE_LIMIT).await {
        Ok(out) => {
            for line in out.stdout.lines() {
                let Some((key, value)) = line.split_once('=') else {
                    continue;
                };
                // What the worker prints reaches the user's terminal: no control character
                // (escape sequences) gets through, and no line runs on.
                let value: String = value.trim().chars().take(200).collect();
                let value = crate::config::printable(&value).into_owned();
                let found = (!value.is_empty()).then(|| value.clone());
                match key {
                    "git" => health.git = found,
                    "opencode" => health.opencode = found.map(|v| version_of(&v)),
                    "root" => health.root_writable = value == "writable",
                    "bwrap" => health.bwrap = found.map(|v| v.chars().take(400).collect()),
                    _ => {}
                }
            }
            let runs = health.bwrap.as_deref().is_some_and(|b| b.starts_with("ok"));
            let wanted = worker.sandbox == crate::config::SandboxMode::On;
            health.confined = wanted && runs;
            health.unconfinable = wanted && !runs;
        }
        Err(e) => {
            health.reachable = false;
            health.root_writable = false;
            health.error = Some(match e {
                SshError::Unreachable { detail, .. } => detail,
                other => other.to_string(),
            });
        }
    }
    health.took_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    health
}

/// The version in what `opencode --version` printed (its last word: some releases print a
/// name before it).
fn version_of(printed: &str) -> String {
    printed
        .split_whitespace()
        .last()
        .unwrap_or(printed)
        .trim_start_matches('v')
        .to_string()
}
