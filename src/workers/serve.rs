//! OpenCode on a worker: one `opencode serve` there, listening on the worker's loopback only,
//! started over ssh and reached through that same connection's port forward, with a password of
//! its own.
//!
//! The user's provider keys never leave this machine: the worker's OpenCode runs with the
//! worker's own configuration (its home, its providers). The password goes over the
//! connection's stdin, never on a command line (a worker's other users see command lines).
//! The serve session is one `ssh -L <local>:127.0.0.1:<remote> <worker> sh -c …`: the forward
//! lives exactly as long as the session, and OpenCode's own `listening on` line says when it is
//! ready. The remote port is chosen here (OpenCode's `--port 0` prefers 4096, which another
//! user of the machine may hold); a port OpenCode cannot bind is tried again with another.
//!
//! The forwarding connection cannot use `ClearAllForwardings` (it would clear its own `-L`), so
//! forwardings the user's ssh configuration declares for that host come up with it; every
//! other connection clears them.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncWriteExt, BufReader};
use tokio::process::Child;

use super::ssh::{read_line_capped, read_tail, SshError, FORWARDING, LINE_LIMIT, STDERR_KEPT};
use super::Remote;
use crate::opencode::OpenTurn;

/// The fixed script that starts OpenCode there: the password is the first line of stdin; `$1`
/// the OpenCode command, `$2` the port, `$3` the directory it serves from (made when missing:
/// the worker's root on first use), `$4` the confining shell ([`super::sandbox`]; empty when
/// the worker's tasks run unconfined), which becomes OpenCode's `shell` through
/// `OPENCODE_CONFIG_CONTENT` (replacing any the worker's login sets: a worker's own OpenCode
/// settings belong in its config files). It prints its pid (kept by `exec`) and that directory
/// made absolute before OpenCode's own lines.
const SERVE: &str = "umask 077; IFS= read -r p || exit 97; OPENCODE_SERVER_PASSWORD=$p; \
                     export OPENCODE_SERVER_PASSWORD; mkdir -p -- \"$3\" && cd -- \"$3\" || exit 98; \
                     if [ -n \"$4\" ]; then [ -f \"$4\" ] || exit 95; \
                     OPENCODE_CONFIG_CONTENT=\"{\\\"shell\\\":\\\"$4\\\"}\"; \
                     export OPENCODE_CONFIG_CONTENT; fi; \
                     echo \"opencode-mcp-pid=$$\"; echo \"opencode-mcp-dir=$(pwd)\"; \
                     exec \"$1\" serve --hostname 127.0.0.1 --port \"$2\" 2>&1";

/// The fixed script a gateway that restarted reaches a worker's OpenCode again with: `$1` its
/// pid there, `$2` its linger timer's file (see [`LINGER`]). It says whether that process still
/// runs, stops the timer (by removing its file: the timer ends within a second once its file no
/// longer names it), then keeps the session (and so the forward) open exactly as long as the
/// process runs.
const WATCH: &str = "kill -0 \"$1\" 2>/dev/null || exit 96; rm -f \"$2\"; \
                     echo opencode-mcp-attached; while kill -0 \"$1\" 2>/dev/null; do sleep 5; done";

/// The fixed script that lets a worker's OpenCode run on after a clean exit of its gateway (a
/// host's reconnect or update ends the gateway while tasks run there): `$1` its pid, `$2` the
/// grace period in seconds, `$3` the timer's file, `$4` the directory it serves from (the
/// worker's root), `$5` the port it listens on, `$6` the timer ([`TIMER`]), `$7` [`NO_CURL`]. A timer already
/// there is stopped first (its file removed).
///
/// Stdin holds the `Authorization` header's value for OpenCode, then one line per open turn,
/// `<seconds left> <path of its abort>`, which the timer gets through a pipe: neither is on a
/// command line or in an environment, which a worker's other processes can read. Where the
/// worker has no `curl` to send the aborts with, it says so ([`NO_CURL`]) and the
/// timer holds only the grace period's end.
const LINGER: &str = "umask 077; kill -0 \"$1\" 2>/dev/null || exit 96; f=\"$3\"; rm -f \"$f\"; \
    IFS= read -r h; d=$(cat); \
    if [ -n \"$d\" ] && ! command -v curl >/dev/null 2>&1; then echo \"$7\"; d=; fi; \
    printf '%s\\n%s\\n' \"$h\" \"$d\" | nohup sh -c \"$6\" linger \"$2\" \"$1\" \"$f\" \"$4\" \"$5\" \
    >/dev/null 2>&1 & echo $! > \"$f\"";

