//! The supervisor: a small process between the gateway and each managed `opencode serve`, so
//! that nothing OpenCode starts outlives the gateway.
//!
//! Why: OpenCode runs each shell command of its `bash` tool detached, in a process group of its
//! own (measured on 1.18.33: `sleep 300` in pgrp = its own pid). Killing OpenCode's process group
//! misses those; when OpenCode dies the shells are reparented to init and run on (a dev server an
//! agent started would run forever). And a gateway killed outright (SIGKILL, a crash) runs no
//! cleanup at all.
//!
//! How: the gateway runs its own binary as `opencode-mcp __supervise-opencode --lifeline
//! <command> <args>`, with the supervisor's stdin a pipe whose other end only the gateway holds:
//! the *lifeline*. However the gateway ends, the kernel closes its end, the supervisor reads the
//! end of its stdin and stops OpenCode. That works on every Unix. On Linux two extras add what a
//! pipe cannot: the gateway also forks the supervisor with `PR_SET_PDEATHSIG = SIGTERM` (a second
//! channel), and the supervisor makes itself a *child subreaper*, so every orphan of OpenCode's
//! tree is reparented to it rather than to init and is found for the cleanup even after OpenCode
//! died. Elsewhere (macOS) what OpenCode started is looked up (`ps`) just before OpenCode is
//! stopped; a shell orphaned by an OpenCode that crashed on its own is beyond reach there.
//!
//! The supervisor starts OpenCode (on Linux with `PR_SET_PDEATHSIG = SIGKILL` towards the
//! supervisor) on the same stdout and stderr, prints `opencode-mcp supervisor: opencode pid <N>`
//! on stderr, and waits:
//!
//! - OpenCode exits (it crashed, was killed, or stopped): every process left under the supervisor
//!   is SIGKILLed and reaped, and the supervisor exits the way OpenCode did (same code, or the
//!   same signal), so the gateway reports "exited with signal 9" for a killed server.
//! - SIGTERM, SIGINT or SIGHUP (the gateway stops the server), or the lifeline ends (the gateway
//!   is gone): OpenCode gets SIGTERM and [`GRACE`] to exit, then SIGKILL and [`KILL_WAIT`] to be
//!   reaped; then the same cleanup, itself bounded by [`CLEANUP_BOUND`]. Every wait is bounded,
//!   so the supervisor is gone within [`STOP_BOUND`] of the signal even if OpenCode cannot be
//!   reaped (a process stuck in the kernel ignores even SIGKILL); the gateway's own stop waits
//!   longer than that (see `process::STOP_GRACE`), so it never cuts the cleanup short.
//!
//! Signals are blocked in every thread and taken by one thread with `sigwait`; it and the
//! lifeline reader wake the main loop through one channel.
//!
//! **Lingering.** A gateway that exits cleanly while its tasks run (a host's reconnect or update
//! ends it) lets their OpenCode run on for a grace period instead: it writes
//! `linger <seconds> <socket path>` ([`LINGER_REQUEST`]) on the lifeline before it lets go. The
//! supervisor then answers [`LINGERING_LINE`] on stderr once it no longer dies with the gateway
//! (on Linux its own `PR_SET_PDEATHSIG` is cleared) and listens on that Unix socket, in the
//! gateway's private state directory. When the lifeline ends, the grace period starts. The next
//! gateway connects to the socket; the connection is the lifeline from then on, with the same
//! messages and the same meaning of its end (the supervisor answers [`ATTACHED_LINE`] on it
//! first). With no gateway by the end of the grace period, OpenCode is stopped as on SIGTERM.
//! OpenCode's output is relayed through the supervisor, so that once no gateway reads it a write
//! there fails in the supervisor (which drops it), never in OpenCode.
//!
//! **Deadlines while no gateway runs.** Before the linger request, the gateway names each open
//! turn's deadline: `abort-at <seconds> <session id> <directory>` ([`ABORT_REQUEST`]).
//! While the supervisor lingers with no gateway, it aborts each such session at its deadline
//! (`POST /session/<id>/abort`, with the password it was started with), so a task's
//! `timeouts.task` holds between two gateways too. Where that goes is the supervisor's own
//! command line (`--hostname`, a loopback address, and `--port` of the `opencode serve` it
//! started), never a lifeline's words: no message can send OpenCode's password elsewhere. A
//! gateway that connects takes the deadlines back: they are forgotten, and it arms its own.

