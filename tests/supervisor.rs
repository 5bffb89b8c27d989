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
