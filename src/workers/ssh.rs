//! Running fixed commands on a worker with the user's own `ssh` client.
//!
//! Nothing of ours is installed on a worker and there is no protocol of our own: a worker is
//! whatever the user's `ssh` (with their `~/.ssh/config`, keys and known hosts) reaches. Every
//! connection is made so that it can never stop to ask anything (`BatchMode=yes`: an unknown
//! host key or a key with a passphrase fails instead of prompting) and carries nothing of the
//! user's session across (no agent, no X11, none of the forwardings their config may declare).
//!
//! A serving gateway's connections to a worker share one: the first `ssh` becomes the master of a control socket
//! in a directory only this user can enter ([`control_dir`]), later ones (git's transport too)
//! ride on it, and it stays up a minute after the last one (`ControlPersist=60`), so a task's
//! steps pay one ssh handshake, not one each. Without such a directory each call connects on
//! its own. The forwarding connection of a worker's OpenCode never shares (`serve.rs`).
//!
//! `ssh` hands the remote side one command line, which the worker's login shell parses: every
//! argument is quoted on its own ([`quote`]), so a path or a command name from the configuration
//! is always one word there, whatever it holds. The commands themselves are fixed by the
//! gateway (git, the OpenCode command, cleanup); nothing a repository or an agent wrote chooses
//! them.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncWriteExt;

/// The options of every connection (see the module documentation).
const OPTIONS: &[&str] = &[
    "-o",
    "BatchMode=yes",
    "-o",
    "ForwardAgent=no",
    "-o",
    "ForwardX11=no",
    "-o",
    "PermitLocalCommand=no",
    "-o",
    "ConnectTimeout=10",
    "-o",
    "ServerAliveInterval=10",
    "-o",
    "ServerAliveCountMax=3",
    // No terminal: the commands' output is read as bytes.
    "-T",
];

/// Added to [`OPTIONS`] for every connection but the forwarding one: none of the forwardings
/// the user's configuration may declare comes up.
const NO_FORWARDINGS: &[&str] = &["-o", "ClearAllForwardings=yes"];

/// Added to [`OPTIONS`] for the one connection that carries a port forward (a worker's
/// OpenCode session, `serve.rs`): `ClearAllForwardings` would clear its own `-L` too, and it
/// shares no control socket (a forward asked for through a shared master would outlive the
/// session).
pub const FORWARDING: &[&str] = &["-o", "ControlMaster=no", "-o", "ControlPath=none"];

/// `ssh`'s own exit status when it could not connect or authenticate (a remote command's
/// status is passed through otherwise).
pub(super) const SSH_FAILED: i32 = 255;

/// The most of a command's stderr kept in an error.
const STDERR_KEPT: usize = 2_000;

/// What running a command on a worker can come to, short of its own success.
#[derive(Debug, thiserror::Error)]
pub enum SshError {
    #[error("cannot run ssh: {0} (is OpenSSH's client installed?)")]
    NoClient(std::io::Error),
    #[error("ssh could not reach {destination}: {detail}")]
    Unreachable { destination: String, detail: String },
    #[error("`{command}` on {destination} did not finish within {after:?}")]
    TimedOut {
        destination: String,
        command: String,
        after: Duration,
    },
}

/// A command's outcome on the worker: its exit status and what it printed.
#[derive(Debug)]
pub struct Output {
    pub status: i32,
    pub stdout: String,
    pub stderr: String,
}

/// One worker's `ssh` destination.
#[derive(Debug, Clone)]
pub struct Ssh {
    destination: String,
    /// `ssh -F`: a client configuration used instead of the user's and the system's.
    config_file: Option<String>,
}

impl Ssh {
    /// A destination as the configuration gives it (checked there: no leading `-`, no spaces;
    /// it is passed after `--` all the same).
    pub fn new(destination: &str, config_file: Option<&str>) -> Self {
        Self {
            destination: destination.to_string(),
            config_file: config_file.map(str::to_string),
        }
    }

    pub fn destination(&self) -> &str {
        &self.destination
    }

    /// The `ssh` command that runs `argv` on the worker.
    pub fn command(&self, argv: &[&str]) -> tokio::process::Command {
        let shared = sharing();
        let mut extra: Vec<&str> = NO_FORWARDINGS.to_vec();
        extra.extend(shared.iter().map(String::as_str));
        self.command_with(&extra, argv)
    }