use std::ffi::OsString;
use std::process::ExitCode;
use std::sync::mpsc;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The hidden subcommand that runs the supervisor.
pub const SUBCOMMAND: &str = "__supervise-opencode";
/// The flag (right after [`SUBCOMMAND`]) that makes the supervisor's stdin a lifeline: it reads
/// it, and when it ends (the gateway closed it, or died and the kernel closed it) it stops
/// OpenCode as on SIGTERM.
pub const LIFELINE_FLAG: &str = "--lifeline";
/// The line the supervisor prints (on stderr) once OpenCode runs: this prefix, then the pid.
pub const PID_LINE_PREFIX: &str = "opencode-mcp supervisor: opencode pid ";
/// The message (a line on the lifeline) that makes OpenCode outlive the lifeline's end: this
/// word, the grace period in whole seconds, and the absolute path of the socket the next
/// gateway reaches the supervisor on.
pub const LINGER_REQUEST: &str = "linger";
/// The supervisor's answer to [`LINGER_REQUEST`]: on stderr for the first lifeline (stdin),
/// on the connection for a lifeline taken over through the socket.
pub const LINGERING_LINE: &str = "opencode-mcp supervisor: lingering";
/// What the supervisor says first on a connection to its socket, then OpenCode's pid: the
/// connection is the lifeline now.
pub const ATTACHED_LINE: &str = "opencode-mcp supervisor: attached ";
/// The message (a line on the lifeline) that names an open turn's deadline: this word, the
/// seconds from now, the session's id and its directory (the rest of the line). Acted on only
/// while the supervisor lingers with no gateway.
pub const ABORT_REQUEST: &str = "abort-at";
/// The most deadlines a supervisor keeps (a bound on what a lifeline can make it hold).
const MAX_DEADLINES: usize = 1024;
/// How long an abort at a deadline may take (connect, send, read the answer).
const ABORT_BOUND: Duration = Duration::from_secs(3);
/// The longest grace period a linger request may ask for (a day): a bound on what a lifeline
/// can keep alive with no gateway.
pub const MAX_LINGER: Duration = Duration::from_secs(86_400);
/// How long OpenCode gets between SIGTERM and SIGKILL.
pub const GRACE: Duration = Duration::from_secs(2);
/// How long a SIGKILLed OpenCode gets to be reaped before the supervisor stops waiting for it.
pub const KILL_WAIT: Duration = Duration::from_secs(1);
/// Upper bound on killing and reaping what OpenCode left behind.
pub const CLEANUP_BOUND: Duration = Duration::from_secs(2);
/// The longest the supervisor runs after it is told to stop: the phases above, one after the
/// other. The gateway waits longer than this before it kills the supervisor's group itself.
pub const STOP_BOUND: Duration = GRACE
    .saturating_add(KILL_WAIT)
    .saturating_add(CLEANUP_BOUND);

static PROGRAM: OnceLock<std::path::PathBuf> = OnceLock::new();

/// Makes managed servers run under the supervisor, started as `program` (the gateway's own
/// binary). Without this call (as in library use) OpenCode is spawned directly.
pub fn enable(program: std::path::PathBuf) {
    let _ = PROGRAM.set(program);
}

/// The supervisor program, if enabled.
pub(crate) fn program() -> Option<&'static std::path::Path> {
    PROGRAM.get().map(|p| p.as_path())
}

/// Runs the supervisor when the process was started as one (`argv[1] == SUBCOMMAND`); the
/// binary's `main` calls this first and returns its exit code.
pub fn main_if_requested() -> Option<ExitCode> {
    let mut args = std::env::args_os().skip(1).peekable();
    if args.next().as_deref() != Some(std::ffi::OsStr::new(SUBCOMMAND)) {
        return None;
    }
    let lifeline = args.next_if(|a| a == LIFELINE_FLAG).is_some();
    let command: Vec<OsString> = args.collect();
    Some(run(&command, lifeline))
}

