//! The supervisor (Linux): a small process between the gateway and each managed `opencode serve`,
//! so that nothing OpenCode starts can outlive it.
//!
//! Why: OpenCode runs each shell command of its `bash` tool detached, in a process group of its
//! own (measured on 1.18.33: `sleep 300` in pgrp = its own pid). Killing OpenCode's process group
//! misses those, and `PR_SET_PDEATHSIG` only reaches OpenCode itself; when OpenCode dies the
//! shells are reparented to init and run on (a dev server an agent started would run forever).
//!
//! How: the gateway runs its own binary as `opencode-mcp __supervise-opencode <command> <args>`
//! (the gateway forks it from its spawner thread with `PR_SET_PDEATHSIG = SIGTERM`, so it hears
//! of the gateway's death however that happens). The supervisor makes itself a *child
//! subreaper*, so every orphan of OpenCode's tree is reparented to it rather than to init, then
//! starts OpenCode (with `PR_SET_PDEATHSIG = SIGKILL` towards the supervisor) on the same stdio,
//! prints `opencode-mcp supervisor: opencode pid <N>` on stderr, and waits for signals:
//!
//! - OpenCode exits (it crashed, was killed, or stopped): every process left under the supervisor
//!   is SIGKILLed and reaped, and the supervisor exits the way OpenCode did (same code, or the
//!   same signal), so the gateway reports "exited with signal 9" for a killed server.
//! - SIGTERM, SIGINT or SIGHUP (the gateway stops the server, or the gateway died): OpenCode gets
//!   SIGTERM and [`GRACE`] to exit, then SIGKILL and [`KILL_WAIT`] to be reaped; then the same
//!   cleanup, itself bounded by [`CLEANUP_BOUND`]. Every wait is bounded, so the supervisor is
//!   gone within [`STOP_BOUND`] of the signal even if OpenCode cannot be reaped (a process stuck
//!   in the kernel ignores even SIGKILL); the gateway's own stop waits longer than that (see
//!   `process::STOP_GRACE`), so it never cuts the cleanup short.

#[cfg(target_os = "linux")]
use std::ffi::OsString;
use std::process::ExitCode;
use std::sync::OnceLock;
use std::time::Duration;
#[cfg(target_os = "linux")]
use std::time::Instant;

/// The hidden subcommand that runs the supervisor.
pub const SUBCOMMAND: &str = "__supervise-opencode";
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
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
pub(crate) fn program() -> Option<&'static std::path::Path> {
    PROGRAM.get().map(|p| p.as_path())
}

/// Runs the supervisor when the process was started as one (`argv[1] == SUBCOMMAND`); the
/// binary's `main` calls this first and returns its exit code. Linux only (elsewhere OpenCode
/// runs without a supervisor and this is always `None`).
#[cfg(not(target_os = "linux"))]
pub fn main_if_requested() -> Option<ExitCode> {
    None
}

/// Runs the supervisor when the process was started as one (`argv[1] == SUBCOMMAND`); the
/// binary's `main` calls this first and returns its exit code.
#[cfg(target_os = "linux")]
pub fn main_if_requested() -> Option<ExitCode> {
    let mut args = std::env::args_os().skip(1);
    if args.next().as_deref() != Some(std::ffi::OsStr::new(SUBCOMMAND)) {
        return None;
    }
    let command: Vec<OsString> = args.collect();
    Some(run(&command))
}