    /// The `ssh` command that runs `argv` on the worker with [`OPTIONS`] and `extra` arguments
    /// (the forwarding connection's [`FORWARDING`] and `-L`).
    pub fn command_with(&self, extra: &[&str], argv: &[&str]) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new("ssh");
        if let Some(file) = &self.config_file {
            cmd.arg("-F").arg(file);
        }
        cmd.args(OPTIONS)
            .args(extra)
            .arg("--")
            .arg(&self.destination)
            .arg(remote_line(argv))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        cmd
    }

    /// The same `ssh`, as git's `GIT_SSH_COMMAND` (which git hands to a shell, so every word
    /// is quoted): git's own transport then connects exactly as every other call does.
    pub fn git_ssh_command(&self) -> String {
        let mut words = vec!["ssh".to_string()];
        if let Some(file) = &self.config_file {
            words.push("-F".into());
            words.push(quote(file));
        }
        words.extend(OPTIONS.iter().chain(NO_FORWARDINGS).map(|o| quote(o)));
        words.extend(sharing().iter().map(|o| quote(o)));
        words.join(" ")
    }

    /// Runs `argv` on the worker, with `input` on its stdin, for at most `within`. A command
    /// that ran is an [`Output`] whatever its status; not getting there is an [`SshError`].
    pub async fn run(
        &self,
        argv: &[&str],
        input: Option<&[u8]>,
        within: Duration,
    ) -> Result<Output, SshError> {
        let mut cmd = self.command(argv);
        if input.is_some() {
            cmd.stdin(Stdio::piped());
        }
        let mut child = cmd.spawn().map_err(SshError::NoClient)?;
        if let (Some(bytes), Some(mut stdin)) = (input, child.stdin.take()) {
            // A command that exits without reading its input is not an error of ours.
            let _ = stdin.write_all(bytes).await;
        }
        let out = match tokio::time::timeout(within, child.wait_with_output()).await {
            Ok(out) => out.map_err(SshError::NoClient)?,
            Err(_) => {
                return Err(SshError::TimedOut {
                    destination: self.destination.clone(),
                    command: argv.first().copied().unwrap_or_default().to_string(),
                    after: within,
                })
            }
        };
        let stderr = tail(&String::from_utf8_lossy(&out.stderr), STDERR_KEPT);
        let status = out.status.code().unwrap_or(SSH_FAILED);
        if status == SSH_FAILED {
            return Err(SshError::Unreachable {
                destination: self.destination.clone(),
                detail: match stderr.trim() {
                    "" => "ssh exited with status 255".to_string(),
                    s => s.to_string(),
                },
            });
        }
        Ok(Output {
            status,
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr,
        })
    }
}

/// Whether this process shares connections ([`share_connections`]).
static SHARE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Makes this process's connections to each worker share one (the serving gateway: it lives
/// long and makes many). One-shot commands (`workers`, `doctor`) leave it off, so they leave no
/// master connection behind when they exit.
pub fn share_connections() {
    SHARE.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// The options that make connections share a control socket, or none when sharing is off or
/// there is no private directory for the sockets.
fn sharing() -> Vec<String> {
    if !SHARE.load(std::sync::atomic::Ordering::Relaxed) {
        return Vec::new();
    }
    match control_dir() {
        Some(dir) => vec![
            "-o".into(),
            "ControlMaster=auto".into(),
            "-o".into(),
            format!("ControlPath={}/%C", dir.display()),
            "-o".into(),
            "ControlPersist=60".into(),
        ],
        None => Vec::new(),
    }
}

/// The directory for control sockets, made once per process: `$XDG_RUNTIME_DIR/opencode-mcp-ssh`,
/// else `/tmp/opencode-mcp-ssh-<uid>`. Used only when it is a real directory (not a link) owned
/// by this user and closed to others (a socket there is a way into the user's connections),
/// and its path is short enough for a socket (ssh adds 41 characters) and holds no `%` (ssh's
/// token character).
fn control_dir() -> Option<&'static std::path::Path> {
    static DIR: std::sync::OnceLock<Option<std::path::PathBuf>> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        #[cfg(unix)]
        {
            use std::os::unix::fs::MetadataExt;
            // SAFETY: getuid(2) has no preconditions and cannot fail.
            let uid = unsafe { libc::getuid() };
            let dir = match std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
                Some(runtime) => std::path::PathBuf::from(runtime).join("opencode-mcp-ssh"),
                None => std::env::temp_dir().join(format!("opencode-mcp-ssh-{uid}")),
            };
            let shown = dir.display().to_string();
            if shown.len() > 60 || shown.contains('%') || shown.chars().any(char::is_whitespace) {
                return None;
            }
            if let Err(e) = crate::private_files::create_dir(&dir) {
                tracing::debug!(dir = %shown, error = %e, "no directory for ssh control sockets");
                return None;
            }
            let meta = std::fs::symlink_metadata(&dir).ok()?;
            let private = meta.is_dir() && meta.uid() == uid && meta.mode() & 0o077 == 0;
            if !private {
                tracing::warn!(dir = %shown, "not sharing ssh connections: the directory for their sockets is not this user's alone");
                return None;
            }
            Some(dir)
        }
        #[cfg(not(unix))]
        None
    })
    .as_deref()
}