/// What wakes the supervisor. Lifelines are numbered: 0 is stdin, then each connection to the
/// socket in turn; only the newest one counts.
enum Wake {
    Signal(libc::c_int),
    /// A lifeline ended: its gateway is gone or let go of this server.
    LifelineEnded(u64),
    /// A lifeline asked for the grace period ([`LINGER_REQUEST`]); the sender is told once it
    /// is armed. `PR_SET_PDEATHSIG` belongs to a thread (the one the gateway forked), so only
    /// the main thread can clear it.
    Linger(u64, Duration, mpsc::Sender<()>),
    /// A gateway connected to the socket: its connection is lifeline `n`.
    Attached(u64),
    /// A lifeline named an open turn's deadline ([`ABORT_REQUEST`]).
    Deadline(u64, Deadline),
}

/// A session to abort at `at` if no gateway holds the supervisor then.
#[derive(Debug, Clone, PartialEq)]
struct Deadline {
    at: Instant,
    session: String,
    directory: String,
}

impl Deadline {
    /// Reads the words after [`ABORT_REQUEST`]: seconds, session id, directory. `None` for
    /// anything else: a session id is letters, digits, `_` and `-`, a directory is absolute.
    fn parse(rest: &str, now: Instant) -> Option<Deadline> {
        let mut words = rest.splitn(3, ' ');
        let secs = words.next()?.parse::<u64>().ok()?;
        let (session, directory) = (words.next()?, words.next()?);
        super::process::abort_target(session, directory)?;
        Some(Deadline {
            at: now + Duration::from_secs(secs).min(MAX_LINGER),
            session: session.to_string(),
            directory: directory.to_string(),
        })
    }

    /// Asks OpenCode to abort the session, in a thread of its own, bounded by [`ABORT_BOUND`].
    fn abort(self) {
        let spawned = std::thread::Builder::new()
            .name("abort".into())
            .spawn(
                move || match abort_session(&self, OPENCODE_ADDRESS.get().copied()) {
                    Ok(status) => say(&format!(
                    "opencode-mcp supervisor: session {} reached its deadline with no gateway; \
                     aborted ({status})",
                    self.session
                )),
                    Err(e) => say(&format!(
                    "opencode-mcp supervisor: session {} reached its deadline with no gateway; \
                     the abort failed: {e}",
                    self.session
                )),
                },
            );
        if spawned.is_err() {
            say("opencode-mcp supervisor: cannot start a thread to abort a session");
        }
    }
}

/// `POST /session/<id>/abort?directory=<dir>` to OpenCode at `address` (see
/// [`opencode_address`]), with the password the supervisor was started with (OpenCode's own,
/// from the same environment); the answer's status line.
fn abort_session(d: &Deadline, address: Option<std::net::SocketAddr>) -> std::io::Result<String> {
    use std::io::{BufRead, Write};
    let bad = |why: &str| std::io::Error::new(std::io::ErrorKind::InvalidInput, why.to_string());
    let address = address.ok_or_else(|| {
        bad("OpenCode's address is not on the supervisor's command line (--hostname, --port)")
    })?;
    let target = super::process::abort_target(&d.session, &d.directory)
        .ok_or_else(|| bad("not a session OpenCode makes, or a directory that is not absolute"))?;
    let auth = std::env::var("OPENCODE_SERVER_PASSWORD")
        .map(|pw| {
            format!(
                "Authorization: {}\r\n",
                super::api::basic_auth_header(super::api::AUTH_USER, &pw)
            )
        })
        .unwrap_or_default();
    let mut stream = std::net::TcpStream::connect_timeout(&address, ABORT_BOUND)?;
    stream.set_read_timeout(Some(ABORT_BOUND))?;
    stream.set_write_timeout(Some(ABORT_BOUND))?;
    write!(
        stream,
        "POST {target} HTTP/1.1\r\nHost: {address}\r\n{auth}Content-Length: 0\r\nConnection: close\r\n\r\n"
    )?;
    let mut status = Vec::new();
    std::io::BufReader::new(std::io::Read::take(stream, 256)).read_until(b'\n', &mut status)?;
    Ok(String::from_utf8_lossy(&status).trim_end().to_string())
}

/// The signals the supervisor handles; blocked in every thread and taken by [`signal_thread`].
fn handled_signals() -> libc::sigset_t {
    // SAFETY: sigemptyset/sigaddset initialise and fill a local set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGCHLD] {
            libc::sigaddset(&mut set, sig);
        }
        set
    }
}

