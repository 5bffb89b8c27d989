//! Running one check command in a task's directory: on this machine as a child of the gateway,
//! on a remote worker through its `ssh`.
//!
//! Why not OpenCode's session shell (`POST /session/{id}/shell`), which would run it wherever the
//! session runs and leave the output in the session? Measured on OpenCode 1.18.33, it returns
//! the output but never the exit status (`exit 3` and a missing command both read
//! `completed`); it keeps the whole output, unbounded (5 MB of output came back twice in one
//! answer, and the next model request carried all of it); it runs `bash -l`, whose profile resets
//! `PATH` (`cargo` was not found where the gateway finds it); and an abort leaves a check's
//! background children running. So the gateway runs checks itself, where it can bound them,
//! and the output reaches the agent's session in the fix prompt, cut to `checks.output_chars`.
//!
//! - **Local**: `sh -c` in the task's directory (its worktree, or the directory it works in),
//!   stdout and stderr merged, in a process group of its own, with the gateway's environment
//!   less the OpenCode server password. At `timeouts.check`, or when the task is cancelled, the
//!   whole group is killed.
//! - **Remote** (a task on a worker): the same `sh -c` in the task's worktree there, under the
//!   worker's `timeout` (coreutils) when it has one, so the command stops there too; the local
//!   `ssh` is killed a little later in any case.
//! - **Output**: only its end is kept while it runs (at most `keep` characters), so a check
//!   that prints gigabytes costs no memory.

use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::AsyncReadExt;

use crate::tasks::lifecycle::record::TaskRecord;
use crate::tasks::model::CheckResult;
use crate::workers::Remote;

/// How often a running check looks whether its task still wants it (a cancel ends it).
const POLL: Duration = Duration::from_millis(250);
/// Extra time the local `ssh` of a remote check gets past the timeout, for the worker's own
/// `timeout` to stop it and report.
const REMOTE_GRACE: Duration = Duration::from_secs(10);
/// Exit status `timeout` (coreutils) reports for a command it stopped.
const TIMEOUT_STATUS: i32 = 124;

/// Where a check runs.
pub enum Place<'a> {
    /// This machine: confined by this policy (to the task's root), or, with `None`, unconfined
    /// (the user's `sandbox.mode: off`).
    Local(Option<&'a crate::sandbox::Policy>),
    /// A remote worker, reached with its `ssh`; confined by its confining shell there (the
    /// path of [`crate::workers::sandbox`]'s script), or, with `None`, unconfined (the user's
    /// file turned confinement off for it).
    Remote(&'a Remote, Option<&'a str>),
}