/// The linger timer itself, started by [`LINGER`]: `$1` the grace period in seconds, `$2`
/// OpenCode's pid, `$3` its file, `$4` the worker's root, `$5` OpenCode's port; stdin as
/// [`LINGER`] passes it on.
///
/// It checks every second that OpenCode still runs and that its file still names it; it
/// ends as soon as either is no longer so, and never signals a pid it has not just seen alive
/// (a pid reused after OpenCode ended must not be hit: on a busy machine pids come round within
/// seconds). Each open turn's session is aborted once its seconds have passed (`POST` to
/// OpenCode on the worker's loopback), so a task's `timeouts.task` holds while no gateway
/// runs. When the grace period passes, OpenCode gets SIGTERM, and, if still there 5 s later,
/// its whole process group SIGKILL: OpenCode's npm launcher runs the real server as its child,
/// which a SIGKILL of the launcher alone leaves running (OpenCode leads its group: the serve
/// session's shell `exec`s it, and sshd starts each session in a new one). Then the agents'
/// commands it left are stopped: OpenCode starts each in a session of its own, through the
/// confining shell under the root, which runs on once OpenCode is gone (measured: a command
/// waiting on a file outlived it).
const TIMER: &str = "IFS= read -r h; d=$(cat); i=0; \
    while sleep 1 && kill -0 \"$2\" 2>/dev/null && [ \"$(cat \"$3\" 2>/dev/null)\" = \"$$\" ]; do \
      i=$((i + 1)); \
      if [ -n \"$d\" ]; then d=$(printf '%s\\n' \"$d\" | while read -r s u; do \
        [ -n \"$u\" ] || continue; \
        if [ \"$s\" -le \"$i\" ]; then \
          printf 'header = \"Authorization: %s\"\\n' \"$h\" | \
            curl -s -m 10 -o /dev/null -X POST -K - \"http://127.0.0.1:$5$u\" >/dev/null 2>&1; \
        else echo \"$s $u\"; fi; done); fi; \
      [ \"$i\" -ge \"$1\" ] || continue; rm -f \"$3\"; \
      kill -TERM \"$2\" 2>/dev/null; j=0; \
      while [ \"$j\" -lt 5 ] && kill -0 \"$2\" 2>/dev/null; do sleep 1; j=$((j + 1)); done; \
      if kill -0 \"$2\" 2>/dev/null; then kill -KILL -\"$2\" 2>/dev/null; kill -KILL \"$2\" 2>/dev/null; fi; \
      ps -eo pid=,args= | while read -r p a; do case \"$a\" in \
        *\" $4/sandbox/shell \"*) kill -KILL -\"$p\" 2>/dev/null; kill -KILL \"$p\" 2>/dev/null;; \
      esac; done; exit 0; \
    done; [ \"$(cat \"$3\" 2>/dev/null)\" = \"$$\" ] && rm -f \"$3\"";

/// What [`LINGER`] prints when the worker has no `curl`.
const NO_CURL: &str = "opencode-mcp-no-curl";

/// [`LINGER`]'s stdin: the `Authorization` header's value, then `<seconds left> <abort path>`
/// for each open turn (one whose session id or directory could not be sent is left out: its
/// deadline is then the grace period's end).
fn linger_input(password: &str, open: &[OpenTurn]) -> String {
    let mut input = format!(
        "{}\n",
        crate::opencode::basic_auth_header(crate::opencode::AUTH_USER, password)
    );
    for turn in open {
        if let Some(target) = turn.abort_target() {
            input.push_str(&format!("{} {target}\n", turn.left_secs()));
        }
    }
    input
}