/// Takes the handled signals with `sigwait` (POSIX, unlike Linux's `sigtimedwait`) and passes
/// them on: the main loop then waits on one channel for signals and the lifeline alike.
fn signal_thread(set: libc::sigset_t, tx: mpsc::Sender<Wake>) {
    loop {
        let mut sig: libc::c_int = 0;
        // SAFETY: sigwait reads the set and writes the signal number into a local.
        if unsafe { libc::sigwait(&set, &mut sig) } != 0 {
            continue;
        }
        if tx.send(Wake::Signal(sig)).is_err() {
            return;
        }
    }
}

/// Where a lifeline's answers go: stderr for stdin, the connection for a socket's.
type Answer = Box<dyn FnMut(&str) + Send>;

/// Reads lifeline `n` to its end, then says so. A [`LINGER_REQUEST`] line on it arms the grace
/// period: the socket is bound (once) and the request answered with [`LINGERING_LINE`]. Lines
/// are read in pieces of at most 4 KiB (a longer line costs no memory), and the grace period is
/// bounded by [`MAX_LINGER`].
fn lifeline_thread(
    n: u64,
    input: impl std::io::Read,
    mut answer: Answer,
    tx: mpsc::Sender<Wake>,
    listening: std::sync::Arc<OnceLock<()>>,
) {
    use std::io::BufRead;
    const MAX_LINE: u64 = 4096;
    let mut input = std::io::BufReader::new(input);
    loop {
        let mut line = Vec::new();
        match std::io::Read::take(&mut input, MAX_LINE).read_until(b'\n', &mut line) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
        let line = String::from_utf8_lossy(&line);
        let line = line.trim_end_matches('\n');
        if let Some(rest) = line
            .strip_prefix(ABORT_REQUEST)
            .and_then(|r| r.strip_prefix(' '))
        {
            match Deadline::parse(rest, Instant::now()) {
                Some(d) => {
                    if tx.send(Wake::Deadline(n, d)).is_err() {
                        return;
                    }
                }
                None => answer("opencode-mcp supervisor: a deadline needs seconds, a port, a session id and an absolute directory"),
            }
            continue;
        }
        let mut words = line.splitn(3, ' ');
        if words.next() != Some(LINGER_REQUEST) {
            continue;
        }
        let secs = words.next().and_then(|w| w.parse::<u64>().ok());
        let socket = words.next().filter(|p| p.starts_with('/'));
        let (Some(secs), Some(socket)) = (secs, socket) else {
            answer("opencode-mcp supervisor: a linger request needs seconds and a socket path");
            continue;
        };
        if listening.get().is_none() {
            match listen(std::path::Path::new(socket), tx.clone()) {
                Ok(()) => {
                    let _ = listening.set(());
                }
                Err(e) => {
                    answer(&format!(
                        "opencode-mcp supervisor: cannot listen on {socket}: {e}"
                    ));
                    continue;
                }
            }
        }
        let grace = Duration::from_secs(secs).min(MAX_LINGER);
        // Answered only once the main thread took it: only then does the supervisor no longer
        // go with the gateway that is about to exit (see `Wake::Linger`).
        let (taken, done) = mpsc::channel();
        if tx.send(Wake::Linger(n, grace, taken)).is_err() {
            return;
        }
        if done.recv_timeout(Duration::from_secs(1)).is_ok() {
            answer(LINGERING_LINE);
        }
    }
    let _ = tx.send(Wake::LifelineEnded(n));
}

/// Binds the socket the next gateway reaches this supervisor on, and takes each connection to
/// it as the newest lifeline. A file already at the path (a socket a supervisor that is gone
/// left) is replaced.
fn listen(path: &std::path::Path, tx: mpsc::Sender<Wake>) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::net::UnixListener;
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path)?;
    std::thread::Builder::new()
        .name("linger".into())
        .spawn(move || {
            let listening = std::sync::Arc::new(OnceLock::from(()));
            for (n, stream) in (1u64..).zip(listener.incoming()) {
                let Ok(stream) = stream else { continue };
                let Ok(mut writer) = stream.try_clone() else {
                    continue;
                };
                if tx.send(Wake::Attached(n)).is_err() {
                    return;
                }
                let _ = writeln!(writer, "{ATTACHED_LINE}{}", opencode_pid());
                let answer: Answer = Box::new(move |line| {
                    let _ = writeln!(writer, "{line}");
                });
                let (tx, listening) = (tx.clone(), listening.clone());
                let spawned = std::thread::Builder::new()
                    .name("lifeline".into())
                    .spawn(move || lifeline_thread(n, stream, answer, tx, listening));
                if spawned.is_err() {
                    return;
                }
            }
        })?;
    Ok(())
}