/// Runs `command` in the task's directory and reports how it ended. `wanted` is asked while it
/// runs; once it says no (the task was cancelled), the check is stopped.
pub async fn run(
    place: Place<'_>,
    rec: &TaskRecord,
    command: &str,
    timeout: Duration,
    keep: usize,
    password_env: &str,
    wanted: impl Fn() -> bool,
) -> CheckResult {
    let started = Instant::now();
    let mut result = CheckResult {
        command: command.to_string(),
        ok: false,
        exit: None,
        error: None,
        duration_ms: 0,
        output: String::new(),
        output_cut: false,
        not_run: false,
    };
    // bwrap would only report a missing directory as a failing command: a check that never
    // ran gets no fix round (as when `sh` cannot be started in it).
    if matches!(place, Place::Local(Some(_))) && !std::path::Path::new(&rec.directory).is_dir() {
        result.error = Some(format!(
            "could not be started: the task's directory {} is gone",
            rec.directory
        ));
        result.not_run = true;
        return result;
    }
    let (mut cmd, limit) = match place {
        Place::Local(policy) => (local(policy, rec, command, password_env), timeout),
        Place::Remote(remote, shell) => (
            remote_command(remote, shell, rec, command, timeout),
            timeout + REMOTE_GRACE,
        ),
    };
    // A gateway that dies takes its local checks with it (their shell; a command they started
    // in the background is in their process group, which the timeout and a cancel kill).
    #[cfg(target_os = "linux")]
    if matches!(place, Place::Local(_)) {
        crate::opencode::die_with_gateway(&mut cmd, libc::SIGKILL);
    }
    let mut child = match crate::opencode::spawn_child(cmd).await {
        Ok(c) => c,
        Err(e) => {
            result.error = Some(format!("could not be started: {e}"));
            result.not_run = true;
            return result;
        }
    };
    let group = child.id();
    let mut stdout = child.stdout.take();
    let mut tail = Tail::new(keep);
    let mut buf = vec![0u8; 16 * 1024];
    let deadline = tokio::time::Instant::now() + limit;
    let mut poll = tokio::time::interval(POLL);
    let timed_out = format!(
        "stopped after {} (timeouts.check)",
        crate::config::HumanDuration::from(timeout)
    );
    let mut stopped: Option<String> = None;
    let status = loop {
        tokio::select! {
            read = async {
                match stdout.as_mut() {
                    Some(out) => out.read(&mut buf).await,
                    None => std::future::pending().await,
                }
            } => match read {
                Ok(0) | Err(_) => stdout = None,
                Ok(n) => tail.push(&buf[..n]),
            },
            status = child.wait(), if stdout.is_none() => break status.ok(),
            _ = tokio::time::sleep_until(deadline) => {
                stopped = Some(timed_out.clone());
                break None;
            }
            _ = poll.tick() => {
                if !wanted() {
                    stopped = Some("stopped: the task was cancelled or moved on".into());
                    break None;
                }
            }
        }
    };
    if status.is_none() {
        // A local check leads its own process group: what it started goes with it. A remote
        // one's group is killed there (killing ssh here stops nothing on the worker).
        match place {
            Place::Local(_) => {
                if let Some(pid) = group {
                    crate::opencode::kill_group(pid, libc::SIGKILL);
                }
            }
            Place::Remote(remote, _) => stop_remote(remote, rec).await,
        }
        let _ = child.kill().await;
    }
    result.duration_ms = started.elapsed().as_millis() as u64;
    (result.output, result.output_cut) = tail.text();
    match (status, stopped) {
        (_, Some(why)) => result.error = Some(why),
        (Some(s), None) => {
            result.exit = s.code();
            let remote_timeout = matches!(place, Place::Remote(..))
                && s.code() == Some(TIMEOUT_STATUS)
                && started.elapsed() >= timeout;
            if remote_timeout {
                result.exit = None;
                result.error = Some(timed_out);
            } else if s.code().is_none() {
                result.error = Some(signal_words(&s));
            }
            if matches!(place, Place::Remote(..)) && s.code() == Some(255) {
                result.error = Some("the worker could not be reached over ssh".into());
                result.not_run = true;
            }
            result.ok = result.error.is_none() && s.success();
        }
        (None, None) => result.error = Some("its exit could not be read".into()),
    }
    result
}

/// `sh -c` in the task's directory, stdout and stderr merged into one pipe, in a group of its
/// own so a timeout stops what it started too; under `policy`, inside the sandbox confined to
/// the task's root (its worktree, or its directory), with only the allowed environment.
fn local(
    policy: Option<&crate::sandbox::Policy>,
    rec: &TaskRecord,
    command: &str,
    password_env: &str,
) -> tokio::process::Command {
    let script = format!("exec 2>&1\n{command}");
    let mut cmd = match policy {
        Some(policy) => {
            let root = rec
                .workspace
                .as_ref()
                .map_or(rec.directory.as_str(), |w| w.path.as_str());
            let cwd = std::path::Path::new(&rec.directory);
            let cwd = cwd.canonicalize().unwrap_or_else(|_| cwd.to_path_buf());
            let confined = policy.command(
                std::path::Path::new(root),
                &cwd,
                "/bin/sh".as_ref(),
                &["-c".as_ref(), script.as_ref()],
            );
            // bwrap's own complaints go where the check's output goes: through a `sh` that
            // merges stderr into stdout before it becomes bwrap.
            let mut cmd = tokio::process::Command::new("/bin/sh");
            cmd.arg("-c")
                .arg("exec 2>&1; exec \"$0\" \"$@\"")
                .arg(confined.get_program())
                .args(confined.get_args())
                .env_clear();
            for (name, value) in confined.get_envs() {
                if let Some(value) = value {
                    cmd.env(name, value);
                }
            }
            cmd
        }
        None => {
            let mut cmd = tokio::process::Command::new("sh");
            cmd.arg("-c")
                .arg(&script)
                .current_dir(&rec.directory)
                .env_remove(password_env)
                .env_remove("OPENCODE_SERVER_PASSWORD");
            cmd
        }
    };
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .process_group(0);
    cmd
}

