//! Supervision of one managed `opencode serve` child process.
//!
//! Facts this rests on (measured on OpenCode 1.18.33): the server prints `opencode server listening on
//! http://127.0.0.1:<port>` when ready, and requests sent before that line can hang forever, so
//! nothing is sent until it appears; `--port 0` prefers 4096 rather than a random port, so a free
//! port is picked here (and another one tried if OpenCode could not bind it); OpenCode reports a
//! taken port only as `ServeError`, so a failed start checks the port itself to say so.
//!
//! The child runs in its own process group so that stopping it stops the group. On Linux the
//! gateway runs OpenCode under its [supervisor](super::supervisor) (the same binary), which also
//! takes down the detached shells OpenCode's tools start; the supervisor is forked with
//! `PR_SET_PDEATHSIG` from [`spawn_child`]'s long-lived thread, so everything goes with the
//! gateway even when the gateway is SIGKILLed.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::{oneshot, watch};

use super::error::OpencodeError;
use crate::config::{OpenCodeConfig, PermissionPolicy};

// Stopping a managed server, in order (all bounded):
//
// 1. SIGTERM to the group; the supervisor passes it on to OpenCode, SIGKILLs it after its own
//    grace, and cleans up what OpenCode left: at most `supervisor::STOP_BOUND` (5 s).
// 2. `STOP_GRACE` after the SIGTERM, SIGKILL to the group. It is the supervisor's bound plus a
//    margin, so a supervisor that is doing its job is never killed mid-cleanup (which would
//    leave OpenCode's detached shells reparented to init).
// 3. `KILL_WAIT` for the exit to be seen; then `stop` returns whatever happened.
//
// So `stop` takes at most `STOP_GRACE + KILL_WAIT` (7 s); the gateway's shutdown bound
// (`gateway::SHUTDOWN_GRACE`, 10 s) covers that and the task store's flush (2 s).

/// Time the supervisor may use beyond its own bound before the gateway SIGKILLs it: scheduling
/// on a loaded machine, and one round of its cleanup loop past the deadline.
const STOP_MARGIN: Duration = Duration::from_secs(1);
/// How long a stopped server gets between SIGTERM and SIGKILL.
const STOP_GRACE: Duration = super::supervisor::STOP_BOUND.saturating_add(STOP_MARGIN);
/// How long the exit of a SIGKILLed group may take to be seen before `stop` stops waiting.
const KILL_WAIT: Duration = Duration::from_secs(1);
const _: () = assert!(
    STOP_GRACE.as_nanos() > super::supervisor::STOP_BOUND.as_nanos(),
    "the gateway must outwait the supervisor's own stop"
);
/// Lines of the child's output kept for error messages.
const OUTPUT_TAIL: usize = 20;
/// How long a server that exited early gets for its last output to be read.
const OUTPUT_DRAIN: Duration = Duration::from_secs(1);
/// Free ports tried when OpenCode cannot bind the one picked for it.
const PORT_ATTEMPTS: u32 = 3;

/// A failed start, and whether it failed because the port was taken.
struct SpawnFailure {
    error: OpencodeError,
    port_taken: bool,
}

impl From<OpencodeError> for SpawnFailure {
    fn from(error: OpencodeError) -> Self {
        Self {
            error,
            port_taken: false,
        }
    }
}

/// How the gateway holds the supervisor's lifeline: the pipe it started the supervisor with,
/// or, for a server taken over from a gateway that is gone, its connection to the supervisor's
/// socket (see [`super::linger`]). Dropping it ends the lifeline.
#[derive(Debug)]
enum Lifeline {
    Pipe(tokio::process::ChildStdin),
    Socket(tokio::net::unix::OwnedWriteHalf),
}

impl Lifeline {
    async fn send(&mut self, line: &str) -> std::io::Result<()> {
        use tokio::io::AsyncWriteExt;
        match self {
            Self::Pipe(pipe) => pipe.write_all(line.as_bytes()).await,
            Self::Socket(socket) => socket.write_all(line.as_bytes()).await,
        }
    }
}

/// A server's password, kept to hand the server over (see [`super::linger`]); never printed.
struct Password(String);

impl std::fmt::Debug for Password {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Password(..)")
    }
}

/// How long the supervisor gets to answer a linger request.
const LINGER_ANSWER: Duration = Duration::from_secs(2);