/// OpenCode's pid, once it runs (for [`ATTACHED_LINE`]).
static OPENCODE_PID: OnceLock<libc::pid_t> = OnceLock::new();

fn opencode_pid() -> libc::pid_t {
    OPENCODE_PID.get().copied().unwrap_or(0)
}

/// Where the OpenCode this supervisor started listens, read from its own command line: the
/// only place an abort at a deadline goes.
static OPENCODE_ADDRESS: OnceLock<std::net::SocketAddr> = OnceLock::new();

/// The address `opencode serve --hostname <h> --port <p>` (in `args`) listens on, if `<h>` is a
/// loopback address (or `localhost`) and `<p>` a port: the gateway starts every managed server
/// so, on a port it picked.
fn opencode_address(args: &[OsString]) -> Option<std::net::SocketAddr> {
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.to_str())
    };
    let port = value("--port")?.parse::<u16>().ok().filter(|p| *p != 0)?;
    let ip = match value("--hostname")? {
        "localhost" => std::net::IpAddr::from([127, 0, 0, 1]),
        other => other.parse::<std::net::IpAddr>().ok()?,
    };
    ip.is_loopback()
        .then_some(std::net::SocketAddr::new(ip, port))
}

/// A line on the supervisor's stderr. Never fails: once no gateway reads it, it is lost.
fn say(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// Copies OpenCode's output to the supervisor's, dropping what can no longer be written (no
/// gateway reads it while OpenCode lingers), so OpenCode never writes to a closed pipe.
fn relay(mut from: impl std::io::Read, mut to: impl std::io::Write) {
    let mut buf = [0u8; 8192];
    let mut open = true;
    loop {
        match from.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => {
                if open {
                    open = to.write_all(&buf[..n]).and_then(|()| to.flush()).is_ok();
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

fn run(command: &[OsString], lifeline: bool) -> ExitCode {
    let Some((program, args)) = command.split_first() else {
        say("opencode-mcp supervisor: no command given");
        return ExitCode::from(2);
    };
    if let Some(address) = opencode_address(args) {
        let _ = OPENCODE_ADDRESS.set(address);
    }
    let set = handled_signals();
    // Blocked before any thread starts, so every thread inherits the mask and the signals wait
    // for `sigwait` instead of their default action.
    // SAFETY: plain libc calls on this process's own attributes.
    let old_mask = unsafe {
        #[cfg(target_os = "linux")]
        {
            libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
            libc::prctl(libc::PR_SET_NAME, c"oc-mcp-superv".as_ptr(), 0, 0, 0);
        }
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
        old
    };
    let mut cmd = std::process::Command::new(program);
    // OpenCode must not hold the lifeline: then only the gateway's end keeps it open. Its output
    // is relayed (see `relay`).
    cmd.args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    #[cfg(target_os = "linux")]
    let supervisor = std::process::id();
    // SAFETY: only async-signal-safe calls on the child itself: restore the signal mask the
    // supervisor inherited; on Linux, also die with the supervisor, and stop if it is already
    // gone.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(move || {
            libc::pthread_sigmask(libc::SIG_SETMASK, &old_mask, std::ptr::null_mut());
            #[cfg(target_os = "linux")]
            {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if u32::try_from(libc::getppid()).ok() != Some(supervisor) {
                    libc::kill(libc::getpid(), libc::SIGKILL);
                }
            }
            Ok(())
        });
    }
    let opencode = match cmd.spawn() {
        // Reaped below with waitpid(-1): the std handle is not needed beyond its pipes.
        Ok(mut child) => {
            let relays = [
                child.stdout.take().map(|out| {
                    std::thread::Builder::new()
                        .name("stdout".into())
                        .spawn(move || relay(out, std::io::stdout()))
                }),
                child.stderr.take().map(|err| {
                    std::thread::Builder::new()
                        .name("stderr".into())
                        .spawn(move || relay(err, std::io::stderr()))
                }),
            ];
            if relays.iter().any(|r| matches!(r, Some(Err(_)))) {
                say("opencode-mcp supervisor: cannot relay opencode's output");
            }
            child.id() as libc::pid_t
        }
        Err(e) => {
            say(&format!(
                "opencode-mcp supervisor: cannot run `{}`: {e}",
                program.to_string_lossy()
            ));
            return ExitCode::from(if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            });
        }
    };
    let _ = OPENCODE_PID.set(opencode);
    say(&format!("{PID_LINE_PREFIX}{opencode}"));
    let (tx, rx) = mpsc::channel();
    let signals = tx.clone();
    let started = std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || signal_thread(set, signals))
        .is_ok()
        && (!lifeline
            || std::thread::Builder::new()
                .name("lifeline".into())
                .spawn(move || {
                    let answer: Answer = Box::new(say);
                    lifeline_thread(0, std::io::stdin(), answer, tx, Default::default())
                })
                .is_ok());
    if !started {
        say("opencode-mcp supervisor: cannot start its threads; stopping opencode");
        // SAFETY: signals our own child.
        unsafe { libc::kill(opencode, libc::SIGKILL) };
    }

    // Until told to stop, wait for OpenCode without a bound (or until `linger_until`, while
    // lingering with no lifeline); once told, SIGTERM, SIGKILL at `kill_at`, and stop waiting
    // at `give_up_at`.
    let mut current = 0u64;
    let mut armed: Option<Duration> = None;
    let mut linger_until: Option<Instant> = None;
    let mut kill_at: Option<Instant> = None;
    let mut give_up_at: Option<Instant> = None;
    // The open turns' deadlines, acted on while lingering with no gateway.
    let mut deadlines: Vec<Deadline> = Vec::new();
    // Off Linux there is no subreaper: what OpenCode started is found before it is stopped.
    let mut doomed: Vec<u32> = Vec::new();
    let status = loop {
        if let Some(status) = reap(opencode) {
            break Some(status);
        }
        let now = Instant::now();
        if give_up_at.is_some_and(|d| now >= d) {
            say(&format!(
                "opencode-mcp supervisor: opencode (pid {opencode}) was not reaped within {}s of \
                 SIGKILL; leaving it",
                KILL_WAIT.as_secs_f32()
            ));
            break None;
        }
        if give_up_at.is_none() && kill_at.is_some_and(|d| now >= d) {
            // SAFETY: signals our own child.
            unsafe { libc::kill(opencode, libc::SIGKILL) };
            give_up_at = Some(now + KILL_WAIT);
        }
        // No gateway holds OpenCode: each session past its deadline is aborted.
        if kill_at.is_none() && linger_until.is_some() {
            let (due, later): (Vec<_>, Vec<_>) = deadlines.drain(..).partition(|d| d.at <= now);
            deadlines = later;
            due.into_iter().for_each(Deadline::abort);
        }
        let lingered_out = kill_at.is_none() && linger_until.is_some_and(|d| now >= d);
        let next_deadline = deadlines.iter().map(|d| d.at).min();
        let timeout = give_up_at
            .or(kill_at)
            .or(linger_until.map(|l| next_deadline.map_or(l, |d| d.min(l))))
            .map(|d| d.saturating_duration_since(now));
        let woke = match timeout {
            _ if lingered_out => None,
            Some(t) => rx.recv_timeout(t).ok(),
            None => rx.recv().ok(),
        };
        let stop = lingered_out
            || match woke {
                Some(Wake::Signal(libc::SIGCHLD)) | None => false,
                Some(Wake::Signal(_)) => true,
                Some(Wake::Attached(n)) => {
                    // A gateway holds OpenCode again: no grace period runs until its end, and
                    // it keeps the deadlines itself.
                    (current, armed, linger_until) = (n, None, None);
                    deadlines.clear();
                    false
                }
                Some(Wake::Deadline(n, d)) => {
                    if n == current && deadlines.len() < MAX_DEADLINES {
                        deadlines.push(d);
                    }
                    false
                }
                Some(Wake::Linger(n, grace, taken)) => {
                    if n == current {
                        // No longer go with the gateway that started this supervisor.
                        #[cfg(target_os = "linux")]
                        // SAFETY: prctl on this thread's own attribute.
                        unsafe {
                            libc::prctl(libc::PR_SET_PDEATHSIG, 0, 0, 0, 0);
                        }
                        armed = Some(grace);
                        let _ = taken.send(());
                    }
                    false
                }
                Some(Wake::LifelineEnded(n)) if n != current => false,
                Some(Wake::LifelineEnded(_)) => match armed.take() {
                    Some(grace) => {
                        linger_until = Some(Instant::now() + grace);
                        false
                    }
                    None => true,
                },
            };
        if stop && kill_at.is_none() {
            if !cfg!(target_os = "linux") {
                doomed = descendants(opencode as u32);
            }
            // SAFETY: signals our own child.
            unsafe { libc::kill(opencode, libc::SIGTERM) };
            kill_at = Some(Instant::now() + GRACE);
        }
    };
    kill_everything_left(&rx, &doomed);
    // An OpenCode that could not be reaped was SIGKILLed: report it as killed by SIGKILL (a raw
    // wait status holding just a signal number means "terminated by that signal").
    mirror(status.unwrap_or(libc::SIGKILL))
}