/// SIGTERM to the OpenCode at `pid` on the worker, only while that pid is still a process
/// serving on `port`: it may have ended on its own since (a hostile agent can kill it), and on
/// a busy machine its pid soon belongs to another process of the user's. `false` when the
/// worker could not be reached.
async fn stop_serving(remote: &Remote, pid: u32, port: u16) -> bool {
    // `ps` first; where it has no `-p` (busybox), the process's own command line.
    const STOP: &str = "a=$(ps -o args= -p \"$1\" 2>/dev/null) || \
                        a=$(tr '\\000' ' ' 2>/dev/null < \"/proc/$1/cmdline\"); \
                        case \"$a\" in *\"--port $2\"*) kill \"$1\";; esac";
    if pid <= 1 {
        return true;
    }
    let (pid, port) = (pid.to_string(), port.to_string());
    remote
        .ssh
        .run(
            &["sh", "-c", STOP, "sh", &pid, &port],
            None,
            Duration::from_secs(10),
        )
        .await
        .is_ok()
}

/// The file on the worker that keeps the linger timer's pid, under the OpenCode's directory
/// (the worker's root, made by the gateway and out of its agents' reach).
fn timer_file(directory: &str) -> String {
    format!("{}/linger.pid", directory.trim_end_matches('/'))
}

/// [`WATCH`]'s exit status when the process is gone.
const GONE: i32 = 96;

/// Ports tried on the worker before giving up.
const PORT_ATTEMPTS: usize = 3;

/// How long a session that failed may take to end once killed, and its stderr to be read.
const END_WAIT: Duration = Duration::from_secs(5);

/// Options of every forwarding session: a forward that cannot be bound here ends the session
/// (another local process on the port would otherwise receive the password and the prompts).
const FORWARD_STRICT: &[&str] = &["-o", "ExitOnForwardFailure=yes"];

/// Ends a session that failed: killed, waited for a bounded time, and what it said on stderr.
async fn end_session(
    session: &mut Child,
    stderr: tokio::task::JoinHandle<String>,
) -> (Option<i32>, String) {
    let status = match tokio::time::timeout(END_WAIT, session.wait()).await {
        Ok(Ok(status)) => status.code(),
        _ => {
            let _ = session.start_kill();
            let _ = tokio::time::timeout(END_WAIT, session.wait()).await;
            None
        }
    };
    let said = tokio::time::timeout(END_WAIT, stderr)
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or_default();
    (status, crate::config::printable(said.trim()).into_owned())
}

/// What starting OpenCode on a worker can fail with.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Ssh(#[from] SshError),
    /// Its tasks were to run confined, and cannot.
    #[error(transparent)]
    Sandbox(#[from] super::sandbox::SandboxError),
    #[error("OpenCode on worker {worker} did not start: {detail}")]
    Failed { worker: String, detail: String },
    #[error("cannot make a password for OpenCode on worker {0}: no randomness")]
    NoSecret(String),
    /// The worker answers, but the OpenCode being reached again is no longer running there.
    #[error("OpenCode on worker {worker} (pid {pid}) is no longer running")]
    Gone { worker: String, pid: u32 },
}

/// What a gateway keeps of a worker's OpenCode, in a private file of its state directory, to
/// reach it again after the gateway itself was killed: OpenCode there outlives the ssh session
/// that started it, and the tasks it runs go on.
#[derive(Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Saved {
    pub worker: String,
    pub remote_port: u16,
    pub remote_pid: u32,
    pub password: String,
    pub directory: String,
    /// The gateway that started (or last reached) it.
    pub gateway_pid: u32,
    /// Its confining shell there (`None`: it was started unconfined).
    #[serde(default)]
    pub shell: Option<String>,
}

impl std::fmt::Debug for Saved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Debug output ends up in logs; the password never does.
        f.debug_struct("Saved")
            .field("worker", &self.worker)
            .field("remote_port", &self.remote_port)
            .field("remote_pid", &self.remote_pid)
            .field("directory", &self.directory)
            .field("gateway_pid", &self.gateway_pid)
            .field("shell", &self.shell)
            .finish_non_exhaustive()
    }
}