/// An open turn of a server that is let linger: its session is aborted at its deadline if no
/// gateway holds the server by then (see `supervisor`'s [`ABORT_REQUEST`](super::supervisor::ABORT_REQUEST)).
#[derive(Debug, Clone, PartialEq)]
pub struct OpenTurn {
    /// What is left of its `timeouts.task`.
    pub left: Duration,
    pub session_id: String,
    pub directory: String,
}

impl OpenTurn {
    /// Whole seconds left, rounded up: an abort at them is never before the deadline.
    pub fn left_secs(&self) -> u128 {
        self.left.as_millis().div_ceil(1000)
    }

    /// The path and query of this session's abort (`/session/<id>/abort?directory=<dir>`),
    /// or `None` when the session id is not one OpenCode makes (letters, digits, `_`, `-`;
    /// it comes from OpenCode's answers) or the directory is not absolute.
    pub fn abort_target(&self) -> Option<String> {
        abort_target(&self.session_id, &self.directory)
    }
}

/// See [`OpenTurn::abort_target`]; the supervisor's abort at a deadline builds the same.
pub(crate) fn abort_target(session: &str, directory: &str) -> Option<String> {
    let session_ok = !session.is_empty()
        && session.len() <= 128
        && session
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if !session_ok || !directory.starts_with('/') {
        return None;
    }
    let mut url = reqwest::Url::parse(&format!("http://127.0.0.1/session/{session}/abort")).ok()?;
    url.query_pairs_mut().append_pair("directory", directory);
    Some(format!(
        "{}?{}",
        url.path(),
        url.query().unwrap_or_default()
    ))
}

/// A running managed server.
#[derive(Debug)]
pub struct ManagedProcess {
    /// OpenCode's own pid.
    pub pid: u32,
    /// The process group the gateway started (led by the supervisor, or by OpenCode itself when
    /// it runs without one): stopping signals all of it.
    group: u32,
    pub url: String,
    /// `None` while running; `Some(description)` once the process has exited.
    exited: watch::Receiver<Option<String>>,
    /// The supervisor's lifeline: dropping it, or this process ending, tells the supervisor to
    /// stop OpenCode (unless it was asked to linger). Kept out of the child handle, whose
    /// `wait` would close it. `None` without a supervisor, or once let go.
    lifeline: tokio::sync::Mutex<Option<Lifeline>>,
    /// Whether the supervisor has said it lingers (its answer to a linger request).
    lingering: watch::Receiver<bool>,
    password: Password,
}

/// What to start.
pub struct SpawnRequest<'a> {
    pub config: &'a OpenCodeConfig,
    pub port: u16,
    pub directory: &'a Path,
    pub password: &'a str,
    pub start_timeout: Duration,
    /// The confining shell OpenCode runs its agents' commands with (`sandbox::server`); `None`
    /// leaves OpenCode's own.
    pub shell: Option<&'a Path>,
}

impl ManagedProcess {
    /// Spawns `opencode serve` and waits for its `listening on` line.
    ///
    /// With port 0 a free port is picked here; if OpenCode then fails to bind it (someone took it
    /// in between), another one is tried, up to [`PORT_ATTEMPTS`] times.
    pub async fn spawn(req: SpawnRequest<'_>) -> Result<Self, OpencodeError> {
        if req.port != 0 {
            return Self::spawn_on(&req, req.port).await.map_err(|f| f.error);
        }
        let mut attempt = 1;
        loop {
            let port = free_port(&req.config.hostname)?;
            match Self::spawn_on(&req, port).await {
                Ok(process) => return Ok(process),
                Err(f) if f.port_taken && attempt < PORT_ATTEMPTS => {
                    tracing::debug!(
                        port,
                        "the free port was taken before OpenCode bound it; trying another"
                    );
                    attempt += 1;
                }
                Err(f) => return Err(f.error),
            }
        }
    }

