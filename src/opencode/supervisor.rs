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

/// What wakes the supervisor.
enum Wake {
    Signal(libc::c_int),
    /// The lifeline (stdin) ended: the gateway is gone or let go of this server.
    LifelineEnded,
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

/// Reads stdin to its end, then says so.
fn lifeline_thread(tx: mpsc::Sender<Wake>) {
    use std::io::Read;
    let mut stdin = std::io::stdin().lock();
    let mut buf = [0u8; 64];
    loop {
        match stdin.read(&mut buf) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    let _ = tx.send(Wake::LifelineEnded);
}

fn run(command: &[OsString], lifeline: bool) -> ExitCode {
    let Some((program, args)) = command.split_first() else {
        eprintln!("opencode-mcp supervisor: no command given");
        return ExitCode::from(2);
    };
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
    // OpenCode must not hold the lifeline: then only the gateway's end keeps it open.
    cmd.args(args).stdin(std::process::Stdio::null());
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
        // Reaped below with waitpid(-1): the std handle is not needed (dropping it does nothing).
        Ok(child) => child.id() as libc::pid_t,
        Err(e) => {
            eprintln!(
                "opencode-mcp supervisor: cannot run `{}`: {e}",
                program.to_string_lossy()
            );
            return ExitCode::from(if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            });
        }
    };
    eprintln!("{PID_LINE_PREFIX}{opencode}");
    let (tx, rx) = mpsc::channel();
    let signals = tx.clone();
    let started = std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || signal_thread(set, signals))
        .is_ok()
        && (!lifeline
            || std::thread::Builder::new()
                .name("lifeline".into())
                .spawn(move || lifeline_thread(tx))
                .is_ok());
    if !started {
        eprintln!("opencode-mcp supervisor: cannot start its threads; stopping opencode");
        // SAFETY: signals our own child.
        unsafe { libc::kill(opencode, libc::SIGKILL) };
    }

    // Until told to stop, wait for OpenCode without a bound; once told, SIGTERM, SIGKILL at
    // `kill_at`, and stop waiting at `give_up_at`.
    let mut kill_at: Option<Instant> = None;
    let mut give_up_at: Option<Instant> = None;
    // Off Linux there is no subreaper: what OpenCode started is found before it is stopped.
    let mut doomed: Vec<u32> = Vec::new();
    let status = loop {
        if let Some(status) = reap(opencode) {
            break Some(status);
        }
        let now = Instant::now();
        if give_up_at.is_some_and(|d| now >= d) {
            eprintln!(
                "opencode-mcp supervisor: opencode (pid {opencode}) was not reaped within {}s of \
                 SIGKILL; leaving it",
                KILL_WAIT.as_secs_f32()
            );
            break None;
        }
        if give_up_at.is_none() && kill_at.is_some_and(|d| now >= d) {
            // SAFETY: signals our own child.
            unsafe { libc::kill(opencode, libc::SIGKILL) };
            give_up_at = Some(now + KILL_WAIT);
        }
        let timeout = give_up_at
            .or(kill_at)
            .map(|d| d.saturating_duration_since(now));
        let woke = match timeout {
            Some(t) => rx.recv_timeout(t).ok(),
            None => rx.recv().ok(),
        };
        let stop = match woke {
            Some(Wake::Signal(libc::SIGCHLD)) | None => false,
            Some(Wake::Signal(_)) | Some(Wake::LifelineEnded) => true,
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