/// A worker's OpenCode, reachable here at [`Self::url`] with [`Self::password`] while the
/// serve session lives.
#[derive(Debug)]
pub struct RemoteServe {
    /// `http://127.0.0.1:<local port>`: the forward's end here.
    pub url: String,
    pub password: String,
    /// The port OpenCode listens on there (loopback).
    pub remote_port: u16,
    /// OpenCode's pid there.
    pub remote_pid: u32,
    /// The directory it serves from, absolute (as the API's `directory` wants it).
    pub directory: String,
    /// Its confining shell there, if it has one.
    pub shell: Option<String>,
    session: Child,
}

impl RemoteServe {
    /// Starts OpenCode on `remote`, serving from `directory` there, within `within`, with
    /// `shell` (an absolute path there, [`super::sandbox::is_plain_absolute`]) as the shell of
    /// its bash tool when given.
    pub async fn start(
        worker: &str,
        remote: &Remote,
        directory: &str,
        shell: Option<&str>,
        within: Duration,
    ) -> Result<Self, ServeError> {
        if let Some(shell) = shell.filter(|s| !super::sandbox::is_plain_absolute(s)) {
            return Err(ServeError::Failed {
                worker: worker.to_string(),
                detail: format!("its confining shell `{shell}` is not a plain absolute path"),
            });
        }
        let password =
            crate::ids::secret().map_err(|_| ServeError::NoSecret(worker.to_string()))?;
        let mut last = String::new();
        for _ in 0..PORT_ATTEMPTS {
            let remote_port = random_port();
            let attempt = Self::start_on(
                worker,
                remote,
                (directory, shell),
                &password,
                remote_port,
                within,
            );
            match attempt.await {
                Ok(serve) => return Ok(serve),
                Err(Attempt::PortTaken(detail)) => last = detail,
                Err(Attempt::Failed(e)) => return Err(e),
            }
        }
        Err(ServeError::Failed {
            worker: worker.to_string(),
            detail: format!("no free port after {PORT_ATTEMPTS} tries: {last}"),
        })
    }