/// The same on a worker: `cd` to the task's directory there, then the command under the
/// worker's `timeout` when it has one, through its confining shell when it has one (which
/// finds the task's worktree from that directory, as for the agent's commands).
fn remote_command(
    remote: &Remote,
    shell: Option<&str>,
    rec: &TaskRecord,
    command: &str,
    timeout: Duration,
) -> tokio::process::Command {
    use crate::workers::ssh::quote;
    let secs = timeout.as_secs().max(1);
    let shell = quote(shell.unwrap_or("sh"));
    // The check runs in the background of this shell, its pid in a file of the gateway's
    // there (`timeout` leads a process group of its own), so that a cancel, a timeout or the
    // next gateway can stop it and what it started ([`stop_remote`]); the file goes when it
    // ends.
    let pidfile = quote(&remote_pidfile(rec));
    // The marker leads the command line of `timeout` (or of the shell) so [`stop_remote`]
    // knows the pid as this check's; `:` makes it a no-op for the check itself.
    let command = match check_marker(rec) {
        Some(marker) => format!(": {marker}; {command}"),
        None => command.to_string(),
    };
    let script = format!(
        "exec 2>&1; cd -- {dir} || exit 125; \
         if command -v timeout >/dev/null 2>&1; then timeout -k 5 {secs} {shell} -c {cmd} & \
         else {shell} -c {cmd} & fi; \
         p=$!; (umask 077; mkdir -p -- \"$(dirname -- {pidfile})\" && echo \"$p\" > {pidfile}); \
         wait \"$p\"; s=$?; rm -f -- {pidfile}; exit \"$s\"",
        dir = quote(&rec.directory),
        cmd = quote(&command),
    );
    let mut cmd = remote.ssh.command(&["sh", "-c", &script]);
    cmd.stderr(Stdio::null());
    cmd
}

/// What a remote check's command line carries so that its pid can be told from a reused one:
/// `opencode-mcp-check:<task id>`. `None` for an id of other characters than a task id's (a
/// record is read as hostile input; such a check is never stopped by pid).
fn check_marker(rec: &TaskRecord) -> Option<String> {
    let plain = !rec.id.is_empty()
        && rec
            .id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    plain.then(|| format!("opencode-mcp-check:{}", rec.id))
}

/// Where the pid of a remote task's running check is kept on its worker:
/// `<root>/checks/<task>.pid` (its worktree is `<root>/worktrees/<task>`).
fn remote_pidfile(rec: &TaskRecord) -> String {
    let worktree = rec
        .workspace
        .as_ref()
        .map_or(rec.directory.as_str(), |w| w.path.as_str());
    let root = std::path::Path::new(worktree)
        .parent()
        .and_then(std::path::Path::parent)
        .map_or_else(|| ".".to_string(), |p| p.display().to_string());
    format!("{root}/checks/{}.pid", rec.id)
}