    async fn spawn_on(req: &SpawnRequest<'_>, port: u16) -> Result<Self, SpawnFailure> {
        let command = &req.config.command;
        let not_found = || {
            OpencodeError::Start(format!(
                "the `{command}` binary was not found: install OpenCode with `npm install -g \
                 opencode-ai`, or set opencode.command in delegation.yaml (or \
                 OPENCODE_MCP_OPENCODE__COMMAND) to the path of the `opencode` binary"
            ))
        };
        let supervisor = supervisor_program();
        let mut cmd = match supervisor {
            Some(program) => {
                // The supervisor would only report the missing binary after the fact.
                if !program_exists(command) {
                    return Err(not_found().into());
                }
                let mut cmd = Command::new(program);
                cmd.arg(super::supervisor::SUBCOMMAND)
                    .arg(super::supervisor::LIFELINE_FLAG)
                    .arg(command)
                    // The lifeline: only this process holds the other end (see `supervisor`).
                    .stdin(Stdio::piped())
                    // The lifeline and `PR_SET_PDEATHSIG` end it with the gateway, unless it was
                    // asked to linger: a kill as the child handle drops would defeat that.
                    .kill_on_drop(false);
                cmd
            }
            None => {
                let mut cmd = Command::new(command);
                cmd.stdin(Stdio::null()).kill_on_drop(true);
                cmd
            }
        };
        let content = merged_config_content(
            std::env::var("OPENCODE_CONFIG_CONTENT").ok().as_deref(),
            req.config.permission,
            req.shell,
        )?;
        cmd.arg("serve")
            .arg("--hostname")
            .arg(&req.config.hostname)
            .arg("--port")
            .arg(port.to_string())
            .current_dir(req.directory)
            .env("OPENCODE_SERVER_PASSWORD", req.password)
            .env("OPENCODE_CONFIG_CONTENT", content)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        // The supervisor cleans up on SIGTERM; OpenCode run directly just dies.
        #[cfg(target_os = "linux")]
        die_with_gateway(
            &mut cmd,
            if supervisor.is_some() {
                libc::SIGTERM
            } else {
                libc::SIGKILL
            },
        );
        let mut child = spawn_child(cmd).await.map_err(|e| {
            SpawnFailure::from(if e.kind() == std::io::ErrorKind::NotFound {
                not_found()
            } else {
                OpencodeError::Start(format!(
                    "spawning `{command}` failed: {e}; check opencode.command in delegation.yaml"
                ))
            })
        })?;
        let group = child.id().unwrap_or(0);
        let pid = group;
        let tail = Arc::new(Mutex::new(VecDeque::new()));
        // The supervisor names OpenCode's pid on stderr first thing.
        let (pid_tx, pid_rx) = oneshot::channel::<u32>();
        let (ready_tx, mut ready_rx) = tokio::sync::mpsc::channel::<String>(1);
        let (lingering_tx, lingering) = watch::channel(false);

        let lifeline = child.stdin.take();
        let mut readers = Vec::new();
        if let Some(stdout) = child.stdout.take() {
            let tail = tail.clone();
            readers.push(tokio::spawn(async move {
                let mut lines = BufReader::new(stdout).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    let line = strip_ansi(&line);
                    if let Some(url) = parse_listening_line(&line) {
                        let _ = ready_tx.try_send(url);
                    }
                    tracing::debug!(target: "opencode", pid, "{line}");
                    push_tail(&tail, line);
                }
            }));
        }
        if let Some(stderr) = child.stderr.take() {
            let tail = tail.clone();
            readers.push(tokio::spawn(async move {
                let mut lines = BufReader::new(stderr).lines();
                let mut pid_tx = Some(pid_tx);
                while let Ok(Some(line)) = lines.next_line().await {
                    let line = strip_ansi(&line);
                    if let Some(n) = line
                        .strip_prefix(super::supervisor::PID_LINE_PREFIX)
                        .and_then(|n| n.trim().parse().ok())
                    {
                        if let Some(tx) = pid_tx.take() {
                            let _ = tx.send(n);
                        }
                        continue;
                    }
                    if line == super::supervisor::LINGERING_LINE {
                        lingering_tx.send_replace(true);
                        continue;
                    }
                    tracing::debug!(target: "opencode", pid, "{line}");
                    push_tail(&tail, line);
                }
            }));
        }

        let (exit_tx, exit_rx) = watch::channel(None);
        tokio::spawn(async move {
            let description = match child.wait().await {
                Ok(status) => describe_exit(status),
                Err(e) => format!("waiting for it failed: {e}"),
            };
            // Whatever is left in the group goes with it. A process group outlives its leader
            // only while it has members, so its id cannot have been reused yet.
            kill_group(group, libc::SIGKILL);
            let _ = exit_tx.send(Some(description));
        });

