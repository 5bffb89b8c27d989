//! Running fixed commands on a worker with the user's own `ssh` client.
//!
//! Nothing of ours is installed on a worker and there is no protocol of our own: a worker is
//! whatever the user's `ssh` (with their `~/.ssh/config`, keys and known hosts) reaches. Every
//! connection is made so that it can never stop to ask anything (`BatchMode=yes`: an unknown
//! host key or a key with a passphrase fails instead of prompting) and carries nothing of the
//! user's session across (no agent, no X11, none of the forwardings their config may declare).
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
    "ClearAllForwardings=yes",
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

/// [`OPTIONS`] for the one connection that carries a port forward (a worker's OpenCode session,
/// `serve.rs`): `ClearAllForwardings` would clear its own `-L` too.
pub const FORWARDING_OPTIONS: &[&str] = &[
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
    "-T",
];

/// `ssh`'s own exit status when it could not connect or authenticate (a remote command's
/// status is passed through otherwise).
const SSH_FAILED: i32 = 255;

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
        self.command_with(OPTIONS, &[], argv)
    }

    /// [`Self::command`] with other `options` and `extra` arguments (a forward's `-L`).
    pub fn command_with(
        &self,
        options: &[&str],
        extra: &[&str],
        argv: &[&str],
    ) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new("ssh");
        if let Some(file) = &self.config_file {
            cmd.arg("-F").arg(file);
        }
        cmd.args(options)
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
        words.extend(OPTIONS.iter().map(|o| quote(o)));
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
}