    async fn start_on(
        worker: &str,
        remote: &Remote,
        (directory, shell): (&str, Option<&str>),
        password: &str,
        remote_port: u16,
        within: Duration,
    ) -> Result<Self, Attempt> {
        let failed = |detail: String| {
            Attempt::Failed(ServeError::Failed {
                worker: worker.to_string(),
                detail,
            })
        };
        let local_port =
            crate::opencode::free_port("127.0.0.1").map_err(|e| failed(e.to_string()))?;
        let port = remote_port.to_string();
        let shell_arg = shell.unwrap_or_default();
        let argv = [
            "sh",
            "-c",
            SERVE,
            "sh",
            &remote.opencode,
            &port,
            directory,
            shell_arg,
        ];
        let forward = format!("127.0.0.1:{local_port}:127.0.0.1:{remote_port}");
        let mut cmd = remote.ssh.command_with(
            &[FORWARDING, FORWARD_STRICT, &["-L", &forward]].concat(),
            &argv,
        );
        cmd.stdin(Stdio::piped());
        let mut session = cmd
            .spawn()
            .map_err(|e| Attempt::Failed(ServeError::Ssh(SshError::NoClient(e))))?;
        if let Some(mut stdin) = session.stdin.take() {
            let line = format!("{password}\n");
            // An ssh that could not connect may be gone before the password is written: its
            // exit, read below, says why; the broken pipe says nothing.
            if let Err(e) = stdin.write_all(line.as_bytes()).await {
                tracing::debug!(worker, error = %e, "the serve session took no password");
            }
        }
        let (Some(stdout), Some(stderr)) = (session.stdout.take(), session.stderr.take()) else {
            return Err(failed("no output from the session".into()));
        };
        // What the worker prints is read as hostile: any bytes, bounded lines, stderr drained
        // (a full pipe would stall ssh) and only its end kept.
        let stderr = tokio::spawn(read_tail(stderr, STDERR_KEPT));
        let mut lines = BufReader::new(stdout);
        let mut seen: Vec<String> = Vec::new();
        let mut pid = 0;
        let mut served = String::new();
        let ready = tokio::time::timeout(within, async {
            while let Some(line) = read_line_capped(&mut lines, LINE_LIMIT).await {
                if let Some(p) = line.strip_prefix("opencode-mcp-pid=") {
                    pid = p.trim().parse().unwrap_or(0);
                    continue;
                }
                if let Some(d) = line.strip_prefix("opencode-mcp-dir=") {
                    served = d.to_string();
                    continue;
                }
                if crate::opencode::parse_listening_line(&line).is_some() {
                    return true;
                }
                if seen.len() < 20 {
                    seen.push(line.chars().take(500).collect());
                }
            }
            false
        })
        .await;
        let said = crate::config::printable_lines(&seen.join("\n")).into_owned();
        match ready {
            Ok(true) => {}
            Ok(false) => {
                let (status, stderr) = end_session(&mut session, stderr).await;
                // A forward that could not be bound here (`ExitOnForwardFailure`): another
                // local process took the port; try another.
                if stderr.contains("forwarding failed") || stderr.contains("cannot listen") {
                    return Err(Attempt::PortTaken(stderr));
                }
                // 255 is ssh's own failure (no connection, no login); a command that ran
                // passes its own status through.
                if status == Some(super::ssh::SSH_FAILED) {
                    return Err(Attempt::Failed(ServeError::Ssh(SshError::Unreachable {
                        destination: remote.ssh.destination().to_string(),
                        detail: stderr,
                    })));
                }
                if status == Some(95) {
                    return Err(failed(format!(
                        "its confining shell {shell_arg} is missing there"
                    )));
                }
                // OpenCode names a port it cannot bind only as a `ServeError`.
                if said.contains("ServeError") || said.contains("EADDRINUSE") {
                    return Err(Attempt::PortTaken(said));
                }
                return Err(failed(format!(
                    "`{} serve` exited before it was ready: {}",
                    remote.opencode,
                    if said.is_empty() { stderr } else { said }
                )));
            }
            Err(_) => {
                let _ = session.start_kill();
                let (_, stderr) = end_session(&mut session, stderr).await;
                return Err(failed(format!(
                    "no `listening on` line within {within:?}: {said}{}",
                    if stderr.is_empty() {
                        String::new()
                    } else {
                        format!(" (ssh said: {stderr})")
                    }
                )));
            }
        }
        // The worker's word for its root becomes the directory of every session and worktree
        // there: an absolute path of plain characters, or nothing is used.
        if !served.starts_with('/') || served.chars().any(char::is_control) {
            if pid > 1 {
                let pid = pid.to_string();
                let _ = remote
                    .ssh
                    .run(&["kill", &pid], None, Duration::from_secs(10))
                    .await;
            }
            let _ = session.start_kill();
            return Err(failed(format!(
                "it reported `{served}` as its directory, which is not an absolute path"
            )));
        }
        // OpenCode's further output is not read: keep the pipe drained so it never blocks.
        tokio::spawn(
            async move { while read_line_capped(&mut lines, LINE_LIMIT).await.is_some() {} },
        );
        let url = format!("http://127.0.0.1:{local_port}");
        wait_forwarded(local_port, within)
            .await
            .map_err(|detail| failed(format!("the forward to it did not open: {detail}")))?;
        Ok(Self {
            url,
            password: password.to_string(),
            remote_port,
            remote_pid: pid,
            directory: served,
            shell: shell.map(str::to_string),
            session,
        })
    }

    /// The port of the forward's end here.
    pub fn local_port(&self) -> Option<u16> {
        self.url.rsplit(':').next()?.parse().ok()
    }

    /// What to keep to reach it again ([`Saved`]).
    pub fn saved(&self, worker: &str) -> Saved {
        Saved {
            worker: worker.to_string(),
            remote_port: self.remote_port,
            remote_pid: self.remote_pid,
            password: self.password.clone(),
            directory: self.directory.clone(),
            gateway_pid: std::process::id(),
            shell: self.shell.clone(),
        }
    }

