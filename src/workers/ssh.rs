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
pub(super) const STDERR_KEPT: usize = 2_000;

/// The most a fixed command's stdout may print: the gateway's own commands print a few lines,
/// so more is a worker gone wrong (or hostile: its login files run before every command), and
/// the command is stopped rather than read into memory.
pub const STDOUT_LIMIT: usize = 1 << 20;

/// The longest line kept of what a worker prints line by line (longer ones are cut).
pub const LINE_LIMIT: usize = 64 << 10;

/// What running a command on a worker can come to, short of its own success.
#[derive(Debug, thiserror::Error)]
pub enum SshError {
    #[error("cannot run ssh: {0} (is OpenSSH's client installed?)")]
    NoClient(std::io::Error),
    #[error("ssh could not reach {destination}: {detail}")]
    Unreachable { destination: String, detail: String },
    #[error(
        "`{command}` on {destination} did not finish within {after:?}{}",
        said(stderr)
    )]
    TimedOut {
        destination: String,
        command: String,
        after: Duration,
        /// The end of what it printed on stderr meanwhile.
        stderr: String,
    },
    #[error("`{command}` on {destination} printed more than {limit} bytes and was stopped")]
    TooMuch {
        destination: String,
        command: String,
        limit: usize,
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
    ///
    /// What comes back is read as hostile (the worker's login files run before every
    /// command): any bytes are taken (as lossy UTF-8), stdout is kept up to [`STDOUT_LIMIT`]
    /// (past it the command is stopped), stderr's end up to [`STDERR_KEPT`], and `within`
    /// bounds the whole, input and output included: on expiry ssh is killed.
    pub async fn run(
        &self,
        argv: &[&str],
        input: Option<&[u8]>,
        within: Duration,
    ) -> Result<Output, SshError> {
        let command = argv.first().copied().unwrap_or_default().to_string();
        let mut cmd = self.command(argv);
        if input.is_some() {
            cmd.stdin(Stdio::piped());
        }
        let mut child = cmd.spawn().map_err(SshError::NoClient)?;
        let stdin = child.stdin.take();
        let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
            return Err(SshError::NoClient(std::io::Error::other("no pipes to ssh")));
        };
        let errors = tokio::spawn(read_tail(stderr, STDERR_KEPT));
        let work = async {
            if let (Some(bytes), Some(mut stdin)) = (input, stdin) {
                // A command that exits without reading its input is not an error of ours.
                let _ = stdin.write_all(bytes).await;
            }
            let (out, full) = read_capped(stdout, STDOUT_LIMIT).await;
            if full {
                let _ = child.start_kill();
            }
            (out, full, child.wait().await)
        };
        let ran = tokio::time::timeout(within, work).await;
        let said_on_stderr = async {
            tokio::time::timeout(Duration::from_secs(2), errors)
                .await
                .ok()
                .and_then(Result::ok)
                .unwrap_or_default()
        };
        let (stdout, full, status) = match ran {
            Ok(ran) => ran,
            Err(_) => {
                // `child` is dropped here, and ssh with it (`kill_on_drop`).
                return Err(SshError::TimedOut {
                    destination: self.destination.clone(),
                    command,
                    after: within,
                    stderr: said_on_stderr.await,
                });
            }
        };
        if full {
            return Err(SshError::TooMuch {
                destination: self.destination.clone(),
                command,
                limit: STDOUT_LIMIT,
            });
        }
        let status = status.map_err(SshError::NoClient)?;
        // It reaches error messages, hosts' logs and the user's terminal: no control
        // character of the worker's gets through but line ends.
        let stderr = crate::config::printable_lines(&said_on_stderr.await).into_owned();
        let status = status.code().unwrap_or(SSH_FAILED);
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
            stdout: String::from_utf8_lossy(&stdout).into_owned(),
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
            // Looked at without following a link before anything is made or changed: in a
            // shared /tmp another user may have planted a link (or a directory) by that name,
            // and nothing of theirs is touched.
            match std::fs::symlink_metadata(&dir) {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    use std::os::unix::fs::DirBuilderExt;
                    let made = std::fs::DirBuilder::new().mode(0o700).create(&dir);
                    if let Err(e) = made {
                        tracing::debug!(dir = %shown, error = %e, "no directory for ssh control sockets");
                        return None;
                    }
                }
                Err(e) => {
                    tracing::debug!(dir = %shown, error = %e, "no directory for ssh control sockets");
                    return None;
                }
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

/// ` (it said: ...)` for an error, when `stderr` holds something.
fn said(stderr: &str) -> String {
    match stderr.trim() {
        "" => String::new(),
        s => format!(" (it said: {})", crate::config::printable(s)),
    }
}

/// Reads `from` to its end, keeping at most `max` bytes; `true` when there was more (it stops
/// reading then, so a writer that does not stop is not read on).
pub(crate) async fn read_capped(
    mut from: impl tokio::io::AsyncRead + Unpin,
    max: usize,
) -> (Vec<u8>, bool) {
    use tokio::io::AsyncReadExt;
    let mut out = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        match from.read(&mut chunk).await {
            Ok(0) | Err(_) => return (out, false),
            Ok(n) if out.len() + n > max => {
                out.extend_from_slice(&chunk[..max - out.len()]);
                return (out, true);
            }
            Ok(n) => out.extend_from_slice(&chunk[..n]),
        }
    }
}