        let mut exited = exit_rx.clone();
        let url = tokio::select! {
            url = ready_rx.recv() => url,
            _ = exited.wait_for(|e| e.is_some()) => None,
            _ = tokio::time::sleep(req.start_timeout) => {
                kill_group(group, libc::SIGKILL);
                return Err(OpencodeError::Start(format!(
                    "`{} serve` printed no `listening on` line within {} (timeouts.server_start); \
                     raise timeouts.server_start if this machine is slow{}",
                    req.config.command,
                    humantime::format_duration(req.start_timeout),
                    tail_text(&tail)
                )).into());
            }
        };
        match url {
            Some(url) => {
                let pid = if supervisor.is_some() {
                    // Printed long before the listening line; bounded all the same.
                    match tokio::time::timeout(OUTPUT_DRAIN, pid_rx).await {
                        Ok(Ok(pid)) => pid,
                        _ => pid,
                    }
                } else {
                    pid
                };
                Ok(Self {
                    pid,
                    group,
                    url,
                    exited: exit_rx,
                    lifeline: tokio::sync::Mutex::new(lifeline.map(Lifeline::Pipe)),
                    lingering,
                    password: Password(req.password.to_string()),
                })
            }
            None => {
                // Let the readers drain what the process printed last (its error, usually).
                let _ =
                    tokio::time::timeout(OUTPUT_DRAIN, futures::future::join_all(readers)).await;
                let how = exit_rx.borrow().clone().unwrap_or_default();
                let port_taken = port_in_use(&req.config.hostname, port);
                let hint = if port_taken {
                    format!(
                        ": port {port} on {} is already in use by another process; pass another \
                         `port` to opencode_start_server (or omit it, or set opencode.port to 0, \
                         for a free one)",
                        req.config.hostname
                    )
                } else {
                    String::new()
                };
                Err(SpawnFailure {
                    error: OpencodeError::Start(format!(
                        "`{} serve --port {port}` {how} before it was ready{hint}{}",
                        req.config.command,
                        tail_text(&tail)
                    )),
                    port_taken,
                })
            }
        }
    }

    /// Takes over a server whose gateway is gone while it lingers: connects to its
    /// supervisor's `socket` (the connection is the lifeline from now on) and reads its answer,
    /// within `within`. The supervisor's pid comes from the kernel (the socket's peer), not from
    /// any file; its end is seen as the connection's end.
    pub async fn attach(
        socket: &Path,
        url: String,
        password: String,
        within: Duration,
    ) -> Result<Self, String> {
        let stream = tokio::time::timeout(within, tokio::net::UnixStream::connect(socket))
            .await
            .map_err(|_| format!("{} did not answer within {within:?}", socket.display()))?
            .map_err(|e| format!("cannot connect to {}: {e}", socket.display()))?;
        let supervisor = stream
            .peer_cred()
            .ok()
            .and_then(|c| c.pid())
            .and_then(|p| u32::try_from(p).ok())
            .filter(|p| *p > 1)
            .ok_or_else(|| format!("no process behind {}", socket.display()))?;
        let (read, write) = stream.into_split();
        let mut lines = BufReader::new(read).lines();
        let first = tokio::time::timeout(within, lines.next_line())
            .await
            .map_err(|_| format!("the supervisor at {} said nothing", socket.display()))?
            .map_err(|e| e.to_string())?
            .unwrap_or_default();
        let pid = first
            .strip_prefix(super::supervisor::ATTACHED_LINE)
            .and_then(|p| p.trim().parse::<u32>().ok())
            .filter(|p| *p > 1)
            .ok_or_else(|| format!("not a supervisor's answer: {first:?}"))?;
        let (lingering_tx, lingering) = watch::channel(false);
        let (exit_tx, exited) = watch::channel(None);
        tokio::spawn(async move {
            loop {
                match lines.next_line().await {
                    Ok(Some(line)) if line == super::supervisor::LINGERING_LINE => {
                        lingering_tx.send_replace(true);
                    }
                    Ok(Some(line)) => tracing::debug!(target: "opencode", pid, "{line}"),
                    Ok(None) | Err(_) => break,
                }
            }
            let _ = exit_tx.send(Some("ended (its supervisor is gone)".to_string()));
        });
        Ok(Self {
            pid,
            group: supervisor,
            url,
            exited,
            lifeline: tokio::sync::Mutex::new(Some(Lifeline::Socket(write))),
            lingering,
            password: Password(password),
        })
    }

    /// The server's password (to hand it over to the next gateway).
    pub(crate) fn password(&self) -> &str {
        &self.password.0
    }

    /// Asks the supervisor to let OpenCode run on for `grace` once the lifeline ends, listening
    /// on `socket` for the next gateway, then lets go of the lifeline (the grace period starts
    /// now). On an error nothing changed: the lifeline is kept, and stopping works as before.
    pub async fn linger(
        &self,
        grace: Duration,
        socket: &Path,
        deadlines: &[OpenTurn],
    ) -> Result<(), String> {
        let mut lifeline = self.lifeline.lock().await;
        let Some(line) = lifeline.as_mut() else {
            return Err("no lifeline: it runs without a supervisor, or was let go".into());
        };
        let mut request = String::new();
        // Each open turn's deadline first, so the supervisor holds them once it lingers. A
        // directory that would break the line (a newline in it) is left out: that turn's
        // deadline is then the linger's end, as before.
        for turn in deadlines
            .iter()
            .filter(|t| !t.directory.contains(['\n', '\r']))
        {
            request.push_str(&format!(
                "{} {} {} {}\n",
                super::supervisor::ABORT_REQUEST,
                turn.left_secs(),
                turn.session_id,
                turn.directory
            ));
        }
        request.push_str(&format!(
            "{} {} {}\n",
            super::supervisor::LINGER_REQUEST,
            grace.as_secs().max(1),
            socket.display()
        ));
        let mut answered = self.lingering.clone();
        let asked = async {
            line.send(&request).await.map_err(|e| e.to_string())?;
            answered
                .wait_for(|lingering| *lingering)
                .await
                .map(|_| ())
                .map_err(|_| "the supervisor ended".to_string())
        };
        match tokio::time::timeout(LINGER_ANSWER, asked).await {
            Ok(Ok(())) => {
                lifeline.take();
                Ok(())
            }
            Ok(Err(e)) => Err(e),
            Err(_) => Err(format!(
                "the supervisor did not answer within {LINGER_ANSWER:?}"
            )),
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

    /// SIGTERM to the process group, then SIGKILL after [`STOP_GRACE`]; waits for the exit, at
    /// most [`STOP_GRACE`] + [`KILL_WAIT`] in all (see the comment on the constants for the
    /// order).
    pub async fn stop(&self) -> String {
        if let Some(done) = self.exit_status() {
            return done;
        }
        kill_group(self.group, libc::SIGTERM);
        if let Ok(how) = tokio::time::timeout(STOP_GRACE, self.wait_exit()).await {
            // Children of the server that ignored SIGTERM go too.
            kill_group(self.group, libc::SIGKILL);
            return how;
        }
        tracing::warn!(
            pid = self.pid,
            "the OpenCode server did not stop within {}s of SIGTERM; sending SIGKILL",
            STOP_GRACE.as_secs()
        );
        kill_group(self.group, libc::SIGKILL);
        match tokio::time::timeout(KILL_WAIT, self.wait_exit()).await {
            Ok(how) => how,
            Err(_) => format!(
                "did not exit within {}s of SIGKILL (still running, or stuck in the kernel)",
                KILL_WAIT.as_secs()
            ),
        }
    }
}

/// The supervisor binary, when the gateway enabled it.
fn supervisor_program() -> Option<&'static Path> {
    super::supervisor::program()
}