#[cfg(target_os = "linux")]
fn run(command: &[OsString]) -> ExitCode {
    let Some((program, args)) = command.split_first() else {
        eprintln!("opencode-mcp supervisor: no command given");
        return ExitCode::from(2);
    };
    // SAFETY: plain libc calls on this process's own attributes and a local signal set.
    let (waited, old_mask) = unsafe {
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
        libc::prctl(libc::PR_SET_NAME, c"oc-mcp-superv".as_ptr(), 0, 0, 0);
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGCHLD] {
            libc::sigaddset(&mut set, sig);
        }
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
        (set, old)
    };
    let supervisor = std::process::id();
    let mut cmd = std::process::Command::new(program);
    cmd.args(args);
    // SAFETY: only async-signal-safe calls on the child itself: restore the signal mask the
    // supervisor inherited, die with the supervisor, and stop if it is already gone.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(move || {
            libc::pthread_sigmask(libc::SIG_SETMASK, &old_mask, std::ptr::null_mut());
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if u32::try_from(libc::getppid()).ok() != Some(supervisor) {
                libc::kill(libc::getpid(), libc::SIGKILL);
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

    // Until told to stop, wait for OpenCode without a bound; once told, SIGTERM, SIGKILL at
    // `kill_at`, and stop waiting at `give_up_at`.
    let mut kill_at: Option<Instant> = None;
    let mut give_up_at: Option<Instant> = None;
    let status = loop {
        if let Some(status) = reap(opencode) {
            break Some(status);
        }
        let now = Instant::now();
        if give_up_at.is_some_and(|d| now >= d) {
            eprintln!(
                "opencode-mcp supervisor: opencode (pid {opencode}) was not reaped within {}s of                  SIGKILL; leaving it",
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
        match wait_signal(&waited, timeout) {
            Some(libc::SIGCHLD) | None => {}
            Some(_) => {
                if kill_at.is_none() {
                    // SAFETY: signals our own child.
                    unsafe { libc::kill(opencode, libc::SIGTERM) };
                    kill_at = Some(Instant::now() + GRACE);
                }
            }
        }
    };
    kill_everything_left(&waited);
    // An OpenCode that could not be reaped was SIGKILLed: report it as killed by SIGKILL (a raw
    // wait status holding just a signal number means "terminated by that signal").
    mirror(status.unwrap_or(libc::SIGKILL))
}

/// Waits for one of the blocked signals (or the timeout); `None` on timeout.
#[cfg(target_os = "linux")]
fn wait_signal(set: &libc::sigset_t, timeout: Option<Duration>) -> Option<libc::c_int> {
    // SAFETY: sigtimedwait/sigwaitinfo write only into the local siginfo.
    unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        let sig = match timeout {
            Some(t) => {
                let ts = libc::timespec {
                    tv_sec: t.as_secs() as libc::time_t,
                    tv_nsec: t.subsec_nanos() as libc::c_long,
                };
                libc::sigtimedwait(set, &mut info, &ts)
            }
            None => libc::sigwaitinfo(set, &mut info),
        };
        (sig > 0).then_some(sig)
    }
}

/// Reaps every exited child; returns OpenCode's wait status if it was among them.
#[cfg(target_os = "linux")]
fn reap(opencode: libc::pid_t) -> Option<libc::c_int> {
    let mut found = None;
    loop {
        let mut status = 0;
        // SAFETY: waitpid on our own children; we are single-threaded and own all of them.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if pid <= 0 {
            return found;
        }
        if pid == opencode {
            found = Some(status);
        }
    }
}

/// SIGKILLs every process still under the supervisor (OpenCode's orphans were reparented here)
/// and reaps them, in rounds, until none is left or [`CLEANUP_BOUND`] has passed.
#[cfg(target_os = "linux")]
fn kill_everything_left(waited: &libc::sigset_t) {
    let me = std::process::id();
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
        wait_signal(waited, Some(Duration::from_millis(50)));
    }
}

/// Live descendants of `root`, from `/proc`.
#[cfg(target_os = "linux")]
fn descendants(root: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let table: Vec<(u32, u32)> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let (_, rest) = stat.rsplit_once(") ")?;
            let mut fields = rest.split_whitespace();
            let state = fields.next()?;
            let ppid = fields.next()?.parse().ok()?;
            (state != "Z" && state != "X").then_some((pid, ppid))
        })
        .collect();
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

/// Exits the way OpenCode did: the same exit code, or the same signal.
#[cfg(target_os = "linux")]
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