/// Stops the check of `rec` still running on its worker, and everything it started: its
/// process group (or its process, where the worker has no `timeout`), TERM then KILL, only
/// while that pid is still this task's check: its command line carries the task's marker
/// ([`check_marker`]). A pid file can outlive its check (a worker that rebooted, a shell killed
/// from outside), and pids come round: a name such as `sh` proves nothing, and the user's own
/// shell there must never be hit. A worker that cannot be reached is left alone (its own
/// `timeout` ends the check). Where the worker confines its agents, the check's sandbox (its
/// own pid namespace, `--die-with-parent`) goes with it; an unconfined check's `setsid` child
/// escapes a process group.
pub async fn stop_remote(remote: &Remote, rec: &TaskRecord) {
    // `ours`: the pid's command line (from `ps`, or /proc where `ps` has no `-p`) holds the
    // marker. After the TERM, the group is killed if its leader is still ours, or gone (then
    // its id cannot have been reused while members remain; with none, the kill finds nothing).
    // (`$m`, not `$2`, inside the function: there `$2` is the function's own argument.)
    const STOP: &str = "p=$(cat -- \"$1\" 2>/dev/null) || exit 0; m=$2; \
                        case $p in ''|*[!0-9]*) exit 0;; esac; \
                        case $m in '') exit 0;; esac; \
                        ours() { a=$(ps -o args= -p \"$p\" 2>/dev/null) || \
                        a=$(tr '\\000' ' ' 2>/dev/null < \"/proc/$p/cmdline\"); \
                        case $a in *\"$m\"*) return 0;; esac; return 1; }; \
                        ours || { rm -f -- \"$1\"; exit 0; }; \
                        kill -TERM -- \"-$p\" 2>/dev/null || kill -TERM \"$p\" 2>/dev/null; \
                        sleep 1; \
                        if ours || ! kill -0 \"$p\" 2>/dev/null; then \
                        kill -KILL -- \"-$p\" 2>/dev/null || kill -KILL \"$p\" 2>/dev/null; fi; \
                        rm -f -- \"$1\"";
    let Some(marker) = check_marker(rec) else {
        return;
    };
    let pidfile = remote_pidfile(rec);
    let stopped = remote
        .ssh
        .run(
            &["sh", "-c", STOP, "sh", &pidfile, &marker],
            None,
            Duration::from_secs(20),
        )
        .await;
    if let Err(e) = stopped {
        tracing::warn!(task = %rec.id, error = %e, "could not stop the task's check on its worker");
    }
}

#[cfg(unix)]
fn signal_words(status: &std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match status.signal() {
        Some(sig) => format!("killed by signal {sig}"),
        None => "ended without an exit status".into(),
    }
}

/// The end of a stream: at most `keep` characters, with whether more came before.
struct Tail {
    keep: usize,
    bytes: std::collections::VecDeque<u8>,
    dropped: bool,
}

impl Tail {
    fn new(keep: usize) -> Self {
        Self {
            keep,
            bytes: std::collections::VecDeque::new(),
            dropped: false,
        }
    }

    /// Keeps the last `4 * keep` bytes (a character is at most 4), enough for `keep` characters.
    fn push(&mut self, data: &[u8]) {
        let cap = self.keep.saturating_mul(4).max(4);
        let data = if data.len() > cap {
            self.dropped = true;
            &data[data.len() - cap..]
        } else {
            data
        };
        self.bytes.extend(data);
        while self.bytes.len() > cap {
            self.bytes.pop_front();
            self.dropped = true;
        }
    }

