//! The supervisor's stop path, on a child that ignores SIGTERM: it is SIGKILLed after the grace,
//! what it started is killed with it, and the supervisor exits within its bound the way the child
//! did (killed by SIGKILL).

#![cfg(target_os = "linux")]

use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::time::Instant;

use opencode_mcp::opencode::supervisor::{GRACE, PID_LINE_PREFIX, STOP_BOUND, SUBCOMMAND};

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, r)| !r.starts_with(['Z', 'X'])))
        .unwrap_or(false)
}

#[test]
fn a_child_that_ignores_sigterm_is_killed_within_the_bound() {
    let mut supervisor = Command::new(env!("CARGO_BIN_EXE_opencode-mcp"))
        .arg(SUBCOMMAND)
        .args(["sh", "-c", "trap '' TERM; sleep 30 & echo $!; wait"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the supervisor");
    let mut stderr = BufReader::new(supervisor.stderr.take().expect("stderr"));
    let mut line = String::new();
    stderr.read_line(&mut line).expect("pid line");
    assert!(line.starts_with(PID_LINE_PREFIX), "{line}");
    let mut stdout = BufReader::new(supervisor.stdout.take().expect("stdout"));
    let mut line = String::new();
    stdout.read_line(&mut line).expect("sleep pid");
    let sleep: u32 = line.trim().parse().expect("a pid");
    assert!(alive(sleep));

    let sent = Instant::now();
    // SAFETY: kill(2) on the child this test started.
    unsafe { libc::kill(supervisor.id() as libc::pid_t, libc::SIGTERM) };
    let status = supervisor.wait().expect("wait");
    let took = sent.elapsed();
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
    assert!(took >= GRACE, "SIGKILL came before the grace: {took:?}");
    assert!(took < STOP_BOUND, "took {took:?}, bound {STOP_BOUND:?}");
    assert!(
        !alive(sleep),
        "the child's own child outlived the supervisor"
    );
}

/// The lifeline: the supervisor's stdin is a pipe only the gateway holds. When that end closes
/// (the gateway died, however it died; here the test drops it), the supervisor stops OpenCode
/// and what it started, as on SIGTERM, with no signal from anyone. This is the channel that also
/// works where `PR_SET_PDEATHSIG` does not exist (macOS).
#[test]
fn a_closed_lifeline_stops_everything() {
    let (mut supervisor, lifeline, _stderr, child, sleep) = supervised();
    assert!(alive(child) && alive(sleep));
    // While the lifeline is open the supervisor keeps running.
    assert!(supervisor.try_wait().expect("try_wait").is_none());

    let cut = Instant::now();
    drop(lifeline);
    let status = supervisor.wait().expect("wait");
    let took = cut.elapsed();
    // `sh` dies of the SIGTERM at once; the supervisor exits the same way.
    assert_eq!(status.signal(), Some(libc::SIGTERM), "{status:?}");
    assert!(took < STOP_BOUND, "took {took:?}, bound {STOP_BOUND:?}");
    assert!(
        !alive(child),
        "the supervised command outlived the lifeline"
    );
    assert!(!alive(sleep), "its own child outlived the lifeline");
}

/// A supervisor under a lifeline, running `sh` with a `sleep` of its own; returns the
/// supervisor, its lifeline, its stderr, and the pids of `sh` and the `sleep`.
fn supervised() -> (
    std::process::Child,
    std::process::ChildStdin,
    BufReader<std::process::ChildStderr>,
    u32,
    u32,
) {
    use opencode_mcp::opencode::supervisor::LIFELINE_FLAG;
    let mut supervisor = Command::new(env!("CARGO_BIN_EXE_opencode-mcp"))
        .arg(SUBCOMMAND)
        .arg(LIFELINE_FLAG)
        .args(["sh", "-c", "sleep 30 & echo $!; wait"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the supervisor");
    let lifeline = supervisor.stdin.take().expect("stdin");
    let mut stderr = BufReader::new(supervisor.stderr.take().expect("stderr"));
    let mut line = String::new();
    stderr.read_line(&mut line).expect("pid line");
    let child: u32 = line
        .strip_prefix(PID_LINE_PREFIX)
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("not the pid line: {line}"));
    let mut stdout = BufReader::new(supervisor.stdout.take().expect("stdout"));
    let mut line = String::new();
    stdout.read_line(&mut line).expect("sleep pid");
    let sleep: u32 = line.trim().parse().expect("a pid");
    (supervisor, lifeline, stderr, child, sleep)
}

/// Asks for the grace period on `lifeline` and reads lines from `answers` until the
/// supervisor says it lingers.
fn linger(
    lifeline: &mut impl std::io::Write,
    answers: &mut impl BufRead,
    secs: u64,
    socket: &std::path::Path,
) {
    use opencode_mcp::opencode::supervisor::{LINGERING_LINE, LINGER_REQUEST};
    writeln!(lifeline, "{LINGER_REQUEST} {secs} {}", socket.display()).expect("the request");
    lifeline.flush().expect("sent");
    loop {
        let mut line = String::new();
        assert!(
            answers.read_line(&mut line).expect("an answer") > 0,
            "the supervisor ended without lingering"
        );
        assert!(!line.contains("cannot"), "{line}");
        if line.trim_end() == LINGERING_LINE {
            return;
        }
    }
}

/// Connects to a lingering supervisor's `socket` as the next gateway would; its first line
/// names `child`, the process it supervises. The connection, and a reader of its answers.
fn attach(
    socket: &std::path::Path,
    child: u32,
) -> (
    std::os::unix::net::UnixStream,
    BufReader<std::os::unix::net::UnixStream>,
) {
    use opencode_mcp::opencode::supervisor::ATTACHED_LINE;
    let stream = std::os::unix::net::UnixStream::connect(socket).expect("the socket answers");
    let mut answers = BufReader::new(stream.try_clone().expect("a second handle"));
    let mut line = String::new();
    answers.read_line(&mut line).expect("the attach line");
    assert_eq!(line.trim_end(), format!("{ATTACHED_LINE}{child}"));
    (stream, answers)
}

/// **Lingering.** A gateway that exits cleanly while tasks run asks for a grace period first:
/// the lifeline's end then stops nothing. The next gateway connects to the socket, which is the
/// lifeline from then on: its end (no grace period asked on it) stops everything, as the first
/// lifeline's would have.
#[test]
fn a_lingering_supervisor_is_taken_over_through_its_socket() {
    let dir = tempfile::tempdir().expect("a directory");
    let socket = dir.path().join("s.sock");
    let (mut supervisor, mut lifeline, mut stderr, child, sleep) = supervised();
    linger(&mut lifeline, &mut stderr, 3600, &socket);
    drop(lifeline);

    // Reached through the socket after its first lifeline is gone: it still runs, and so does
    // what it supervises.
    let (stream, answers) = attach(&socket, child);
    assert!(
        alive(child) && alive(sleep),
        "the grace period stopped the work"
    );
    assert!(supervisor.try_wait().expect("try_wait").is_none());

    let cut = Instant::now();
    drop(answers);
    drop(stream);
    let status = supervisor.wait().expect("wait");
    assert_eq!(status.signal(), Some(libc::SIGTERM), "{status:?}");
    assert!(cut.elapsed() < STOP_BOUND, "took {:?}", cut.elapsed());
    assert!(
        !alive(child) && !alive(sleep),
        "the work outlived its last lifeline"
    );
}

/// With no gateway by the end of the grace period, everything stops; not before. A gateway
/// that took the supervisor over through its socket may ask for a grace period again.
#[test]
fn a_grace_period_ends_in_a_stop() {
    let dir = tempfile::tempdir().expect("a directory");
    let socket = dir.path().join("s.sock");
    let (mut supervisor, mut lifeline, mut stderr, child, sleep) = supervised();
    linger(&mut lifeline, &mut stderr, 3600, &socket);
    drop(lifeline);

    let (mut stream, mut answers) = attach(&socket, child);
    const GRACE_SECS: u64 = 2;
    linger(&mut stream, &mut answers, GRACE_SECS, &socket);
    let cut = Instant::now();
    drop(answers);
    drop(stream);
    let status = supervisor.wait().expect("wait");
    let took = cut.elapsed();
    assert_eq!(status.signal(), Some(libc::SIGTERM), "{status:?}");
    assert!(
        took >= std::time::Duration::from_secs(GRACE_SECS),
        "stopped {took:?} into a grace period of {GRACE_SECS} s"
    );
    assert!(
        took < std::time::Duration::from_secs(GRACE_SECS) + STOP_BOUND,
        "took {took:?}"
    );
    assert!(
        !alive(child) && !alive(sleep),
        "the work outlived the grace period"
    );
}

/// A lifeline line it cannot act on is answered, and changes nothing: a linger request with no
/// socket, a deadline without its parts, a socket where none can be made. The supervisor still
/// lingers when asked properly; once no gateway holds it, a session past its deadline is
/// aborted, at the address of its own command line only (this one names none, and the
/// supervisor says the abort failed, and why).
#[test]
fn a_line_it_cannot_act_on_is_answered_and_a_deadline_is_acted_on() {
    use opencode_mcp::opencode::supervisor::{ABORT_REQUEST, LINGER_REQUEST};
    use std::io::Write;
    let dir = tempfile::tempdir().expect("a directory");
    let (mut supervisor, mut lifeline, mut stderr, child, _sleep) = supervised();
    let mut answer = |line: &str| -> String {
        writeln!(lifeline, "{line}").expect("a line");
        lifeline.flush().expect("sent");
        let mut got = String::new();
        stderr.read_line(&mut got).expect("an answer");
        got
    };
    let no_socket = answer(&format!("{LINGER_REQUEST} 5"));
    assert!(
        no_socket.contains("needs seconds and a socket path"),
        "{no_socket}"
    );
    let bad_deadline = answer(&format!("{ABORT_REQUEST} soon ses /w"));
    assert!(bad_deadline.contains("a deadline needs"), "{bad_deadline}");
    let unbindable = dir.path().join("no/such/dir/s.sock");
    let cannot = answer(&format!("{LINGER_REQUEST} 5 {}", unbindable.display()));
    assert!(cannot.contains("cannot listen on"), "{cannot}");
    assert_eq!(supervisor.try_wait().expect("wait"), None, "it still runs");

    let socket = dir.path().join("s.sock");
    writeln!(lifeline, "{ABORT_REQUEST} 0 ses_x /w").expect("a deadline");
    linger(&mut lifeline, &mut stderr, 3600, &socket);
    drop(lifeline);
    let said = loop {
        let mut line = String::new();
        assert!(
            stderr.read_line(&mut line).expect("a line") > 0,
            "the supervisor ended without acting on the deadline"
        );
        if line.contains("reached its deadline") {
            break line;
        }
    };
    assert!(
        said.contains("ses_x") && said.contains("the abort failed") && said.contains("--port"),
        "{said}"
    );
    // A gateway takes it over, then lets go without a grace period: it stops.
    let (stream, answers) = attach(&socket, child);
    drop((stream, answers));
    let status = supervisor.wait().expect("wait");
    assert_eq!(status.signal(), Some(libc::SIGTERM), "{status:?}");
}

/// Without a command, or with one that cannot run, the supervisor says so and exits as a shell
/// would (2; 127 for a command not found, 126 for one that is not executable).
#[test]
fn a_command_that_cannot_run_is_named() {
    let dir = tempfile::tempdir().expect("a directory");
    let plain = dir.path().join("plain");
    std::fs::write(&plain, "not a program").expect("a file");
    let missing = dir.path().join("missing");
    for (args, code, says) in [
        (vec![], 2, "no command given"),
        (vec![missing.display().to_string()], 127, "cannot run"),
        (vec![plain.display().to_string()], 126, "cannot run"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_opencode-mcp"))
            .arg(SUBCOMMAND)
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .expect("run the supervisor");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}