/// `true` if `command` names an existing file: a path as given, or a name found on `PATH`.
fn program_exists(command: &str) -> bool {
    find_program(command, Path::is_file).is_some()
}

/// Where `command` is, looked up as the gateway runs it: a path (anything with a `/`) as given,
/// else the first file of that name in a `PATH` directory that `accept` takes.
pub(crate) fn find_program(command: &str, accept: impl Fn(&Path) -> bool) -> Option<PathBuf> {
    if command.contains('/') {
        let path = PathBuf::from(command);
        return accept(&path).then_some(path);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(command))
        .find(|p| accept(p))
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

/// Makes the kernel send `death_signal` to the child `cmd` starts when the gateway dies, however
/// it dies (Linux). Spawn it with [`spawn_child`]: the signal follows the thread that forked.
#[cfg(target_os = "linux")]
pub(crate) fn die_with_gateway(cmd: &mut Command, death_signal: i32) {
    let gateway = std::process::id();
    // SAFETY: prctl, getppid and kill are async-signal-safe and touch only the calling (child)
    // process. PR_SET_PDEATHSIG makes the kernel signal the child when the thread that forked it
    // ends; `spawn_child` forks from a thread that lives as long as the gateway, so that is when
    // the gateway dies, however it dies. If the gateway died between fork and prctl, the parent
    // is already someone else: stop right here.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, death_signal) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if u32::try_from(libc::getppid()).ok() != Some(gateway) {
                libc::kill(libc::getpid(), libc::SIGKILL);
            }
            Ok(())
        });
    }
}