    /// Reaches again the OpenCode a killed gateway started on `remote` ([`Saved`]): a new
    /// session forwards a port here to it, and lives as long as that OpenCode does. Fails when
    /// the worker cannot be reached or the process is gone; whether the process is still that
    /// OpenCode is for the caller to prove (its password).
    /// `local_port`: the port to forward from here (the one a dropped session used, so the
    /// clients of its URL carry on), else a free one.
    pub async fn reattach(
        worker: &str,
        remote: &Remote,
        saved: &Saved,
        within: Duration,
        local_port: Option<u16>,
    ) -> Result<Self, ServeError> {
        let failed = |detail: String| ServeError::Failed {
            worker: worker.to_string(),
            detail,
        };
        let local_port = match local_port {
            Some(port) => port,
            None => crate::opencode::free_port("127.0.0.1").map_err(|e| failed(e.to_string()))?,
        };
        let pid = saved.remote_pid.to_string();
        let forward = format!("127.0.0.1:{local_port}:127.0.0.1:{}", saved.remote_port);
        let extra = [FORWARDING, FORWARD_STRICT, &["-L", &forward]].concat();
        let timer = timer_file(&saved.directory);
        let argv = ["sh", "-c", WATCH, "sh", &pid, &timer];
        let mut session = remote
            .ssh
            .command_with(&extra, &argv)
            .spawn()
            .map_err(|e| ServeError::Ssh(SshError::NoClient(e)))?;
        let (Some(stdout), Some(stderr)) = (session.stdout.take(), session.stderr.take()) else {
            return Err(failed("no output from the session".into()));
        };
        let stderr = tokio::spawn(read_tail(stderr, STDERR_KEPT));
        let mut lines = BufReader::new(stdout);
        let attached = tokio::time::timeout(within, async {
            while let Some(line) = read_line_capped(&mut lines, LINE_LIMIT).await {
                if line == "opencode-mcp-attached" {
                    return true;
                }
            }
            false
        })
        .await;
        match attached {
            Ok(true) => {}
            Ok(false) => {
                let (status, stderr) = end_session(&mut session, stderr).await;
                return Err(match status {
                    Some(super::ssh::SSH_FAILED) => ServeError::Ssh(SshError::Unreachable {
                        destination: remote.ssh.destination().to_string(),
                        detail: stderr,
                    }),
                    Some(GONE) => ServeError::Gone {
                        worker: worker.to_string(),
                        pid: saved.remote_pid,
                    },
                    _ => failed(format!("the session to it ended: {stderr}")),
                });
            }
            Err(_) => {
                let _ = session.start_kill();
                let _ = end_session(&mut session, stderr).await;
                return Err(failed(format!("no answer within {within:?}")));
            }
        }
        tokio::spawn(
            async move { while read_line_capped(&mut lines, LINE_LIMIT).await.is_some() {} },
        );
        wait_forwarded(local_port, within)
            .await
            .map_err(|detail| failed(format!("the forward to it did not open: {detail}")))?;
        Ok(Self {
            url: format!("http://127.0.0.1:{local_port}"),
            password: saved.password.clone(),
            remote_port: saved.remote_port,
            remote_pid: saved.remote_pid,
            directory: saved.directory.clone(),
            shell: saved.shell.clone(),
            session,
        })
    }

    /// Stops an OpenCode known only from what was saved of it (a killed gateway's, that no
    /// task needs any more; one left running through a lost period). Its sessions end with it.
    /// `false` when the worker could not be reached (nothing was done).
    pub async fn stop_saved(remote: &Remote, saved: &Saved) -> bool {
        stop_serving(remote, saved.remote_pid, saved.remote_port).await
    }

    /// Stops OpenCode there (SIGTERM over a new connection), then the session ends.
    pub async fn stop(mut self, remote: &Remote) {
        stop_serving(remote, self.remote_pid, self.remote_port).await;
        let _ = self.session.start_kill();
        let _ = tokio::time::timeout(END_WAIT, self.session.wait()).await;
    }