    /// The kept text, cut to `keep` characters, and whether anything was cut.
    fn text(self) -> (String, bool) {
        let bytes: Vec<u8> = self.bytes.into_iter().collect();
        let text = String::from_utf8_lossy(&bytes);
        let n = text.chars().count();
        if n > self.keep {
            (text.chars().skip(n - self.keep).collect(), true)
        } else {
            (text.into_owned(), self.dropped)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(dir: &std::path::Path) -> TaskRecord {
        TaskRecord::new(
            "tsk_a".into(),
            "default".into(),
            "ses_a".into(),
            dir.to_string_lossy().into_owned(),
            "t".into(),
        )
    }

    async fn local_run(cmd: &str, timeout: Duration, keep: usize) -> CheckResult {
        let dir = tempfile::tempdir().expect("tempdir");
        run_at(None, dir.path(), cmd, timeout, keep).await
    }

    #[tokio::test]
    async fn exit_status_and_merged_output_are_reported() {
        let r = local_run(
            "echo out; echo err >&2; exit 3",
            Duration::from_secs(30),
            100,
        )
        .await;
        assert!(!r.ok);
        assert_eq!(r.exit, Some(3));
        assert_eq!(r.output, "out\nerr\n");
        assert!(r.error.is_none() && !r.output_cut);
        let ok = local_run("pwd", Duration::from_secs(30), 100).await;
        assert!(ok.ok && ok.exit == Some(0), "{ok:?}");
    }

    #[tokio::test]
    async fn a_huge_output_keeps_only_its_end() {
        let r = local_run(
            "yes x | head -c 3000000; echo END",
            Duration::from_secs(60),
            100,
        )
        .await;
        assert!(r.ok, "{r:?}");
        assert!(r.output_cut);
        assert_eq!(r.output.chars().count(), 100);
        assert!(r.output.ends_with("x\nEND\n"), "{}", r.output);
    }

    #[tokio::test]
    async fn a_hanging_check_is_stopped_with_what_it_started() {
        let dir = tempfile::tempdir().expect("tempdir");
        let marker = dir.path().join("child.pid");
        let cmd = format!("sleep 300 & echo $! > {}; wait", marker.display());
        let r = run(
            Place::Local(None),
            &record(dir.path()),
            &cmd,
            Duration::from_millis(1500),
            100,
            "X_PW",
            || true,
        )
        .await;
        assert!(!r.ok);
        assert!(r.exit.is_none());
        assert!(
            r.error
                .as_deref()
                .is_some_and(|e| e.contains("timeouts.check")),
            "{r:?}"
        );
        let pid: i32 = std::fs::read_to_string(&marker)
            .expect("the check wrote its child's pid")
            .trim()
            .parse()
            .expect("a pid");
        // The background child was in the check's group: it is gone (or a zombie being reaped).
        let gone = (0..50).any(|_| {
            // SAFETY: signal 0 only asks whether the process exists.
            let there = unsafe { libc::kill(pid, 0) } == 0;
            let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .map(|s| s.contains(") Z "))
                .unwrap_or(true);
            if !there || zombie {
                return true;
            }
            std::thread::sleep(Duration::from_millis(100));
            false
        });
        assert!(gone, "the check's background child outlived its timeout");
    }

    #[tokio::test]
    async fn a_cancelled_task_stops_its_check() {
        let dir = tempfile::tempdir().expect("tempdir");
        let asked = std::sync::atomic::AtomicU32::new(0);
        let r = run(
            Place::Local(None),
            &record(dir.path()),
            "sleep 300",
            Duration::from_secs(300),
            100,
            "X_PW",
            || asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst) < 2,
        )
        .await;
        assert!(!r.ok && r.exit.is_none());
        assert!(r.duration_ms < 60_000, "{r:?}");
        assert!(
            r.error.as_deref().is_some_and(|e| e.contains("cancelled")),
            "{r:?}"
        );
    }

    /// The policy a confined check gets, with `home` as the home directory and `state` hidden;
    /// fails, saying how to get it, where bubblewrap is missing.
    fn confining(home: &std::path::Path, state: &std::path::Path) -> crate::sandbox::Policy {
        let bwrap = match crate::sandbox::probe::availability() {
            crate::sandbox::Availability::Ready(b) => b.clone(),
            other => panic!(
                "these tests need a working bubblewrap (`apt-get install bubblewrap`): {other:?}"
            ),
        };
        crate::sandbox::Policy::from_settings(
            &crate::config::SandboxConfig::default(),
            bwrap,
            Some(home),
            &[state.to_path_buf()],
        )
    }

    /// `cmd` as a local check in `root`: confined by `policy`, or unconfined.
    async fn run_at(
        policy: Option<&crate::sandbox::Policy>,
        root: &std::path::Path,
        cmd: &str,
        timeout: Duration,
        keep: usize,
    ) -> CheckResult {
        run(
            Place::Local(policy),
            &record(root),
            cmd,
            timeout,
            keep,
            "X_PW",
            || true,
        )
        .await
    }

    #[tokio::test]
    async fn a_confined_check_writes_only_in_its_root_and_sees_no_secret() {
        // Outside /tmp, which the sandbox replaces with a private one: a home there would be
        // out of sight anyway and prove nothing (and a clone of this repository may itself lie
        // in /tmp).
        let base = std::path::Path::new("/var/tmp/opencode-mcp-tests");
        std::fs::create_dir_all(base).expect("create /var/tmp/opencode-mcp-tests");
        let dir = tempfile::tempdir_in(base).expect("tempdir");
        let home = dir.path().join("home");
        let state = dir.path().join("state");
        let root = dir.path().join("work");
        std::fs::create_dir_all(home.join(".ssh")).expect("ssh");
        std::fs::write(home.join(".ssh/id_ed25519"), "PRIVATE KEY").expect("key");
        std::fs::create_dir_all(&state).expect("state");
        std::fs::write(state.join("worker.json"), "PASSWORD").expect("worker file");
        std::fs::create_dir_all(&root).expect("root");
        let policy = confining(&home, &state);
        // SAFETY: set once for this test's own variable name; no other test reads it.
        unsafe { std::env::set_var("X_CHECK_PROVIDER_KEY", "sk-secret") };
        let script = format!(
            "echo built > out.txt && echo wrote-root; \
             echo x > {home}/owned && echo WROTE-HOME; \
             cat {home}/.ssh/id_ed25519 && echo READ-KEY; \
             cat {state}/worker.json && echo READ-STATE; \
             echo \"key=[${{X_CHECK_PROVIDER_KEY:-}}]\"; \
             kill -0 {gateway} && echo SAW-GATEWAY; \
             exit 0",
            home = home.display(),
            state = state.display(),
            gateway = std::process::id(),
        );
        let r = run_at(Some(&policy), &root, &script, Duration::from_secs(30), 4000).await;
        assert!(r.ok, "{r:?}");
        assert!(r.output.contains("wrote-root"), "{}", r.output);
        assert_eq!(
            std::fs::read_to_string(root.join("out.txt")).expect("out"),
            "built\n"
        );
        for leaked in [
            "WROTE-HOME",
            "READ-KEY",
            "PRIVATE KEY",
            "READ-STATE",
            "PASSWORD",
            "sk-secret",
            "SAW-GATEWAY",
        ] {
            assert!(!r.output.contains(leaked), "{leaked} in {}", r.output);
        }
        assert!(r.output.contains("key=[]"), "{}", r.output);
        assert!(r.output.contains("Read-only file system"), "{}", r.output);
        assert!(!home.join("owned").exists());
    }

    #[tokio::test]
    async fn a_confined_check_that_escapes_its_group_still_stops_at_the_timeout() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("work");
        std::fs::create_dir_all(&root).expect("root");
        let policy = confining(dir.path(), &dir.path().join("state"));
        // `setsid` leaves the check's process group: only the pid namespace takes it down. It
        // writes a heartbeat the test watches stop.
        let beat = root.join("beat");
        let cmd = format!(
            "setsid sh -c 'while :; do date +%s%N > {}; sleep 0.1; done' & sleep 300",
            beat.display()
        );
        let r = run_at(Some(&policy), &root, &cmd, Duration::from_millis(1500), 100).await;
        assert!(
            r.error
                .as_deref()
                .is_some_and(|e| e.contains("timeouts.check")),
            "{r:?}"
        );
        let read = || std::fs::read_to_string(&beat).unwrap_or_default();
        let mut last = read();
        let stopped = (0..50).any(|_| {
            std::thread::sleep(Duration::from_millis(300));
            let now = read();
            let same = now == last;
            last = now;
            same
        });
        assert!(
            stopped,
            "the setsid child kept running after the check was stopped"
        );
    }

    #[tokio::test]
    async fn the_server_password_is_not_passed_on() {
        let dir = tempfile::tempdir().expect("tempdir");
        // SAFETY: set once for this test's own variable name; no other test reads it.
        unsafe { std::env::set_var("X_CHECK_TEST_PW", "secret") };
        let r = run(
            Place::Local(None),
            &record(dir.path()),
            "echo \"[${X_CHECK_TEST_PW:-}]\"",
            Duration::from_secs(30),
            100,
            "X_CHECK_TEST_PW",
            || true,
        )
        .await;
        assert_eq!(r.output, "[]\n", "{r:?}");
    }
}