/// Spawns `cmd` from the gateway's spawner thread: one thread that lives as long as the process.
///
/// `PR_SET_PDEATHSIG` fires when the *thread* that forked the child ends, not the process, and a
/// tokio worker may be retired long before the gateway exits (a blocking-pool thread after
/// `spawn_blocking` or `block_in_place` lives ten idle seconds). Forking from a thread that never
/// ends ties the signal to the gateway's own death.
pub(crate) async fn spawn_child(cmd: Command) -> std::io::Result<Child> {
    type Job = (
        Command,
        tokio::runtime::Handle,
        oneshot::Sender<std::io::Result<Child>>,
    );
    static SPAWNER: OnceLock<Mutex<std::sync::mpsc::Sender<Job>>> = OnceLock::new();
    let sender = match SPAWNER.get() {
        Some(s) => s,
        None => {
            let (tx, rx) = std::sync::mpsc::channel::<Job>();
            std::thread::Builder::new()
                .name("opencode-spawner".into())
                .spawn(move || {
                    // The static keeps a sender alive, so this loop (and the thread) never ends.
                    for (mut cmd, handle, reply) in rx {
                        let spawned = {
                            let _runtime = handle.enter();
                            cmd.spawn()
                        };
                        // If the caller went away, the child is dropped here and killed
                        // (`kill_on_drop`).
                        let _ = reply.send(spawned);
                    }
                })?;
            // Two racing first calls may both start a thread; the loser's ends with its channel.
            SPAWNER.get_or_init(|| Mutex::new(tx))
        }
    };
    let (reply_tx, reply_rx) = oneshot::channel();
    let job = (cmd, tokio::runtime::Handle::current(), reply_tx);
    sender
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .send(job)
        .map_err(|_| std::io::Error::other("the process spawner thread is gone"))?;
    reply_rx
        .await
        .map_err(|_| std::io::Error::other("the process spawner thread is gone"))?
}

/// `true` when nothing can listen on `hostname:port` because someone already does.
fn port_in_use(hostname: &str, port: u16) -> bool {
    let host = if hostname == "localhost" {
        "127.0.0.1"
    } else {
        hostname
    };
    matches!(
        std::net::TcpListener::bind((host, port)),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse
    )
}