    /// Lets OpenCode there run on for `grace` after this gateway is gone (it exits cleanly while
    /// tasks run there), then stop, unless a gateway reaches it again first: the session here
    /// ends, OpenCode and its saved file stay. Each of the `open` turns is aborted at its
    /// deadline meanwhile (see [`TIMER`]); `Ok(false)` when the worker cannot send those aborts
    /// (no `curl` there), so only the grace period's end holds.
    pub async fn linger(
        mut self,
        remote: &Remote,
        grace: Duration,
        open: &[OpenTurn],
    ) -> Result<bool, SshError> {
        let (pid, secs, port) = (
            self.remote_pid.to_string(),
            grace.as_secs().max(1).to_string(),
            self.remote_port.to_string(),
        );
        let timer = timer_file(&self.directory);
        let input = linger_input(&self.password, open);
        let out = remote
            .ssh
            .run(
                &[
                    "sh",
                    "-c",
                    LINGER,
                    "sh",
                    &pid,
                    &secs,
                    &timer,
                    &self.directory,
                    &port,
                    TIMER,
                    NO_CURL,
                ],
                Some(input.as_bytes()),
                Duration::from_secs(10),
            )
            .await;
        let _ = self.session.start_kill();
        let _ = tokio::time::timeout(END_WAIT, self.session.wait()).await;
        out.map(|o| !o.stdout.contains(NO_CURL))
    }

    /// Whether the serve session (and so the forward) still runs.
    pub fn alive(&mut self) -> bool {
        matches!(self.session.try_wait(), Ok(None))
    }
}

enum Attempt {
    PortTaken(String),
    Failed(ServeError),
}

/// A port for OpenCode on the worker, from the dynamic range.
fn random_port() -> u16 {
    let mut b = [0u8; 2];
    let r = getrandom::fill(&mut b)
        .map(|_| u16::from_le_bytes(b))
        .unwrap_or(7919);
    20_000 + r % 30_000
}