/// Reaps every exited child; returns OpenCode's wait status if it was among them.
fn reap(opencode: libc::pid_t) -> Option<libc::c_int> {
    let mut found = None;
    loop {
        let mut status = 0;
        // SAFETY: waitpid on our own children; this thread alone reaps them.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if pid <= 0 {
            return found;
        }
        if pid == opencode {
            found = Some(status);
        }
    }
}

/// SIGKILLs every process still under the supervisor (on Linux OpenCode's orphans were
/// reparented here), and `doomed` (what OpenCode had started, found before it was stopped, where
/// there is no subreaper), and reaps them, in rounds, until none is left or [`CLEANUP_BOUND`] has
/// passed.
fn kill_everything_left(rx: &mpsc::Receiver<Wake>, doomed: &[u32]) {
    let me = std::process::id();
    for pid in doomed {
        // SAFETY: kill(2) on a process OpenCode started moments ago.
        unsafe { libc::kill(*pid as libc::pid_t, libc::SIGKILL) };
    }
    let deadline = Instant::now() + CLEANUP_BOUND;
    loop {
        let left = descendants(me);
        for pid in &left {
            // SAFETY: kill(2) on a process under this supervisor.
            unsafe { libc::kill(*pid as libc::pid_t, libc::SIGKILL) };
        }
        reap(0);
        let mut status = 0;
        // SAFETY: as in `reap`.
        let none_left = left.is_empty()
            && unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) } == -1
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::ECHILD);
        if none_left || Instant::now() >= deadline {
            return;
        }
        let _ = rx.recv_timeout(Duration::from_millis(50));
    }
}