/// Removes ANSI escape sequences (OpenCode colours its errors even on a pipe).
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\u{1b}' {
            out.push(c);
            continue;
        }
        if chars.peek() == Some(&'[') {
            chars.next();
            // Parameters and intermediates, then one final byte in @..~.
            for c in chars.by_ref() {
                if ('@'..='~').contains(&c) {
                    break;
                }
            }
        } else {
            chars.next();
        }
    }
    out
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
pub fn free_port(hostname: &str) -> Result<u16, OpencodeError> {
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

/// The user's own `OPENCODE_CONFIG_CONTENT` with our permission policy added, and the
/// confining `shell` when there is one. The user's content is kept: a `permission` the user set
/// wins over the policy (the rules the gateway forces on delegated sessions are the session's,
/// see `Api::create_session`), but a `shell` of theirs never wins over the confining one.
/// Content that is not a JSON object is refused: OpenCode would take it without the policy and
/// without the sandbox.
pub fn merged_config_content(
    existing: Option<&str>,
    policy: PermissionPolicy,
    shell: Option<&Path>,
) -> Result<String, OpencodeError> {
    let policy_value = match policy {
        PermissionPolicy::Allow => "allow",
        PermissionPolicy::Ask => "ask",
        PermissionPolicy::Deny => "deny",
    };
    let mut object = match existing.map(serde_json::from_str::<serde_json::Value>) {
        None => serde_json::Map::new(),
        Some(Ok(serde_json::Value::Object(map))) => map,
        Some(_) => {
            return Err(OpencodeError::Start(
                "OPENCODE_CONFIG_CONTENT is set but is not a JSON object, so OpenCode would \
                 run without the gateway's permission policy and sandbox: fix it (e.g. \
                 `{\"model\": \"provider/model\"}`) or unset it"
                    .into(),
            ))
        }
    };
    object
        .entry("permission")
        .or_insert_with(|| serde_json::Value::String(policy_value.into()));
    if let Some(shell) = shell {
        object.insert(
            "shell".into(),
            serde_json::Value::String(shell.to_string_lossy().into_owned()),
        );
    }
    Ok(serde_json::Value::Object(object).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in for a lingering supervisor's socket: accepts one connection, says `first`,
    /// then echoes the answer to a linger request until the gateway's end closes.
    fn fake_supervisor(socket: &Path, first: String) -> std::thread::JoinHandle<()> {
        use std::io::{BufRead, Write};
        let listener = std::os::unix::net::UnixListener::bind(socket).expect("bind");
        std::thread::spawn(move || {
            let Ok((stream, _)) = listener.accept() else {
                return;
            };
            let mut writer = stream.try_clone().expect("clone");
            let _ = writeln!(writer, "{first}");
            for line in std::io::BufReader::new(stream).lines() {
                let Ok(line) = line else { return };
                if line.starts_with(super::super::supervisor::LINGER_REQUEST) {
                    let _ = writeln!(writer, "{}", super::super::supervisor::LINGERING_LINE);
                }
            }
        })
    }

    /// Taking over a lingering server: the supervisor's pid is the socket's peer, OpenCode's
    /// is what it says; a linger request is answered; the connection's end is the server's.
    #[tokio::test]
    async fn a_lingering_server_is_taken_over_through_its_socket() {
        let dir = tempfile::tempdir().expect("a directory");
        let socket = dir.path().join("s.sock");
        let attached = format!("{}4242", super::super::supervisor::ATTACHED_LINE);
        let fake = fake_supervisor(&socket, attached);
        let process = ManagedProcess::attach(
            &socket,
            "http://127.0.0.1:1".into(),
            "pw".into(),
            Duration::from_secs(5),
        )
        .await
        .expect("attached");
        assert_eq!(process.pid, 4242);
        assert_eq!(process.group, std::process::id(), "the socket's peer");
        assert_eq!(process.password(), "pw");
        assert!(!format!("{process:?}").contains("\"pw\""), "{process:?}");
        assert_eq!(process.exit_status(), None);
        process
            .linger(Duration::from_secs(5), &socket, &[])
            .await
            .expect("the linger request is answered");
        // Let go: the fake sees the end of its lifeline and ends, which is the server's end.
        assert!(process
            .linger(Duration::from_secs(5), &socket, &[])
            .await
            .is_err());
        tokio::task::spawn_blocking(move || fake.join())
            .await
            .expect("joined")
            .expect("the fake ended");
        let how = tokio::time::timeout(Duration::from_secs(5), process.wait_exit()).await;
        assert!(how.expect("seen").contains("supervisor is gone"));
    }

    /// Anything but a supervisor behind the socket, or none, is refused with a reason.
    #[tokio::test]
    async fn a_socket_that_is_no_supervisor_is_refused() {
        let dir = tempfile::tempdir().expect("a directory");
        let socket = dir.path().join("s.sock");
        let attach = |socket: PathBuf| async move {
            ManagedProcess::attach(
                &socket,
                "http://127.0.0.1:1".into(),
                "pw".into(),
                Duration::from_secs(5),
            )
            .await
        };
        let missing = attach(socket.clone()).await.expect_err("no socket");
        assert!(missing.contains("cannot connect"), "{missing}");
        let fake = fake_supervisor(&socket, "hello".into());
        let wrong = attach(socket.clone()).await.expect_err("not a supervisor");
        assert!(wrong.contains("not a supervisor's answer"), "{wrong}");
        tokio::task::spawn_blocking(move || fake.join())
            .await
            .expect("joined")
            .expect("the fake ended");
    }

    #[test]
    fn ansi_colours_are_stripped() {
        assert_eq!(
            strip_ansi("\u{1b}[91m\u{1b}[1mError: \u{1b}[0mUnexpected error"),
            "Error: Unexpected error"
        );
        assert_eq!(strip_ansi("plain"), "plain");
        assert_eq!(strip_ansi("cut \u{1b}["), "cut ");
    }

    #[test]
    fn a_port_someone_listens_on_is_in_use() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        assert!(port_in_use("127.0.0.1", port));
        drop(listener);
        // Once released it is free, unless a test running beside this one happens to take the
        // same ephemeral port in between (seen under load): a few fresh ports settle it.
        let freed = (0..5).any(|_| {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            let port = listener.local_addr().expect("addr").port();
            drop(listener);
            !port_in_use("127.0.0.1", port)
        });
        assert!(freed, "a released port still reads as in use");
    }

    /// PR_SET_PDEATHSIG fires when the forking *thread* ends. A child spawned from a thread that
    /// then exits must live on: it was forked by the spawner thread, not by the caller.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_child_outlives_the_thread_that_asked_for_it() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let handle = runtime.handle().clone();
        let mut child = std::thread::spawn(move || {
            handle.block_on(async {
                let mut cmd = Command::new("sleep");
                cmd.arg("30").kill_on_drop(true);
                // SAFETY: prctl touches only the child.
                unsafe {
                    cmd.pre_exec(|| {
                        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                        Ok(())
                    });
                }
                spawn_child(cmd).await.expect("spawn sleep")
            })
        })
        .join()
        .expect("the asking thread ends");
        let pid = child.id().expect("pid");
        // The asking thread is gone. A wrongly aimed SIGKILL lands at that thread's exit; give it
        // a generous window to show, then look.
        std::thread::sleep(Duration::from_millis(300));
        let alive = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                s.rsplit_once(") ")
                    .map(|(_, r)| r.starts_with(['S', 'R', 'D']))
            })
            .unwrap_or(false);
        let _ = child.start_kill();
        assert!(alive, "the child died with the thread that asked for it");
    }

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
            Some(r#"{"model":"fake/m","provider":{"x":{}},"shell":"/bin/zsh"}"#),
            PermissionPolicy::Allow,
            Some(Path::new("/state/sandbox/srv_1.sh")),
        )
        .expect("merged");
        let v: serde_json::Value = serde_json::from_str(&merged).expect("json");
        assert_eq!(v["permission"], "allow");
        assert_eq!(v["model"], "fake/m");
        assert!(v["provider"]["x"].is_object());
        assert_eq!(
            v["shell"], "/state/sandbox/srv_1.sh",
            "the confining shell wins"
        );
    }

    #[test]
    fn users_own_permission_wins_and_garbage_is_refused() {
        let merged = merged_config_content(
            Some(r#"{"permission":{"bash":"ask"}}"#),
            PermissionPolicy::Allow,
            None,
        )
        .expect("merged");
        let v: serde_json::Value = serde_json::from_str(&merged).expect("json");
        assert_eq!(v["permission"]["bash"], "ask");
        let refused = merged_config_content(Some("not json"), PermissionPolicy::Deny, None)
            .expect_err("not an object");
        assert!(
            refused.to_string().contains("OPENCODE_CONFIG_CONTENT"),
            "{refused}"
        );
        let fresh: serde_json::Value = serde_json::from_str(
            &merged_config_content(None, PermissionPolicy::Ask, None).expect("merged"),
        )
        .expect("json");
        assert_eq!(fresh["permission"], "ask");
    }

    /// A server that prints no `listening on` line within `timeouts.server_start` is stopped,
    /// with its process group, and the error says so with what it printed; a command that is
    /// not there is named with how to install OpenCode.
    #[tokio::test]
    async fn a_server_that_never_listens_is_stopped_at_the_start_timeout() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("a directory");
        let pidfile = dir.path().join("pid");
        let script = dir.path().join("opencode");
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\necho $$ > {}\necho warming up\nexec sleep 30\n",
                pidfile.display()
            ),
        )
        .expect("a script");
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let mut config = crate::gateway::test_config().opencode;
        config.command = script.display().to_string();
        let request = |config| SpawnRequest {
            config,
            port: 0,
            directory: dir.path(),
            password: "pw",
            start_timeout: Duration::from_millis(1500),
            shell: None,
        };
        let err = match ManagedProcess::spawn(request(&config)).await {
            Err(e) => e.to_string(),
            Ok(_) => panic!("a server that never listens started"),
        };
        assert!(err.contains("printed no `listening on` line"), "{err}");
        assert!(err.contains("warming up"), "{err}");
        let pid: i32 = std::fs::read_to_string(&pidfile)
            .expect("the script ran")
            .trim()
            .parse()
            .expect("a pid");
        // Killed, then reaped by the process's own waiter (a task of this runtime: the wait
        // yields to it).
        let mut gone = false;
        for _ in 0..100 {
            // SAFETY: kill(2) with signal 0 only checks that the pid exists.
            gone = unsafe { libc::kill(pid, 0) } != 0;
            if gone {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(gone, "the server outlived its failed start");

        let mut missing = config.clone();
        missing.command = dir.path().join("missing").display().to_string();
        let err = match ManagedProcess::spawn(request(&missing)).await {
            Err(e) => e.to_string(),
            Ok(_) => panic!("a missing command started"),
        };
        assert!(err.contains("npm install -g"), "{err}");
    }
}