/// The remote command line: each argument quoted on its own.
fn remote_line(argv: &[&str]) -> String {
    argv.iter().map(|a| quote(a)).collect::<Vec<_>>().join(" ")
}

/// `arg` as one word for a POSIX shell: in single quotes, each `'` written as `'\''`. Inside
/// single quotes nothing is special, so the word is exactly `arg`.
pub fn quote(arg: &str) -> String {
    let mut out = String::with_capacity(arg.len() + 2);
    out.push('\'');
    for c in arg.chars() {
        if c == '\'' {
            out.push_str("'\\''");
        } else {
            out.push(c);
        }
    }
    out.push('\'');
    out
}

/// The last `max` bytes of `text`, on a character boundary.
fn tail(text: &str, max: usize) -> String {
    let mut start = text.len().saturating_sub(max);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    text[start..].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whatever an argument holds, `sh` reads it back as exactly one word, unchanged.
    #[test]
    fn a_quoted_argument_is_one_word_as_written() {
        let hostile = [
            "plain",
            "with space",
            "it's",
            "'; rm -rf ~; echo '",
            "$(touch /tmp/pwned) `id` $HOME *",
            "back\\slash\nnew line",
            "",
            "--option",
        ];
        for arg in hostile {
            let out = std::process::Command::new("sh")
                .arg("-c")
                .arg(format!("printf '%s' {}", quote(arg)))
                .output()
                .expect("sh runs");
            assert_eq!(String::from_utf8_lossy(&out.stdout), arg, "{arg:?}");
        }
        let line = remote_line(&["printf", "%s|%s", "a b", "c'd"]);
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(&line)
            .output()
            .expect("sh runs");
        assert_eq!(String::from_utf8_lossy(&out.stdout), "a b|c'd");
    }

    /// No connection may prompt, forward the agent or X11, or bring forwardings along; the
    /// destination comes after `--`, so it is never an option.
    #[test]
    fn every_connection_is_batch_mode_and_forwards_nothing() {
        let cmd = Ssh::new("worker-1", None).command(&["true"]);
        let args: Vec<String> = cmd
            .as_std()
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        for option in [
            "BatchMode=yes",
            "ForwardAgent=no",
            "ForwardX11=no",
            "ClearAllForwardings=yes",
        ] {
            assert!(args.iter().any(|a| a == option), "{option} in {args:?}");
        }
        let dashdash = args.iter().position(|a| a == "--").expect("--");
        assert_eq!(args[dashdash + 1], "worker-1");
        assert_eq!(args[dashdash + 2], "'true'");
    }

    /// Connections share a control socket in a directory only this user can enter; the
    /// forwarding connection never does.
    #[cfg(unix)]
    #[test]
    fn connections_share_a_private_control_socket_but_the_forward_does_not() {
        use std::os::unix::fs::MetadataExt;
        share_connections();
        let dir = control_dir().expect("a private directory for control sockets");
        let meta = std::fs::symlink_metadata(dir).expect("stat");
        assert!(meta.is_dir() && meta.mode() & 0o077 == 0, "{meta:?}");
        let ssh = Ssh::new("w", None);
        let args = |cmd: tokio::process::Command| -> Vec<String> {
            cmd.as_std()
                .get_args()
                .map(|a| a.to_string_lossy().into_owned())
                .collect()
        };
        let plain = args(ssh.command(&["true"]));
        let path = format!("ControlPath={}/%C", dir.display());
        assert!(plain.contains(&path), "{plain:?}");
        assert!(ssh.git_ssh_command().contains(&path));
        let forward = args(ssh.command_with(&[FORWARDING, &["-L", "1:h:2"]].concat(), &["true"]));
        assert!(
            forward.contains(&"ControlPath=none".to_string()),
            "{forward:?}"
        );
        assert!(!forward.contains(&path), "{forward:?}");
    }
}