/// Live descendants of `root`.
fn descendants(root: u32) -> Vec<u32> {
    let table = process_table();
    let mut found = Vec::new();
    let mut frontier = vec![root];
    while let Some(parent) = frontier.pop() {
        for (pid, _) in table.iter().filter(|(_, ppid)| *ppid == parent) {
            if !found.contains(pid) {
                found.push(*pid);
                frontier.push(*pid);
            }
        }
    }
    found
}

/// Every live process as (pid, parent pid), from `/proc`.
#[cfg(target_os = "linux")]
fn process_table() -> Vec<(u32, u32)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let (_, rest) = stat.rsplit_once(") ")?;
            let mut fields = rest.split_whitespace();
            let state = fields.next()?;
            let ppid = fields.next()?.parse().ok()?;
            (state != "Z" && state != "X").then_some((pid, ppid))
        })
        .collect()
}

/// Every process as (pid, parent pid), from `ps` (no `/proc` here).
#[cfg(not(target_os = "linux"))]
fn process_table() -> Vec<(u32, u32)> {
    let Ok(out) = std::process::Command::new("ps")
        .args(["-A", "-o", "pid=", "-o", "ppid="])
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
    else {
        return Vec::new();
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            Some((fields.next()?.parse().ok()?, fields.next()?.parse().ok()?))
        })
        .collect()
}