/// Waits until the forward's local end accepts connections (ssh binds it right after the
/// connection is authenticated, and OpenCode is already listening).
async fn wait_forwarded(port: u16, within: Duration) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + within;
    let mut last = String::new();
    while tokio::time::Instant::now() < deadline {
        match tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
            Ok(_) => return Ok(()),
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What is saved to reach a worker's OpenCode again prints without its password (debug
    /// output ends up in logs).
    #[test]
    fn saved_serves_print_without_their_password() {
        let saved = Saved {
            worker: "w1".into(),
            remote_port: 23_456,
            remote_pid: 4_321,
            password: "hunter2-not-for-logs".into(),
            directory: "/srv/mcp".into(),
            gateway_pid: 99,
            shell: Some("/srv/mcp/sandbox/shell".into()),
        };
        let printed = format!("{saved:?}");
        assert!(!printed.contains("hunter2"), "{printed}");
        assert!(
            printed.contains("w1") && printed.contains("23456") && printed.contains("4321"),
            "{printed}"
        );
        let back: Saved =
            serde_json::from_slice(&serde_json::to_vec(&saved).expect("json")).expect("read back");
        assert_eq!(back, saved);
    }

    fn turn(left_ms: u64, session: &str, directory: &str) -> OpenTurn {
        OpenTurn {
            left: Duration::from_millis(left_ms),
            session_id: session.into(),
            directory: directory.into(),
        }
    }

    /// The linger timer's input: the header first, then each open turn it can abort, its
    /// seconds rounded up (never early) and its directory encoded; a session id OpenCode
    /// would not make (it comes from OpenCode's answers) or a relative directory is left out.
    #[test]
    fn the_linger_input_names_each_turn_it_can_abort() {
        let input = linger_input(
            "pw",
            &[
                turn(15_200, "ses_1", "/w/a b&c"),
                turn(3_000, "ses_2; rm -rf ~", "/w"),
                turn(3_000, "ses_3", "w"),
                turn(0, "ses-4", "/w"),
            ],
        );
        let header = crate::opencode::basic_auth_header("opencode", "pw");
        assert_eq!(
            input,
            format!(
                "{header}\n16 /session/ses_1/abort?directory=%2Fw%2Fa+b%26c\n\
                 0 /session/ses-4/abort?directory=%2Fw\n"
            )
        );
    }

    /// A process to stand for OpenCode, ended when dropped.
    struct Standing(std::process::Child);

    impl Standing {
        fn start() -> Self {
            Self(
                std::process::Command::new("sleep")
                    .arg("60")
                    .spawn()
                    .expect("sleep runs"),
            )
        }
    }

    impl Drop for Standing {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    /// Runs [`LINGER`] here as a worker's shell would, with `input` on its stdin and `path`
    /// as its `PATH`; what it printed.
    fn run_linger(pid: u32, dir: &std::path::Path, port: u16, input: &str, path: &str) -> String {
        use std::io::Write;
        let timer = timer_file(&dir.display().to_string());
        let mut child = std::process::Command::new("/bin/sh")
            .args(["-c", LINGER, "sh", &pid.to_string(), "30", &timer])
            .arg(dir)
            .args([&port.to_string(), TIMER, NO_CURL])
            .env("PATH", path)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("sh runs");
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(input.as_bytes()).expect("input written");
        drop(stdin);
        let out = child.wait_with_output().expect("it ends");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The timer on the worker aborts a turn at its deadline: a `POST` of its abort path to
    /// OpenCode's port on the loopback, with the password's header, which is on no command
    /// line of the timer's (other users of the worker read those).
    #[test]
    fn the_linger_timer_aborts_a_turn_at_its_deadline() {
        use std::io::{BufRead, BufReader};
        if std::process::Command::new("curl")
            .arg("--version")
            .output()
            .is_err()
        {
            panic!("this test needs curl (apt-get install curl)");
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let opencode = Standing::start();
        let path = std::env::var("PATH").unwrap_or_default();
        let input = linger_input("secret-pw", &[turn(1_000, "ses_1", "/w")]);
        let said = run_linger(opencode.0.id(), dir.path(), port, &input, &path);
        assert!(!said.contains(NO_CURL), "{said}");
        let timer: u32 = std::fs::read_to_string(dir.path().join("linger.pid"))
            .expect("the timer's file")
            .trim()
            .parse()
            .expect("a pid");
        let line = std::fs::read(format!("/proc/{timer}/cmdline")).expect("the timer runs");
        let header = input.lines().next().unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&line).contains(header),
            "the header is on the timer's command line"
        );

        listener.set_nonblocking(true).expect("nonblocking");
        let until = std::time::Instant::now() + Duration::from_secs(20);
        let stream = loop {
            match listener.accept() {
                Ok((stream, _)) => break stream,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    assert!(std::time::Instant::now() < until, "no abort within 20 s");
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => panic!("accept: {e}"),
            }
        };
        stream.set_nonblocking(false).expect("blocking");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let mut request = String::new();
        let mut reader = BufReader::new(stream);
        while reader
            .read_line(&mut request)
            .map(|n| n > 2)
            .unwrap_or(false)
        {}
        assert!(
            request.starts_with("POST /session/ses_1/abort?directory=%2Fw HTTP/1.1\r\n"),
            "{request}"
        );
        assert!(
            request.contains(&format!("Authorization: {header}\r\n")),
            "{request}"
        );
        // Its file removed, the timer ends within a second or so, signalling nothing.
        let _ = std::fs::remove_file(dir.path().join("linger.pid"));
    }

    /// A worker without `curl` says so when there are deadlines to hold (the gateway then
    /// warns that only the grace period's end holds), and not when there are none.
    #[test]
    fn a_worker_without_curl_says_so() {
        let dir = tempfile::tempdir().expect("tempdir");
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).expect("bin");
        for tool in ["rm", "cat", "nohup", "sh", "sleep", "ps"] {
            let found = ["/bin", "/usr/bin"]
                .iter()
                .map(|d| std::path::Path::new(d).join(tool))
                .find(|p| p.exists())
                .unwrap_or_else(|| panic!("no {tool} in /bin or /usr/bin"));
            std::os::unix::fs::symlink(found, bin.join(tool)).expect("symlink");
        }
        let path = bin.display().to_string();
        let opencode = Standing::start();
        let with = linger_input("pw", &[turn(1_000, "ses_1", "/w")]);
        let said = run_linger(opencode.0.id(), dir.path(), 1, &with, &path);
        assert!(said.contains(NO_CURL), "{said:?}");
        let without = linger_input("pw", &[]);
        let said = run_linger(opencode.0.id(), dir.path(), 1, &without, &path);
        assert!(!said.contains(NO_CURL), "{said:?}");
        let _ = std::fs::remove_file(dir.path().join("linger.pid"));
    }

    /// Ports for OpenCode on a worker come from the dynamic range.
    #[test]
    fn worker_ports_are_in_the_dynamic_range() {
        for _ in 0..200 {
            assert!((20_000..50_000).contains(&random_port()));
        }
    }
}