/// Reads `from` to its end and keeps the last `max` bytes of it, as text (any bytes taken).
pub(crate) async fn read_tail(mut from: impl tokio::io::AsyncRead + Unpin, max: usize) -> String {
    use tokio::io::AsyncReadExt;
    let mut kept: std::collections::VecDeque<u8> = std::collections::VecDeque::new();
    let mut chunk = [0u8; 8192];
    while let Ok(n @ 1..) = from.read(&mut chunk).await {
        kept.extend(&chunk[..n]);
        let over = kept.len().saturating_sub(max);
        kept.drain(..over);
    }
    let bytes: Vec<u8> = kept.into();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The next line of `from` (without its end), as text whatever its bytes, at most `max` bytes
/// of it kept (the rest of a longer line is read and dropped); `None` at the end.
pub(crate) async fn read_line_capped(
    from: &mut (impl tokio::io::AsyncBufRead + Unpin),
    max: usize,
) -> Option<String> {
    use tokio::io::AsyncBufReadExt;
    let mut line = Vec::new();
    let mut any = false;
    loop {
        let buf = match from.fill_buf().await {
            Ok(buf) if !buf.is_empty() => buf,
            _ => return any.then(|| String::from_utf8_lossy(&line).into_owned()),
        };
        any = true;
        let (taken, done) = match buf.iter().position(|b| *b == b'\n') {
            Some(i) => (i + 1, true),
            None => (buf.len(), false),
        };
        let room = max.saturating_sub(line.len());
        let body = if done {
            &buf[..taken - 1]
        } else {
            &buf[..taken]
        };
        line.extend_from_slice(&body[..body.len().min(room)]);
        from.consume(taken);
        if done {
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            return Some(String::from_utf8_lossy(&line).into_owned());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a worker prints is read within bounds, whatever its bytes: a capped read stops at
    /// its cap and says so, a tail keeps the end, and lines are cut at their cap and taken
    /// whatever bytes they hold (a byte that is not UTF-8 does not end the reading).
    #[tokio::test]
    async fn reads_from_a_worker_are_bounded_and_take_any_bytes() {
        let big = vec![b'x'; 100_000];
        let (kept, full) = read_capped(&big[..], 10_000).await;
        assert_eq!((kept.len(), full), (10_000, true));
        let (kept, full) = read_capped(&b"small"[..], 10_000).await;
        assert_eq!((kept.as_slice(), full), (&b"small"[..], false));
        let mut text = vec![b'a'; 50_000];
        text.extend_from_slice(b"the end");
        assert_eq!(read_tail(&text[..], 7).await, "the end");

        let mut input: Vec<u8> = b"\xff\xfe bad bytes\n".to_vec();
        input.extend(vec![b'y'; 200_000]);
        input.extend_from_slice(b"\nlast\r\nno end");
        let mut reader = tokio::io::BufReader::new(&input[..]);
        let first = read_line_capped(&mut reader, 1_000).await.expect("a line");
        assert!(
            first.ends_with(" bad bytes") && first.contains('\u{fffd}'),
            "{first:?}"
        );
        let long = read_line_capped(&mut reader, 1_000).await.expect("a line");
        assert_eq!(long.len(), 1_000);
        assert_eq!(
            read_line_capped(&mut reader, 1_000).await.as_deref(),
            Some("last")
        );
        assert_eq!(
            read_line_capped(&mut reader, 1_000).await.as_deref(),
            Some("no end")
        );
        assert_eq!(read_line_capped(&mut reader, 1_000).await, None);
    }

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