/// Exits the way OpenCode did: the same exit code, or the same signal.
fn mirror(status: libc::c_int) -> ExitCode {
    if libc::WIFSIGNALED(status) {
        let sig = libc::WTERMSIG(status);
        // A fatal signal runs no exit handler: coverage runs write their counts first.
        crate::coverage::write_profile_now();
        // SAFETY: default disposition and an unblocked mask for that one signal, then raise it.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, sig);
            libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            libc::raise(sig);
        }
        // Not reached for a fatal signal.
        return ExitCode::from(128u8.wrapping_add(sig as u8));
    }
    ExitCode::from(libc::WEXITSTATUS(status).clamp(0, 255) as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deadline names seconds, a port, a session id and an absolute directory (which may hold
    /// spaces); anything else is refused, and no deadline reaches past a day.
    #[test]
    fn a_deadline_is_read_only_when_whole() {
        let now = Instant::now();
        let d = Deadline::parse("12 ses_A-1 /w/my repo", now).expect("a deadline");
        assert_eq!(
            (d.at - now, d.session.as_str(), d.directory.as_str()),
            (Duration::from_secs(12), "ses_A-1", "/w/my repo")
        );
        let far = Deadline::parse("999999999 s /w", now).expect("a far deadline");
        assert_eq!(far.at - now, MAX_LINGER);
        for bad in [
            "",
            "x ses /w",
            "-1 ses /w",
            "12 ses/../x /w",
            "12 ses w",
            "12 ses",
            "12  /w",
        ] {
            assert_eq!(Deadline::parse(bad, now), None, "{bad:?}");
        }
    }

    /// The abort is `POST /session/<id>/abort` with the directory as a query value and the
    /// server's password, to 127.0.0.1 on the given port; the answer's status line comes back.
    #[test]
    fn an_abort_names_the_session_its_directory_and_the_password() {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let server = std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().expect("accept");
            conn.set_read_timeout(Some(Duration::from_secs(5)))
                .expect("timeout");
            let mut got = Vec::new();
            let mut buf = [0u8; 1024];
            while !got.ends_with(b"\r\n\r\n") {
                match conn.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
            let _ = conn.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\ntrue");
            String::from_utf8_lossy(&got).into_owned()
        });
        let d = Deadline {
            at: Instant::now(),
            session: "ses_1".into(),
            directory: "/w/a b&c".into(),
        };
        let address = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let status = abort_session(&d, Some(address)).expect("answered");
        assert_eq!(status, "HTTP/1.1 200 OK");
        let request = server.join().expect("the listener");
        assert!(
            request.starts_with("POST /session/ses_1/abort?directory=%2Fw%2Fa+b%26c HTTP/1.1\r\n"),
            "{request}"
        );
        match std::env::var("OPENCODE_SERVER_PASSWORD") {
            Ok(_) => assert!(request.contains("Authorization: Basic "), "{request}"),
            Err(_) => assert!(!request.contains("Authorization"), "{request}"),
        }
    }

    /// Nobody listening: the abort fails within its bound, saying why.
    #[test]
    fn an_abort_nobody_answers_fails() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        let d = Deadline {
            at: Instant::now(),
            session: "ses_1".into(),
            directory: "/w".into(),
        };
        let address = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        assert!(abort_session(&d, Some(address)).is_err());
        let unknown = abort_session(&d, None).expect_err("no address").to_string();
        assert!(unknown.contains("--port"), "{unknown}");
    }

    /// The abort's address is the supervisor's own command line: `--hostname` a loopback
    /// address (or `localhost`) and `--port` a port; anything else gives none.
    #[test]
    fn the_abort_goes_only_where_opencode_was_told_to_listen() {
        let args = |line: &str| -> Vec<OsString> { line.split(' ').map(OsString::from).collect() };
        assert_eq!(
            opencode_address(&args("serve --hostname 127.0.0.1 --port 4242")),
            Some(std::net::SocketAddr::from(([127, 0, 0, 1], 4242)))
        );
        assert_eq!(
            opencode_address(&args("serve --hostname localhost --port 1")),
            Some(std::net::SocketAddr::from(([127, 0, 0, 1], 1)))
        );
        assert_eq!(
            opencode_address(&args("serve --hostname ::1 --port 9")).map(|a| a.port()),
            Some(9)
        );
        for bad in [
            "serve --hostname 10.0.0.1 --port 4242",
            "serve --hostname example.com --port 4242",
            "serve --hostname 127.0.0.1 --port 0",
            "serve --hostname 127.0.0.1",
            "serve --port 4242",
            "serve --hostname 127.0.0.1 --port",
        ] {
            assert_eq!(opencode_address(&args(bad)), None, "{bad}");
        }
    }
}
